"""Augmentation: copies keep answers consistent, never drop the gold, never touch score levels."""

from __future__ import annotations

import random

from prepare_builders import CHOICE, NOUL, SCORE, make

from mydecide.data import augment
from mydecide.records import parse_record


def choice_record(i: int = 1, answer: str = "engineering", **kw):
    return parse_record(make(i, question=CHOICE, answer=answer, **kw))[0]


def test_anonymized_copy_renames_ids_and_keeps_the_answer() -> None:
    original = choice_record(answer="support")
    copy = augment.anonymize_options(original)
    assert copy is not None
    assert copy.question.options == ("option_1", "option_2", "option_3", "option_4")
    assert copy.question.descriptions == original.question.descriptions
    assert copy.to_json()["answer"] == "option_3"  # support was the third option
    assert copy.question.descriptions[copy.gold_index] == "How-to questions"
    assert copy.meta["renamed"]["support"] == "option_3" and copy.meta["source_id"] == original.id
    assert copy.id != original.id and copy.state == original.state


def test_anonymizing_options_without_descriptions_keeps_their_names_as_descriptions() -> None:
    bare = parse_record(
        make(1, question={"type": "choice", "instructions": "Pick", "criteria": ["red", "blue"]}, answer="blue")
    )[0]
    copy = augment.anonymize_options(bare)
    assert copy is not None and copy.question.descriptions == ("red", "blue") and copy.to_json()["answer"] == "option_2"


def test_soft_targets_follow_their_options() -> None:
    soft = parse_record({**make(1, question=CHOICE), "answer": None, "target": {"billing": 0.5, "engineering": 0.5}})[0]
    for seed in range(30):
        copy = augment.drop_distractors(soft, random.Random(seed))
        assert copy is not None
        assert {"billing", "engineering"} <= set(copy.question.options) and len(copy.question.options) >= 2
        assert dict(zip(copy.question.options, copy.target, strict=True))["billing"] == 0.5
        assert abs(sum(copy.target) - 1.0) < 1e-12
    anonymous = augment.anonymize_options(soft)
    assert anonymous is not None and anonymous.to_json()["target"] == {
        "option_1": 0.5,
        "option_2": 0.5,
        "option_3": 0.0,
        "option_4": 0.0,
    }


def test_drop_distractors_never_drops_the_gold() -> None:
    for seed in range(50):
        record = choice_record(seed, answer=list(CHOICE["criteria"])[seed % 4])
        copy = augment.drop_distractors(record, random.Random(seed))
        assert copy is not None and 2 <= copy.question.k <= 3
        assert copy.to_json()["answer"] == record.to_json()["answer"]
        assert set(copy.meta["dropped"]).isdisjoint(copy.question.options)
        assert record.to_json()["answer"] not in copy.meta["dropped"]


def test_types_that_are_left_alone() -> None:
    score = parse_record(make(1, question=SCORE))[0]
    noul = parse_record(make(1, question=NOUL))[0]
    two = parse_record(make(1, question={**CHOICE, "criteria": {"a": "", "b": ""}}, answer="a"))[0]
    settings = augment.AugmentSettings(anonymize_options=1.0, drop_distractors=1.0)
    assert augment.copies(score, settings) == [] and augment.copies(noul, settings) == []
    assert [c.meta["augmented"] for c in augment.copies(two, settings)] == ["anonymize_options"]


def test_paraphrase_and_selection_are_stable() -> None:
    rs = [choice_record(i) for i in range(400)]
    settings = augment.AugmentSettings(
        anonymize_options=0.25,
        paraphrase_instructions=0.5,
        paraphrases={CHOICE["instructions"]: ["Who owns this ticket?"]},
    )
    out, added = augment.augment(rs, settings)
    again, _ = augment.augment(rs, settings)
    assert [r.id for r in out] == [r.id for r in again]
    assert 60 <= added["anonymize_options"] <= 140 and 150 <= added["paraphrase_instructions"] <= 250
    assert len(out) == 400 + sum(added.values())
    para = [r for r in out if r.meta.get("augmented") == "paraphrase_instructions"]
    assert all(
        r.question.instructions == "Who owns this ticket?" and r.to_json()["answer"] == "engineering" for r in para
    )


def test_reworded_instructions_keep_the_question_and_its_answer_for_every_type() -> None:
    settings = augment.AugmentSettings(reword_instructions=1.0)
    for record in (choice_record(), parse_record(make(1, question=SCORE))[0], parse_record(make(1, question=NOUL))[0]):
        [copy] = augment.copies(record, settings)
        assert copy.meta["augmented"] == "reword_instructions" and copy.meta["source_id"] == record.id
        assert record.question.instructions in copy.question.instructions != record.question.instructions
        assert copy.question.options == record.question.options and copy.target == record.target
        assert copy.meta["template"] in augment.REWORDINGS


def test_schema_resampling_turns_on_its_three_copies_and_the_manifest_gives_their_shares(tmp_path) -> None:
    step = resampled([make(i, question=CHOICE, answer="engineering") for i in range(40)], tmp_path)
    for kind in ("anonymize_options", "drop_distractors", "reword_instructions"):
        assert step["added"][kind] > 0 and step["share"][kind] == round(step["added"][kind] / step["in"], 4)
    assert step["added"]["negate_noul"] == 0 and step["share"]["rename_options"] == 0.0


SPAN_TEXT = "Call Anna Berg at 555-0101 or mail anna@example.se, or Bo Ek."
SPAN_QUESTION = {
    "type": "span",
    "instructions": "Which pieces of this text are personal data?",
    "criteria": {"PERSON": "a person's name", "PHONE": "a telephone number", "EMAIL": ""},
}


def span_record():
    spans = [("PERSON", "Anna Berg"), ("PHONE", "555-0101"), ("EMAIL", "anna@example.se"), ("PERSON", "Bo Ek")]
    answer = [{"label": label, "start": SPAN_TEXT.index(t), "end": SPAN_TEXT.index(t) + len(t)} for label, t in spans]
    (record,) = parse_record(
        {"id": "s1", "task": "pii", "state": SPAN_TEXT, "question": SPAN_QUESTION, "answer": answer}
    )
    return record


def reparsed(record):
    """The record as prepare writes it and train reads it back: a copy must be a valid record of its own."""
    (back,) = parse_record(record.to_json())
    return back


def test_span_label_copies_keep_each_gold_span_with_its_label_and_a_matching_grid() -> None:
    record = span_record()
    for seed in range(20):
        dropped = augment.drop_span_labels(record, random.Random(seed))
        assert dropped is not None and 1 <= dropped.question.k < record.question.k
        assert set(dropped.meta["dropped"]) | set(dropped.question.options) == set(record.question.options)
        assert dropped.spans == tuple(s for s in record.spans if s.label in dropped.question.options)
        back = reparsed(dropped)
        assert back.target == dropped.target and back.spans == dropped.spans

        renamed = augment.rename_span_labels(record, random.Random(seed))
        assert renamed is not None and all(code.startswith("field-") for code in renamed.question.options)
        names = renamed.meta["renamed"]
        assert {(names[s.label], s.start, s.end) for s in record.spans} == {
            (s.label, s.start, s.end) for s in renamed.spans
        }
        assert renamed.target == record.target  # the same cells, under new names
        assert renamed.question.descriptions == ("a person's name", "a telephone number", "EMAIL")  # a name kept
        assert reparsed(renamed).spans == renamed.spans
    single = parse_record(
        {"task": "pii", "state": SPAN_TEXT, "question": {**SPAN_QUESTION, "criteria": {"PHONE": ""}}, "answer": []}
    )[0]
    assert augment.drop_span_labels(single, random.Random(0)) is None  # one label: nothing to drop
    (choice,) = parse_record(make(0, question=CHOICE, answer="engineering"))
    assert augment.drop_span_labels(choice, random.Random(0)) is None


def test_schema_resampling_resamples_span_labels_too(tmp_path) -> None:
    from mydecide.record_files import load_records

    record = span_record()
    rows = [{**record.to_json(), "id": f"s{i}", "state": f"{SPAN_TEXT} Ticket {i}."} for i in range(40)]
    step = resampled(rows, tmp_path)
    assert step["added"]["drop_span_labels"] > 0 and step["added"]["rename_span_labels"] > 0
    train = load_records(tmp_path / "out" / "train.jsonl")
    assert any(r.meta.get("augmented") == "rename_span_labels" for r in train)


def resampled(rows: list, tmp_path) -> dict:
    """prepare ``rows`` with ``augment.schema_resampling: 0.5`` (no dev or test split); its manifest's augment step."""
    import json

    from prepare_builders import write_jsonl

    from mydecide.config import DataRecipe
    from mydecide.data.prepare import prepare

    source = write_jsonl(tmp_path / "rows.jsonl", rows)
    recipe = DataRecipe.model_validate(
        {
            "sources": [{"kind": "jsonl", "path": str(source)}],
            "out": str(tmp_path / "out"),
            "split": {"dev_fraction": 0.0, "test_fraction": 0.0},
            "augment": {"schema_resampling": 0.5},
            "dedup": {"near": {"enabled": False}},
        }
    )
    prepare(recipe)
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    return next(s for s in manifest["steps"] if s["step"] == "augment")
