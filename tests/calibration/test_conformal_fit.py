"""calibrate's conformal section on records with a known truth: fitted, written, checked on load, reported by evaluate,
and answered by build_response (a served answer's ``set`` and ``act``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from mydecide.calibration.conformal_fit import gold_span_best
from mydecide.calibration.run import calibrate
from mydecide.calibration.temperatures import load_temperatures
from mydecide.errors import UserError
from mydecide.evaluation.report import render_markdown
from mydecide.evaluation.run import run_evaluation
from mydecide.records import parse_record
from mydecide.spans import words

LEVELS = ["awful", "bad", "fine", "good", "great"]


def _record(i: int, kind: str, rng: np.random.Generator, task: str | None = None) -> tuple[Any, np.ndarray]:
    """A record whose gold is drawn from softmax(z) of its own logits z: a calibrated model at T = 1."""
    state = f"{kind} {i}"
    if kind == "set":
        z = rng.normal(0.0, 3.0, size=2)
        gold = [label for label, d in zip(("bug", "refund"), z, strict=True) if rng.random() < 1 / (1 + np.exp(-d))]
        question = {"type": "set", "instructions": "Which?", "criteria": {"bug": "A defect", "refund": "Money"}}
        answer: Any = gold
    else:
        k = {"choice": 4, "noul": 2, "score": 5}[kind]
        z = rng.normal(0.0, 3.0 if kind != "score" else 1.5, size=k)
        gold_index = int(np.argmax(z + rng.gumbel(size=k)))
        if kind == "choice":
            question, answer = {"type": "choice", "instructions": "Pick", "criteria": list("abcd")}, "abcd"[gold_index]
        elif kind == "noul":
            question, answer = {"type": "noul", "instructions": "Yes?"}, gold_index == 0
        else:
            question, answer = {"type": "score", "instructions": "How good?", "criteria": LEVELS}, gold_index
    record = parse_record({"task": task or kind, "state": state, "question": question, "answer": answer})[0]
    return record, z


def _records(n: int, seed: int, tasks: tuple[str, ...] = ("choice", "noul", "score", "set")) -> tuple[list, dict]:
    rng = np.random.default_rng(seed)
    records, logits = [], {}
    for kind in tasks:
        for i in range(n):
            record, z = _record(i + seed * 100000, kind, rng)
            records.append(record)
            logits[(record.state, record.question.type)] = z
    return records, logits


def _scorer(logits: dict):
    def score(items, orders=None):
        return [logits[(state, q.type)] for state, q in items]

    return score


@pytest.fixture(scope="module")
def fitted(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    dev, logits = _records(400, 1)
    fit = calibrate(
        None, dev, scorer=_scorer(logits), progress=False, level_maps=False, alpha=0.1, max_risk=0.05, delta=0.1
    )
    path = tmp_path_factory.mktemp("cal") / "temperatures.json"
    path.write_text(json.dumps({"format": "mydecide.temperatures/1", **fit}), encoding="utf-8")
    return path, fit


def test_calibrate_writes_sets_and_auto_act_per_type_and_task(fitted: tuple[Path, dict]) -> None:
    _, fit = fitted
    section = fit["conformal"]
    assert section["alpha"] == 0.1 and section["max_risk"] == 0.05 and section["delta"] == 0.1
    assert section["dev_tasks"] == ["choice", "noul", "score", "set"]
    assert {t: s["score"] for t, s in section["sets"].items()}["noul"] == "lac"
    assert section["sets"]["choice"]["score"] in ("lac", "aps")
    assert section["sets"]["score"]["score"] in ("ordinal_aps", "ordinal_hull")
    assert section["sets"]["set"]["n"] == 800  # one row per label
    assert section["sets"]["choice"]["level"] == pytest.approx(361 / 400)  # ⌈401 · 0.9⌉ / 400
    assert set(section["task_sets"]) == {"choice", "noul", "score", "set"}
    noul = section["auto_act"]["noul"]
    assert noul["threshold"] is not None and noul["answered"] > 0.5 and noul["p_value"] <= 0.1


def test_evaluate_reports_coverage_and_realized_risk(fitted: tuple[Path, dict]) -> None:
    path, _ = fitted
    test, logits = _records(600, 2)
    held, held_logits = _records(50, 3, tasks=("noul",))
    held = [parse_record({**r.to_json(), "task": "unseen"})[0] for r in held]
    report = run_evaluation(
        None, test + held, path, scorer=_scorer(logits | held_logits), permutations=0, progress=False
    ).report
    g = report["guarantees"]
    for qtype in ("choice", "noul", "score", "set"):
        s = g["types"][qtype]["sets"]
        assert s["coverage"] >= 0.88, qtype
        assert s["ci95"][0] <= s["coverage"] <= s["ci95"][1]
        assert sum(s["size_distribution"].values()) == s["n"]
    assert g["types"]["noul"]["sets"]["n"] == 600  # the held-out task is not in the type's numbers
    act = g["types"]["noul"]["auto_act"]
    assert act["risk"] <= 0.05 + 0.02 and act["answered"] > 0.5
    assert act["payoff"]["threshold"] == 0.625
    assert g["tasks"]["unseen"]["outside_guarantee"] and not g["tasks"]["noul"]["outside_guarantee"]
    assert g["tasks"]["noul"]["rule"] == "task" and g["tasks"]["unseen"]["rule"] == "type"
    markdown = render_markdown(report)
    assert "## Guarantees" in markdown and "unseen (held out: outside the guarantee)" in markdown


def test_a_type_too_small_for_alpha_is_refused_in_one_line() -> None:
    dev, logits = _records(18, 4, tasks=("choice",))
    with pytest.raises(UserError) as err:
        calibrate(None, dev, scorer=_scorer(logits), progress=False, alpha=0.05)
    assert str(err.value) == (
        "dev holds 18 choice questions, too few for --alpha 0.05: a conformal set needs ⌈(n + 1)(1 − α)⌉ ≤ n, "
        "at least 19 (use a larger α or more dev data)"
    )


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda c: c["sets"]["choice"].update(alpha=1.5), "conformal.sets.choice.alpha: 1.5 is outside (0, 1)"),
        (
            lambda c: c["sets"]["score"].update(score="lac"),
            "conformal.sets.score.score: 'lac' is not a score for score",
        ),
        (lambda c: c["sets"]["noul"].update(n=0), "conformal.sets.noul.n: 0 is not a count of dev rows"),
        (lambda c: c["auto_act"]["noul"].update(threshold=None, max_risk=0), "conformal.auto_act.noul.max_risk: 0"),
        (lambda c: c.update(colour="red"), "conformal: unknown key(s) ['colour']"),
    ],
)
def test_a_malformed_section_is_refused_naming_file_and_key(
    fitted: tuple[Path, dict], tmp_path: Path, change: Any, message: str
) -> None:
    path, _ = fitted
    document = json.loads(path.read_text(encoding="utf-8"))
    change(document["conformal"])
    bad = tmp_path / "temperatures.json"
    bad.write_text(json.dumps(document), encoding="utf-8")
    with pytest.raises(
        UserError, match=f"^{bad}: " + message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")
    ):
        load_temperatures(bad)


def test_gold_span_best_reads_each_gold_span_words() -> None:
    text = "Mail anna@x.se or call 070 123 today"
    record = parse_record(
        {
            "task": "pii",
            "state": text,
            "question": {"type": "span", "instructions": "PII?", "criteria": {"EMAIL": "e-mail", "PHONE": "phone"}},
            "answer": [{"label": "EMAIL", "start": 5, "end": 14}, {"label": "PHONE", "start": 23, "end": 30}],
        }
    )[0]
    n = len(words(text))
    grid = np.zeros(n * 2)  # word-major: word i, label j at i * 2 + j (labels in name order: EMAIL, PHONE)
    grid[1 * 2 + 0] = 0.7  # "anna@x.se" as EMAIL
    grid[4 * 2 + 1], grid[5 * 2 + 1] = 0.2, 0.6  # "070" and "123" as PHONE
    best = gold_span_best(record, grid)
    assert {k: v.tolist() for k, v in best.items()} == {"EMAIL": [0.7], "PHONE": [0.6]}


def test_a_task_of_several_types_gets_only_its_types_rules() -> None:
    from mydecide.calibration.conformal_fit import fit_conformal
    from mydecide.calibration.temperatures import TemperatureTable

    records, logits = _records(60, 5, tasks=("choice", "noul"))
    records = [parse_record({**r.to_json(), "task": "both"})[0] for r in records]
    section = fit_conformal(
        records,
        [logits[(r.state, r.question.type)] for r in records],
        TemperatureTable({}),
        alpha=0.1,
        max_risk=0.05,
        delta=0.1,
        min_rows=30,
    )
    assert set(section["sets"]) == {"choice", "noul"} and section["sets"]["noul"]["n"] == 60
    assert section["task_sets"] == {} and section["task_auto_act"] == {}
