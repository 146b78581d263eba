"""The seed's four converters on synthetic files in the published layouts (tests/fixtures/data_sources/)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from data_sources import banking77, boolq, ocnli, sst5

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "data_sources"
SST_LEVELS = ["very negative", "negative", "neutral", "positive", "very positive"]


# ---------------------------------------------------------------------------------------------- banking77


def test_banking77_choice_hides_the_gold_intent_among_distractors() -> None:
    rows = list(banking77.convert(str(FIXTURES / "banking77" / "train.csv")))
    first = rows[0]
    assert first["id"] == "banking77-train-2" and first["_where"] == "train.csv:2"
    assert first["state"] == "I am still waiting on my card?" and first["answer"] == "card_arrival"
    criteria = first["question"]["criteria"]
    assert len(criteria) == 10 and "card_arrival" in criteria
    assert set(criteria) <= set(banking77.INTENTS)
    assert criteria["card_arrival"] == "Card arrival"
    assert rows[2]["answer"] == "Refund_not_showing_up"
    assert rows[2]["question"]["criteria"]["Refund_not_showing_up"] == "Refund not showing up"
    assert rows[5]["answer"] == "reverted_card_payment?" and rows[5]["_where"] == "train.csv:7"


def test_banking77_bad_rows_are_error_rows_naming_the_column() -> None:
    rows = list(banking77.convert(str(FIXTURES / "banking77" / "train.csv")))
    assert rows[3] == {
        "_where": "train.csv:5",
        "_error": "column 'category': 'make_me_a_sandwich' is not one of the 77 Banking77 intents",
        "raw": {"text": "How do I close my account", "category": "make_me_a_sandwich"},
    }
    assert rows[4]["_where"] == "train.csv:6" and rows[4]["_error"] == "column 'text' is missing or empty"


def test_banking77_gold_position_varies_and_draws_depend_only_on_seed_and_row() -> None:
    path = str(FIXTURES / "banking77" / "train.csv")
    rows = [r for r in banking77.convert(path) if "_error" not in r]
    positions = {list(r["question"]["criteria"]).index(r["answer"]) for r in rows}
    assert len(positions) > 1  # the gold option is not always in the same place
    assert list(banking77.convert(path, limit=1)) == rows[:1]
    other = [r for r in banking77.convert(path, seed=14) if "_error" not in r]
    assert [r["question"]["criteria"] for r in other] != [r["question"]["criteria"] for r in rows]
    assert [r["answer"] for r in other] == [r["answer"] for r in rows]


def test_banking77_options_all_and_distractor_count() -> None:
    path = str(FIXTURES / "banking77" / "train.csv")
    everything = next(banking77.convert(path, all_options=True))
    assert list(everything["question"]["criteria"]) == list(banking77.INTENTS)
    few = next(banking77.convert(path, num_distractors=2))
    assert len(few["question"]["criteria"]) == 3
    with pytest.raises(ValueError, match="'num_distractors'"):
        banking77.convert(path, num_distractors=77)


def test_banking77_reads_hugging_face_exports_with_class_indices() -> None:
    rows = list(banking77.convert(str(FIXTURES / "banking77" / "test.jsonl")))
    assert [r.get("answer") for r in rows] == ["card_delivery_estimate", "change_pin", None]
    assert rows[0]["id"] == "banking77-test-1"
    assert rows[2]["_error"] == "column 'label': class index 77 is outside 0..76"


# ---------------------------------------------------------------------------------------------- boolq


def test_boolq_noul_with_passage_state_and_question_instructions() -> None:
    rows = list(boolq.convert(str(FIXTURES / "boolq" / "dev.jsonl")))
    assert rows[0] == {
        "id": "boolq-dev-1",
        "task": "boolq",
        "lang": "en",
        "state": "The harbour bridge opened in 1932, decades before the opera house on the point was finished in 1973.",
        "question": {"type": "noul", "instructions": "Is the harbour bridge older than the opera house?"},
        "answer": True,
        "meta": {"title": "Harbour bridge"},
        "_where": "dev.jsonl:1",
    }
    assert rows[1]["answer"] is False
    assert rows[2]["_where"] == "dev.jsonl:3"
    assert rows[2]["_error"] == "column 'answer': 'maybe' is not a yes/no answer (true/false or 1/0)"
    assert rows[3]["_where"] == "dev.jsonl:4" and rows[3]["_error"].startswith("invalid JSON")
    assert rows[4]["_error"] == "column 'question' is missing or empty"


def test_boolq_superglue_labels(tmp_path: Path) -> None:
    target = tmp_path / "val.jsonl"
    target.write_text(
        '{"question": "is it", "passage": "It is.", "idx": 0, "label": 1}\n'
        '{"question": "is it not", "passage": "It is.", "idx": 1, "label": 0}\n',
        encoding="utf-8",
    )
    assert [r["answer"] for r in boolq.convert(str(target))] == [True, False]


# ---------------------------------------------------------------------------------------------- sst5


def test_sst5_reads_ptb_trees_root_label_and_leaves() -> None:
    rows = list(sst5.convert(str(FIXTURES / "sst5" / "dev.txt")))
    assert rows[0] == {
        "id": "sst5-dev-1",
        "task": "sst5",
        "lang": "en",
        "state": "The film works .",
        "question": {"type": "score", "instructions": sst5.INSTRUCTIONS, "criteria": SST_LEVELS},
        "answer": 3,
        "_where": "dev.txt:1",
    }
    assert rows[1]["state"] == "A dreadful mess ( really )" and rows[1]["answer"] == 0
    assert [r["_where"] for r in rows] == ["dev.txt:1", "dev.txt:2", "dev.txt:4", "dev.txt:5", "dev.txt:6"]
    assert rows[3]["_error"] == "line is not a labelled PTB tree '(label ...)' with labels 0..4"
    assert rows[3]["raw"] == "this line is not a tree"
    assert rows[4]["answer"] == 4


def test_sst5_reads_setfit_jsonl() -> None:
    rows = list(sst5.convert(str(FIXTURES / "sst5" / "train.jsonl")))
    assert [r.get("answer") for r in rows] == [4, 1, None]
    assert rows[1]["id"] == "sst5-train-2"
    assert rows[2]["_where"] == "train.jsonl:3" and rows[2]["_error"].startswith("column 'label': 7 is not")


def test_sst5_tree_parser() -> None:
    assert sst5.parse_tree("(1 (2 not) (1 good))") == (1, "not good")
    with pytest.raises(ValueError):
        sst5.parse_tree("(9 (2 x))")


# ---------------------------------------------------------------------------------------------- ocnli


def test_ocnli_choice_in_chinese_with_unlabelled_rows_as_errors() -> None:
    rows = list(ocnli.convert(str(FIXTURES / "ocnli" / "dev.json")))
    assert rows[0]["id"] == "ocnli-dev-1" and rows[0]["lang"] == "zh" and rows[0]["task"] == "ocnli"
    assert rows[0]["state"] == {"premise": "他在图书馆读了一整个下午的书。", "hypothesis": "他下午在读书。"}
    assert rows[0]["answer"] == "entailment" and rows[0]["meta"] == {"genre": "news"}
    assert list(rows[0]["question"]["criteria"]) == ["entailment", "neutral", "contradiction"]
    assert rows[2]["_where"] == "dev.json:3"
    assert rows[2]["_error"] == "column 'label' is '-': the annotators reached no majority label"
    assert rows[2]["raw"]["prem_id"] == "tv_3"
    assert [r.get("answer") for r in rows] == ["entailment", "contradiction", None, "contradiction", "neutral"]


def test_ocnli_class_indices_and_unlabelled_minus_one(tmp_path: Path) -> None:
    target = tmp_path / "validation.jsonl"
    rows_in = [{"sentence1": "甲", "sentence2": "乙", "label": n, "idx": i} for i, n in enumerate((0, 1, 2, -1))]
    target.write_text("".join(json.dumps(r) + "\n" for r in rows_in), encoding="utf-8")
    rows = list(ocnli.convert(str(target)))
    assert [r.get("answer") for r in rows] == ["neutral", "entailment", "contradiction", None]
    assert rows[3]["_error"] == "column 'label' is -1: the row is unlabelled"


# ------------------------------------------------------------------- the online path (Hugging Face), faked


class FakeSplit(list):  # type: ignore[type-arg]
    """Stands in for a loaded ``datasets`` split: iterable rows plus ``features[...].names``."""

    def __init__(self, rows: list[dict[str, object]], names: list[str] | None = None) -> None:
        super().__init__(rows)
        self.features = {"label": SimpleNamespace(names=names or [])}


def fake_hub(monkeypatch: pytest.MonkeyPatch, module: object, split: FakeSplit) -> list[tuple[object, ...]]:
    calls: list[tuple[object, ...]] = []

    def load(name: str, which: str, config: str | None = None) -> FakeSplit:
        calls.append((name, which, config))
        return split

    monkeypatch.setattr(module, "load_hub", load)
    return calls


def test_banking77_online_path_uses_the_hub_class_names(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = fake_hub(monkeypatch, banking77, FakeSplit([{"text": "card?", "label": 11}], list(banking77.INTENTS)))
    rows = list(banking77.convert(split="test"))
    assert calls == [("PolyAI/banking77", "test", None)]
    assert rows[0]["answer"] == "card_arrival" and rows[0]["id"] == "banking77-test-0"
    assert rows[0]["_where"] == "PolyAI/banking77/test:0"


def test_boolq_sst5_ocnli_online_paths(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = fake_hub(monkeypatch, boolq, FakeSplit([{"question": "is it", "answer": True, "passage": "It is."}]))
    assert next(boolq.convert(split="validation"))["id"] == "boolq-validation-0"
    assert calls == [("google/boolq", "validation", None)]
    calls = fake_hub(monkeypatch, sst5, FakeSplit([{"text": "fine .", "label": 2, "label_text": "neutral"}]))
    assert next(sst5.convert())["answer"] == 2 and calls == [("SetFit/sst5", "train", None)]
    names = ["neutral", "entailment", "contradiction"]
    calls = fake_hub(
        monkeypatch,
        ocnli,
        FakeSplit(
            [
                {"sentence1": "甲", "sentence2": "乙", "label": 1, "idx": 0},
                {"sentence1": "甲", "sentence2": "乙", "label": -1, "idx": 1},
            ],
            names,
        ),
    )
    rows = list(ocnli.convert(split="validation"))
    assert calls == [("clue/clue", "validation", "ocnli")]
    assert rows[0]["answer"] == "entailment" and rows[1]["_error"] == "column 'label' is -1: the row is unlabelled"
