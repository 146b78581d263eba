"""The span sources: CoNLL-style BIO files (conll), JSON Lines with offsets (span_jsonl), generated PII (pii)."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import json
import random
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from data_sources import conll, pii, span_jsonl
from data_sources._spans import span_problem, word_aligned
from mydecide.cli import app
from mydecide.config import DataRecipe
from mydecide.records import parse_record
from mydecide.spans import spans_of_grid

SPANS = Path(__file__).resolve().parents[1] / "fixtures" / "data_sources" / "spans"
CONLL, IOB1, JSONL = SPANS / "ner.conll", SPANS / "ner_iob1.conll", SPANS / "spans.jsonl"
GENERATOR = Path(__file__).resolve().parents[2] / "scripts" / "make_pii_sample.py"  # writes pii.SAMPLE


def records(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in rows if "_error" not in r]


def errors(rows: list[dict[str, Any]]) -> dict[str, str]:
    return {r["_where"]: r["_error"] for r in rows if "_error" in r}


def assert_exact_offsets(record: dict[str, Any]) -> None:
    for span in record["answer"]:
        assert record["state"][span["start"] : span["end"]] == span["text"]
    assert span_problem([(s["start"], s["end"], s["label"]) for s in record["answer"]], record["state"]) is None


# ------------------------------------------------------------------------------------------------------- conll


def test_conll_sentences_become_span_records_with_exact_offsets_on_multibyte_tokens() -> None:
    rows = list(conll.convert(str(CONLL)))
    first = records(rows)[0]
    assert first == {
        "id": "ner-3",
        "task": "ner",
        "lang": "en",
        "state": "Zoë Łukasiewicz visited São Paulo .",
        "question": {"type": "span", "instructions": conll.DEFAULT_INSTRUCTIONS, "criteria": ["LOC", "PER"]},
        "answer": [
            {"label": "PER", "start": 0, "end": 15, "text": "Zoë Łukasiewicz"},
            {"label": "LOC", "start": 24, "end": 33, "text": "São Paulo"},
        ],
        "meta": {"tokens": 6},
        "_where": "ner.conll:3",
    }
    assert [r["_where"] for r in records(rows)] == ["ner.conll:3", "ner.conll:10", "ner.conll:20"]
    assert records(rows)[1]["answer"] == []  # a sentence of O tags: nothing to find
    for record in records(rows):
        assert_exact_offsets(record)
        assert all(word_aligned(record["state"], s["start"], s["end"]) for s in record["answer"])
        assert re.findall(r"\S+", record["state"]) == record["state"].split(" ")  # one word per token


def test_conll_bad_tags_and_lines_are_error_rows_naming_the_line() -> None:
    assert errors(list(conll.convert(str(CONLL)))) == {
        "ner.conll:15": "tag 'I-PER' after 'O': an I-PER must follow B-PER or I-PER",
        "ner.conll:26": "line has one column; expected a token and a tag (the tag in the last column)",
    }


def test_conll_documents_join_sentences_and_a_bad_sentence_rejects_its_document(tmp_path: Path) -> None:
    rows = list(conll.convert(str(CONLL), unit="document"))
    assert errors(rows) == {
        "ner.conll:15": "tag 'I-PER' after 'O': an I-PER must follow B-PER or I-PER",
        "ner.conll:26": "line has one column; expected a token and a tag (the tag in the last column)",
    }
    good = tmp_path / "good.conll"
    good.write_text(CONLL.read_text(encoding="utf-8").replace("O'Brien NNP I-PER", "O'Brien NNP B-PER"))
    good.write_text(good.read_text(encoding="utf-8").replace("dangling\n", "dangling O\n"))
    documents = list(conll.convert(str(good), unit="document"))
    assert len(documents) == 2 and not errors(documents)
    assert documents[0]["state"] == "Zoë Łukasiewicz visited São Paulo .\nNothing here .\nCall O'Brien today"
    assert [s["text"] for s in documents[0]["answer"]] == ["Zoë Łukasiewicz", "São Paulo", "O'Brien"]
    assert documents[1]["answer"][-1] == {"label": "LOC", "start": 17, "end": 25, "text": "Göteborg"}
    for record in documents:
        assert_exact_offsets(record)


def test_conll_iob1_starts_spans_with_i_and_splits_with_b() -> None:
    (record,) = list(conll.convert(str(IOB1), scheme="iob1"))
    assert record["state"] == "Anna Berg B-PER and Émile in Lyon"  # tab-separated columns; a token "B-PER"
    assert [(s["label"], s["text"]) for s in record["answer"]] == [
        ("PER", "Anna Berg"),
        ("PER", "B-PER"),
        ("PER", "Émile"),
        ("LOC", "Lyon"),
    ]
    with pytest.raises(ValueError, match="no span labels"):  # read as BIO, no sentence is readable
        list(conll.convert(str(IOB1)))


@pytest.mark.parametrize(
    ("tags", "scheme", "spans"),
    [
        (["B-PER", "I-PER", "O", "B-LOC"], "bio", [(0, 2, "PER"), (3, 4, "LOC")]),
        (["B-PER", "B-PER", "I-PER"], "bio", [(0, 1, "PER"), (1, 3, "PER")]),
        (["PER", "PER", "O", "LOC", "PER"], "bio", [(0, 2, "PER"), (3, 4, "LOC"), (4, 5, "PER")]),  # IO tags
        (["I-PER", "I-PER", "B-PER", "I-LOC"], "iob1", [(0, 2, "PER"), (2, 3, "PER"), (3, 4, "LOC")]),
        (["S-PER", "B-LOC", "I-LOC", "E-LOC", "U-X"], "bioes", [(0, 1, "PER"), (1, 4, "LOC"), (4, 5, "X")]),
        (["O", "O"], "bio", []),
    ],
)
def test_decode_tags(tags: list[str], scheme: str, spans: list[tuple[int, int, str]]) -> None:
    assert conll.decode_tags(tags, scheme) == spans


@pytest.mark.parametrize(
    ("tags", "scheme", "index", "rule"),
    [
        (["O", "I-PER"], "bio", 1, "must follow B-PER"),
        (["B-LOC", "I-PER"], "bio", 1, "must follow B-PER"),
        (["B-"], "bio", 0, "no label"),
        (["B-PER", "E-PER"], "bio", 1, "prefix E- is not one of scheme bio"),
        (["X-PER"], "iob1", 0, "prefix X-"),
        (["S-PER", "E-PER"], "bioes", 1, "must follow B-PER"),
    ],
)
def test_decode_tags_errors_name_the_token_and_rule(tags: list[str], scheme: str, index: int, rule: str) -> None:
    with pytest.raises(conll.TagError, match=rule) as caught:
        conll.decode_tags(tags, scheme)
    assert caught.value.index == index


def test_bio_tags_written_from_random_spans_decode_back_to_them() -> None:
    rng = random.Random(13)
    for _ in range(300):
        n = rng.randint(1, 12)
        tags, spans, i = ["O"] * n, [], 0
        while i < n:
            if rng.random() < 0.4:
                length, label = rng.randint(1, 3), rng.choice(["PER", "LOC"])
                end = min(n, i + length)
                tags[i:end] = [f"B-{label}"] + [f"I-{label}"] * (end - i - 1)
                spans.append((i, end, label))
                i = end
            else:
                i += 1
        assert conll.decode_tags(tags, "bio") == spans


def test_conll_criteria_other_labels_and_options(tmp_path: Path) -> None:
    rows = list(conll.convert(str(CONLL), criteria={"PER": "a person"}))
    assert errors(rows)["ner.conll:3"].startswith("label 'LOC' is not in criteria ['PER']")
    dropped = records(list(conll.convert(str(CONLL), criteria={"PER": "a person"}, other_labels="drop")))
    assert dropped[0]["question"]["criteria"] == {"PER": "a person"}
    assert [s["label"] for r in dropped for s in r["answer"]] == ["PER", "PER", "PER"]
    named = records(list(conll.convert(str(CONLL), task="ner_demo", lang="sv", instructions="Who or where?")))
    assert {(r["task"], r["lang"], r["question"]["instructions"]) for r in named} == {
        ("ner_demo", "sv", "Who or where?")
    }
    for bad, match in [
        ({"scheme": "bilou"}, "option 'scheme'"),
        ({"unit": "paragraph"}, "option 'unit'"),
        ({"criteria": []}, "1 to 32 labels"),
        ({"criteria": [f"L{i}" for i in range(33)]}, "1 to 32 labels"),
        ({"criteria": ["PER", "PER"]}, "repeats"),
        ({"other_labels": "keep"}, "option 'other_labels'"),
        ({"instructions": " "}, "option 'instructions'"),
    ]:
        with pytest.raises(ValueError, match=match):
            list(conll.convert(str(CONLL), **bad))
    with pytest.raises(ValueError, match="needs a path"):
        list(conll.convert())


# -------------------------------------------------------------------------------------------------- span_jsonl


def test_span_jsonl_reads_objects_triples_and_doccano_labels_with_code_point_offsets() -> None:
    rows = list(span_jsonl.convert(str(JSONL)))
    good = {r["_where"]: r for r in records(rows)}
    assert good["spans.jsonl:1"]["id"] == "t1" and good["spans.jsonl:1"]["meta"] == {"source_id": "t1"}
    assert good["spans.jsonl:2"]["answer"] == [] and good["spans.jsonl:2"]["id"] == "spans-2"
    assert good["spans.jsonl:3"]["state"].startswith("😀")  # one code point before "Émile", 4 bytes in UTF-8
    assert [s["text"] for s in good["spans.jsonl:3"]["answer"]] == ["Émile", "555-0100"]
    assert good["spans.jsonl:4"]["answer"] == [{"label": "PERSON", "start": 4, "end": 9, "text": "Bo Ek"}]
    assert [s["label"] for s in good["spans.jsonl:10"]["answer"]] == ["ADDRESS", "PERSON"]  # labels may overlap
    assert good["spans.jsonl:1"]["question"]["criteria"] == ["ADDRESS", "EMAIL", "PERSON", "PHONE", "URL"]
    for record in good.values():
        assert_exact_offsets(record)


def test_span_jsonl_bad_lines_are_error_rows_naming_line_and_rule() -> None:
    assert errors(list(span_jsonl.convert(str(JSONL)))) == {
        "spans.jsonl:5": "span [4, 12) PERSON: offsets must satisfy 0 <= start < end <= 10 (text length)",
        "spans.jsonl:6": "spans [0, 8) and [4, 16) of label PERSON overlap (one label's spans may not)",
        "spans.jsonl:7": "spans[0].text 'Anna' differs from the text at [0, 3): 'Ann'",
        "spans.jsonl:8": "line is a JSON list, not an object",
        "spans.jsonl:9": "key 'text' is missing or not a non-empty string",
    }
    rows = list(span_jsonl.convert(str(JSONL), criteria=["PERSON", "EMAIL", "PHONE", "ADDRESS"]))
    assert errors(rows)["spans.jsonl:11"] == (
        "label 'URL' is not in criteria ['ADDRESS', 'EMAIL', 'PERSON', 'PHONE'] (option other_labels: drop skips it)"
    )


@pytest.mark.parametrize(
    ("spans", "rule"),
    [
        ([{"start": 0, "end": 0, "label": "A"}], "0 <= start < end"),
        ([{"start": -1, "end": 2, "label": "A"}], "0 <= start < end"),
        ([{"start": 0, "end": 2}], "label must be a non-empty string"),
        ([{"start": "0", "end": 2, "label": "A"}], "start must be an integer"),
        ([{"start": True, "end": 2, "label": "A"}], "start must be an integer"),
        ([[0, 2]], "or a triple"),
        ([[0, 2, "A"], [1, 3, "A"]], "overlap"),
        ({"start": 0}, "must be a list of spans, got a JSON dict"),
        (None, "key 'spans' must be a list of spans, got null"),
    ],
)
def test_span_jsonl_span_rules(tmp_path: Path, spans: Any, rule: str) -> None:
    path = tmp_path / "one.jsonl"
    path.write_text(json.dumps({"text": "Anna Berg", "spans": spans}) + "\n", encoding="utf-8")
    (row,) = list(span_jsonl.convert(str(path), criteria=["A"]))
    assert row["_where"] == "one.jsonl:1" and rule in row["_error"]


def test_span_jsonl_utf8_byte_offsets_become_code_point_offsets(tmp_path: Path) -> None:
    text = "😀 Émile Ödegård"
    start = len("😀 ".encode())
    path = tmp_path / "bytes.jsonl"
    lines = [
        {"text": text, "spans": [[start, len(text.encode()), "PERSON"]]},
        {"text": text, "spans": [[start + 1, len(text.encode()), "PERSON"]]},  # inside the two bytes of "É"
    ]
    path.write_text("".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines), encoding="utf-8")
    rows = list(span_jsonl.convert(str(path), offsets="utf8", criteria=["PERSON"]))
    assert rows[0]["answer"] == [{"label": "PERSON", "start": 2, "end": 15, "text": "Émile Ödegård"}]
    assert rows[1]["_error"] == "spans[0].start 6 falls inside a multi-byte character (offsets: utf8)"


# --------------------------------------------------------------------------------------------------------- pii


def test_pii_sample_counts_labels_locales_and_exact_offsets() -> None:
    rows = list(pii.convert())
    assert len(rows) == 800 and not errors(rows)
    spans = [(r["state"], s) for r in rows for s in r["answer"]]
    assert Counter(s["label"] for _, s in spans) == {"PERSON": 1468, "EMAIL": 390, "PHONE": 375, "ADDRESS": 281}
    assert sum(1 for r in rows if not r["answer"]) == 157  # texts with nothing to find
    assert len({r["meta"]["locale"] for r in rows}) == 7 and len({r["meta"]["kind"] for r in rows}) == 6
    assert sum(1 for _, s in spans if s["label"] == "PERSON" and not s["text"].isascii()) == 186
    assert len({r["state"] for r in rows}) == 800
    unaligned = [(t, s) for t, s in spans if not word_aligned(t, s["start"], s["end"])]
    assert len(unaligned) == 1280  # the number pii.py's docstring and docs/span-data.md quote
    for text, span in unaligned:  # only punctuation next to the span breaks the alignment, never a cut word
        before, after = text[: span["start"]], text[span["end"] :]
        assert not before or before[-1].isspace() or not before[-1].isalnum()
        assert not after or after[0].isspace() or not after[0].isalnum()
    for record in rows:
        assert_exact_offsets(record)
        assert record["question"]["criteria"] == pii.CRITERIA and record["task"] == "pii_spans"
        for span in record["answer"]:
            assert span["text"] == span["text"].strip() and span["text"][-1] not in ",:;?!>)"


def test_a_perfect_word_grid_scores_the_ceilings_docs_quote() -> None:
    """docs/span-data.md: the gold grid turned back into spans (edge punctuation trimmed) has exact-match F1 0.989
    and overlap F1 0.996; every miss is a pair of same-label spans on neighbouring words merged into one."""
    gold_count = predicted_count = exact = overlap = 0
    for row in pii.convert():
        (record,) = parse_record({k: v for k, v in row.items() if k != "_where"})
        gold = [(s.start, s.end, s.label) for s in record.spans]
        grid_spans = spans_of_grid(record.state, record.target, record.question.options)
        predicted = [(s.start, s.end, s.label) for s in grid_spans]
        gold_count, predicted_count = gold_count + len(gold), predicted_count + len(predicted)
        exact += len(set(gold) & set(predicted))
        free = list(gold)
        for start, end, label in predicted:
            hit = next((g for g in free if g[2] == label and g[0] < end and start < g[1]), None)
            if hit is not None:
                free.remove(hit)
                overlap += 1
    assert (gold_count, predicted_count) == (2514, 2496)
    assert exact == 2514 - 2 * 18 and round(2 * exact / (gold_count + predicted_count), 3) == 0.989
    assert round(2 * overlap / (gold_count + predicted_count), 3) == 0.996
    page = (Path(__file__).resolve().parents[2] / "docs" / "span-data.md").read_text(encoding="utf-8")
    assert "exact-match F1 0.989** and **overlap F1 0.996**" in page


def test_pii_bad_lines_are_error_rows_and_pass_through_join(tmp_path: Path) -> None:
    path = tmp_path / "pii.jsonl"
    lines = [
        {"id": "a", "text": "Call Bo Ek.", "spans": [{"start": 5, "end": 10, "label": "PERSON", "text": "Bo Ek"}]},
        {"id": "b", "text": "Call Bo Ek.", "spans": [{"start": 5, "end": 10, "label": "NAME"}]},
        {"id": "c", "text": "Call Bo Ek.", "spans": [{"start": 5, "end": 9, "label": "PERSON", "text": "Bo Ek"}]},
        {"text": "no id", "spans": []},
        {"id": "d", "text": "Mail bo@ek.se", "spans": [[5, 13, "EMAIL"]]},
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    rows = list(pii.convert(str(path)))
    assert errors(rows) == {
        "pii.jsonl:2": "label 'NAME' is not one of ['PERSON', 'EMAIL', 'PHONE', 'ADDRESS']",
        "pii.jsonl:3": "spans[0].text 'Bo Ek' differs from the text at [5, 9): 'Bo E'",
        "pii.jsonl:4": "keys 'text' and 'id' must be non-empty strings",
    }
    joined = list(pii.convert(str(path), join=2))
    assert errors(joined) == errors(rows)
    (document,) = records(joined)
    assert document["state"] == "Call Bo Ek.\n\nMail bo@ek.se" and document["id"] == "a+1"
    assert [(s["start"], s["text"]) for s in document["answer"]] == [(5, "Bo Ek"), (18, "bo@ek.se")]


def test_pii_labels_option_keeps_a_subset() -> None:
    rows = list(pii.convert(labels=["EMAIL", "PERSON"], limit=50))
    assert rows[0]["question"]["criteria"] == {"PERSON": pii.CRITERIA["PERSON"], "EMAIL": pii.CRITERIA["EMAIL"]}
    assert {s["label"] for r in rows for s in r["answer"]} == {"PERSON", "EMAIL"}
    with pytest.raises(ValueError, match="option 'labels'"):
        list(pii.convert(labels=["SSN"]))


def test_pii_join_makes_long_documents_with_shifted_spans() -> None:
    texts = list(pii.convert())
    documents = list(pii.convert(join=40))
    assert len(documents) == 20 and all(7000 <= len(d["state"]) <= 8836 for d in documents)
    assert documents[0]["state"] == "\n\n".join(t["state"] for t in texts[:40])
    assert documents[1]["id"] == "pii-0040+39" and documents[1]["meta"]["texts"] == 40
    assert {d["task"] for d in documents} == {"pii_spans_long"}
    assert [s["text"] for d in documents for s in d["answer"]] == [s["text"] for t in texts for s in t["answer"]]
    for document in documents:
        assert_exact_offsets(document)
    assert [len(d["state"]) for d in pii.convert(join=300)][-1] == len("\n\n".join(t["state"] for t in texts[600:]))
    with pytest.raises(ValueError, match="option 'join'"):
        list(pii.convert(join=0))


def test_generator_rebuilds_the_shipped_sample_byte_for_byte(tmp_path: Path) -> None:
    import faker  # pinned in requirements.lock (the generator's own version check is tested below)

    out = tmp_path / "pii.jsonl"
    result = subprocess.run(
        [sys.executable, str(GENERATOR), "--out", str(out)], capture_output=True, text=True, check=False
    )
    if faker.VERSION != "40.63.0":
        assert result.returncode != 0 and "40.63.0" in result.stderr
        return
    assert result.returncode == 0, result.stderr
    assert out.read_bytes() == pii.SAMPLE.read_bytes()


# ------------------------------------------------------------------------------------------- records and prepare


def test_every_span_record_passes_the_record_validator() -> None:
    rows = [*pii.convert(), *conll.convert(str(CONLL)), *span_jsonl.convert(str(JSONL))]
    for row in records(rows):
        (parsed,) = parse_record({k: v for k, v in row.items() if k != "_where"})
        assert sorted((s.start, s.end, s.label) for s in parsed.spans) == sorted(
            (s["start"], s["end"], s["label"]) for s in row["answer"]
        )


def test_prepare_reads_the_three_span_sources(tmp_path: Path) -> None:
    recipe = tmp_path / "spans.yaml"
    sources = [
        {"kind": "pii", "options": {"labels": ["PERSON", "EMAIL", "PHONE"]}},
        {"kind": "conll", "path": str(CONLL), "options": {"criteria": {"PER": "a person", "LOC": "a place"}}},
        {"kind": "span_jsonl", "path": str(JSONL), "options": {"task": "pii_mixed", "other_labels": "drop"}},
    ]
    recipe.write_text(yaml.safe_dump({"sources": sources, "split": {"dev_fraction": 0.1, "test_fraction": 0.1}}))
    out = tmp_path / "prepared"
    result = CliRunner().invoke(app, ["prepare", str(recipe), "--out", str(out), "--no-progress"])
    assert result.exit_code == 0, result.output
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["conservation"]["input"] == 816 and manifest["conservation"]["rejected"] == 7
    assert manifest["conservation"]["removed"] == 0  # no generated text is a duplicate or near-duplicate
    rejects = [json.loads(line) for line in (out / "rejects.jsonl").read_text().splitlines()]
    assert sorted(r["where"] for r in rejects) == sorted(
        ["ner.conll:15", "ner.conll:26", *(f"spans.jsonl:{n}" for n in (5, 6, 7, 8, 9))]
    )
    tasks = Counter(
        json.loads(line)["task"]
        for name in ("train.jsonl", "dev.jsonl", "test.jsonl")
        for line in (out / name).read_text().splitlines()
    )
    assert tasks == {"pii_spans": 800, "ner": 3, "pii_mixed": 6}


# ------------------------------------------------------------------------------------------------------- docs


def test_span_data_page_recipes_load_and_quote_the_samples_numbers() -> None:
    page = (Path(__file__).resolve().parents[2] / "docs" / "span-data.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```yaml\n(.*?)```", page, re.S)
    assert len(blocks) == 4
    for block in blocks:
        recipe = DataRecipe.model_validate(yaml.safe_load(block))
        for source in recipe.sources:
            module = importlib.import_module(f"data_sources.{source.kind}")
            assert set(source.options) <= set(inspect.signature(module.convert).parameters)
    rows = list(pii.convert())
    spans = [(r["state"], s) for r in rows for s in r["answer"]]
    unaligned = sum(1 for t, s in spans if not word_aligned(t, s["start"], s["end"]))
    assert f"{unaligned}\nof the {len(spans)} gold spans" in page or f"{unaligned} of the {len(spans)}" in page
    labels = Counter(s["label"] for _, s in spans)
    assert ", ".join(f"{label} {n}" for label, n in labels.most_common()) in page
