"""Span decisions fitted on dev (calibration/spans.py): a threshold per label with a pooled fallback, a span
probability fitted against exact-match correctness, saved in temperatures.json and used by evaluate and serve."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from mydecide.calibration.run import calibrate
from mydecide.calibration.spans import MIN_LABEL_SPANS, fit_span_decisions, scored_spans
from mydecide.calibration.temperatures import load_temperatures
from mydecide.errors import UserError
from mydecide.evaluation.rows import span_metrics, span_prediction
from mydecide.metrics import span_ece
from mydecide.records import parse_record
from mydecide.serving.response import span_answer
from mydecide.spans import Span, SpanDecisions, merge_spans, words

LABELS = ("PERSON", "EMAIL", "RARE")
NAMES = ["Anna Berg", "Bo Ek", "Cara Lind", "Dan Holm"]


def ticket(i: int) -> tuple[str, tuple[Span, ...]]:
    """A text with one name (two words), one e-mail address and, in every fourth text, a RARE code."""
    name, mail, code = NAMES[i % 4], f"user{i}@example.com", f"X{i}Z"
    text = f"Hello, {name} here, write to {mail} today"
    spans = [Span(text.index(name), text.index(name) + len(name), "PERSON")]
    spans.append(Span(text.index(mail), text.index(mail) + len(mail), "EMAIL"))
    if i % 4 == 0:
        text += f" about {code}"
        spans.append(Span(text.index(code), text.index(code) + len(code), "RARE"))
    return text, tuple(sorted(spans))


def grid_of(text: str, spans: tuple[Span, ...], rng: np.random.Generator) -> list[float]:
    """A head that finds every label but is shy on e-mail addresses: their cells sit around 0.35, never above 0.5;
    names' cells around 0.8 with noise, and a few stray cells."""
    units = words(text)
    grid = np.clip(rng.normal(0.05, 0.03, size=(len(units), len(LABELS))), 0.001, 0.999)
    for span in spans:
        j = LABELS.index(span.label)
        for i, (a, b) in enumerate(units):
            if a < span.end and span.start < b:
                centre = {"PERSON": 0.8, "EMAIL": 0.35, "RARE": 0.7}[span.label]
                grid[i, j] = float(np.clip(rng.normal(centre, 0.05), 0.01, 0.49 if j == 1 else 0.99))
    return grid.flatten().tolist()


def items(n: int, seed: int) -> list:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        text, spans = ticket(i)
        out.append((text, grid_of(text, spans, rng), LABELS, spans))
    return out


def exact_f1(found: list, decisions: SpanDecisions | None) -> float:
    tp = fp = fn = 0
    for text, grid, labels, gold in found:
        got = {(s["label"], s["start"], s["end"]) for s in merge_spans(text, grid, labels, decisions)}
        want = {(s.label, s.start, s.end) for s in gold}
        tp, fp, fn = tp + len(got & want), fp + len(got - want), fn + len(want - got)
    return 2 * tp / (2 * tp + fp + fn)


def test_a_shy_label_gets_its_own_threshold_and_a_rare_one_the_pooled_threshold() -> None:
    dev, test = items(60, 1), items(60, 2)
    decisions, summary = fit_span_decisions(dev)
    thresholds = dict(decisions.thresholds)
    assert thresholds["EMAIL"] < 0.35 and "PERSON" in thresholds  # 60 gold spans each: their own threshold
    assert "RARE" not in thresholds and summary["labels"]["RARE"]["gold_spans"] == 15 < MIN_LABEL_SPANS
    assert summary["labels"]["RARE"]["threshold"] == decisions.default and summary["labels"]["RARE"]["fallback"]
    assert decisions.threshold("NEVER_SEEN") == decisions.default
    assert summary["labels"]["EMAIL"]["exact_f1_at_0.5"] == 0.0 and summary["labels"]["EMAIL"]["exact_f1"] == 1.0
    assert exact_f1(test, None) < 0.75 < 0.95 < exact_f1(test, decisions)  # judged on texts the fit never saw


def test_the_span_probability_is_fitted_against_exact_matches() -> None:
    """Names' words read 0.8 but a quarter of the name spans come out cut (one word missed): the mean word
    probability overstates how often a span is exactly right, and the fitted map brings its ECE down."""
    rng = np.random.default_rng(3)
    dev = []
    for i in range(120):
        text, spans = ticket(i)
        grid = np.array(grid_of(text, spans, rng)).reshape(len(words(text)), len(LABELS))
        if i % 4 == 1:  # the name's second word missed: the span found is "Anna", not "Anna Berg"
            name = next(s for s in spans if s.label == "PERSON")
            last = max(n for n, (a, b) in enumerate(words(text)) if a < name.end and name.start < b)
            grid[last, 0] = 0.1
        dev.append((text, grid.flatten().tolist(), LABELS, spans))
    decisions, summary = fit_span_decisions(dev)
    assert summary["probability"]["note"] is None and decisions.slope != 1.0
    mean_kept = SpanDecisions(decisions.default, decisions.thresholds, exclusive=decisions.exclusive)
    before, _ = span_ece(scored_spans(dev, mean_kept))
    after, band = span_ece(scored_spans(dev, decisions))
    assert summary["span_ece_before"] == pytest.approx(before) and summary["span_ece_after"] == pytest.approx(after)
    assert after < before / 3 and after < 0.1 and band < 0.1  # a monotone map cannot tell a cut name from a whole one


def test_too_few_spans_keep_the_mean_and_the_defaults_change_nothing() -> None:
    dev = items(3, 4)
    decisions, summary = fit_span_decisions(dev)
    assert (decisions.slope, decisions.intercept) == (1.0, 0.0) and summary["probability"]["note"]
    text, grid, labels, _ = dev[0]
    assert merge_spans(text, grid, labels, SpanDecisions()) == merge_spans(text, grid, labels)
    assert SpanDecisions().probability(0.37) == 0.37


def test_calibrate_writes_the_decisions_and_every_reader_uses_them(tmp_path: Path) -> None:
    """calibrate → temperatures.json → load_temperatures → evaluate's predictions and serve's answer."""
    rng = np.random.default_rng(6)
    records, logits = [], {}
    question = {
        "type": "span",
        "instructions": "Where are the names, addresses and codes?",
        "criteria": {"PERSON": "a name", "EMAIL": "an e-mail address", "RARE": "a code"},
    }
    for i in range(60):
        text, spans = ticket(i)
        answer = [{"label": s.label, "start": s.start, "end": s.end} for s in spans]
        (record,) = parse_record({"task": "pii", "state": text, "question": question, "answer": answer})
        records.append(record)
        p = np.clip(np.array(grid_of(text, spans, rng)), 1e-4, 1 - 1e-4)
        logits[text] = np.log(p / (1 - p))

    fit = calibrate(None, records, scorer=lambda batch, orders=None: [logits[s] for s, _ in batch], progress=False)
    assert fit["spans"]["questions"] == 60 and fit["spans"]["thresholds"]["EMAIL"] < 0.5
    path = tmp_path / "temperatures.json"
    path.write_text(json.dumps({"format": "mydecide.temperatures/1", **fit}))
    table = load_temperatures(path)
    assert table.span_decisions is not None and table.span_decisions.threshold("EMAIL") < 0.5

    record = records[0]
    t = table("span", record.question.k)
    p = 1 / (1 + np.exp(-logits[record.state] / t))
    raw = span_prediction(record, p)
    tuned = span_prediction(record, p, table.span_decisions)
    assert "EMAIL" not in {s["label"] for s in raw["spans"]}
    assert {s["label"] for s in tuned["spans"]} >= {"PERSON", "EMAIL"}
    served = span_answer(record.state, record.question, p, table.span_decisions)
    assert served["spans"] == tuned["spans"]
    metrics = span_metrics([{"type": "span", "task": "pii", **tuned}])
    assert metrics is not None and metrics["exact"]["f1"] == 1.0 and metrics["span_ece"] is not None


def look_alikes(n: int, *, overlapping: bool = False) -> list:
    """Texts with a phone number and an e-mail address; the head reads the phone number's words as an e-mail address
    too (0.6) in every other text, though less surely than as a phone number (0.9). ``overlapping``: the gold also
    marks the phone number as an e-mail address in every third text (labels that may share words)."""
    labels = ("PHONE", "EMAIL")
    out = []
    for i in range(n):
        phone, mail = f"555-{1000 + i}", f"u{i}@example.com"
        text = f"Call {phone} or write to {mail} now"
        gold = [Span(text.index(phone), text.index(phone) + len(phone), "PHONE")]
        gold.append(Span(text.index(mail), text.index(mail) + len(mail), "EMAIL"))
        if overlapping and i % 3 == 0:
            gold.append(Span(gold[0].start, gold[0].end, "EMAIL"))
        grid = np.full((len(words(text)), 2), 0.02)
        for n_word, (a, b) in enumerate(words(text)):
            if a < gold[0].end and gold[0].start < b:
                grid[n_word] = (0.9, 0.6 if i % 2 else 0.02)
            if a < gold[1].end and gold[1].start < b:
                grid[n_word] = (0.02, 0.9)
        out.append((text, grid.flatten().tolist(), labels, tuple(sorted(gold))))
    return out


def test_one_label_per_word_is_fitted_where_dev_gold_never_shares_a_word_and_it_helps() -> None:
    dev, test = look_alikes(40), look_alikes(40)
    decisions, summary = fit_span_decisions(dev)
    assert decisions.exclusive and summary["exclusive"]["used"] is True
    assert exact_f1(test, SpanDecisions()) < 0.9 and exact_f1(test, decisions) == 1.0
    text, grid, labels, _ = test[1]
    both = merge_spans(text, grid, labels)
    one = merge_spans(text, grid, labels, SpanDecisions(exclusive=True))
    assert [s["label"] for s in both] == ["EMAIL", "PHONE", "EMAIL"] and [s["label"] for s in one] == ["PHONE", "EMAIL"]
    # the order labels are listed in changes nothing
    flipped = [v for row in np.array(grid).reshape(-1, 2) for v in row[::-1]]
    assert merge_spans(text, flipped, labels[::-1], SpanDecisions(exclusive=True)) == one


def test_labels_stay_independent_where_dev_gold_shares_words_across_labels() -> None:
    decisions, summary = fit_span_decisions(look_alikes(40, overlapping=True))
    assert not decisions.exclusive
    assert summary["exclusive"] == {
        "used": False,
        "why": "14 dev words are in gold spans of two labels: labels read independently",
    }


def test_exclusive_decisions_round_trip_through_temperatures_json(tmp_path: Path) -> None:
    from mydecide.calibration.spans import decisions_to_json

    decisions = SpanDecisions(0.4, (("EMAIL", 0.3),), 1.5, -0.2, exclusive=True)
    path = tmp_path / "temperatures.json"
    path.write_text(json.dumps({"types": {"span": 1.0}, "spans": {"decisions": decisions_to_json(decisions)}}))
    assert load_temperatures(path).span_decisions == decisions
    older = {k: v for k, v in decisions_to_json(decisions).items() if k != "exclusive"}  # written before the key
    path.write_text(json.dumps({"types": {"span": 1.0}, "spans": {"decisions": older}}))
    loaded = load_temperatures(path).span_decisions
    assert loaded is not None and loaded.exclusive is False


@pytest.mark.parametrize(
    ("spans", "message"),
    [
        ({"decisions": {"default_threshold": 1.5}}, "spans.decisions.default_threshold: 1.5 is outside (0, 1)"),
        ({"decisions": {"thresholds": {"EMAIL": "low"}}}, "spans.decisions.thresholds.EMAIL: 'low' is not a number"),
        ({"decisions": {"slope": -1}}, "spans.decisions.slope: -1 is outside (0, inf)"),
        ({"decisions": {"cut": 0.5}}, "spans.decisions: unknown key(s) ['cut']"),
        ({"decisions": {"exclusive": "yes"}}, "spans.decisions.exclusive: 'yes' is not true or false"),
        ({"thresholds": {}}, "spans.decisions: must be an object"),
        ("no", "spans must be an object"),
    ],
)
def test_a_broken_spans_entry_is_one_line_naming_its_key(tmp_path: Path, spans: object, message: str) -> None:
    path = tmp_path / "temperatures.json"
    path.write_text(json.dumps({"types": {"span": 1.0}, "spans": spans}))
    with pytest.raises(UserError) as err:
        load_temperatures(path)
    assert str(err.value).startswith(f"{path}: ") and message in str(err.value) and "\n" not in str(err.value)
