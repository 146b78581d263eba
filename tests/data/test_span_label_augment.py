"""Span label copies that need the user's word: paraphrased descriptions and labels declared absent from the data."""

from __future__ import annotations

import json
import random

import pytest
from prepare_builders import write_jsonl

from mydecide.config import DataRecipe
from mydecide.data import augment
from mydecide.data.prepare import prepare
from mydecide.recipe_loading import load_recipe
from mydecide.recipe_parsing import RecipeError
from mydecide.record_files import load_records
from mydecide.records import parse_record
from mydecide.spans import MAX_SPAN_LABELS

TEXT = "Call Anna Berg at 555-0101 or mail anna@example.se, or Bo Ek."
QUESTION = {
    "type": "span",
    "instructions": "Which pieces of this text are personal data?",
    "criteria": {"PERSON": "a person's name", "PHONE": "a telephone number", "EMAIL": ""},
}
GOLD = [("PERSON", "Anna Berg"), ("PHONE", "555-0101"), ("EMAIL", "anna@example.se"), ("PERSON", "Bo Ek")]
PARAPHRASES = {
    "PERSON": ["the name of a person", "a full or partial personal name", "a person's name"],
    "EMAIL": ["an address that e-mail is sent to"],
    "ADDRESS": ["a postal address"],  # asked for by no record here: never used
}
ABSENT = {"IBAN": "an international bank account number", "PASSPORT": "a passport number", "VAT": "a VAT number"}


def span_row(i: int = 0, criteria: dict | None = None) -> dict:
    text = f"{TEXT} Ticket {i}."
    answer = [{"label": label, "start": text.index(t), "end": text.index(t) + len(t)} for label, t in GOLD]
    question = {**QUESTION, "criteria": criteria} if criteria is not None else QUESTION
    if criteria is not None:
        answer = [a for a in answer if a["label"] in criteria]
    return {"id": f"s{i}", "task": "pii", "state": text, "question": question, "answer": answer}


def span_record(i: int = 0, criteria: dict | None = None):
    (record,) = parse_record(span_row(i, criteria))
    return record


def reparsed(record):
    """The copy as prepare writes it and train reads it back: it must be a valid record of its own."""
    (back,) = parse_record(record.to_json())
    return back


def test_paraphrased_labels_take_a_listed_description_and_keep_names_and_gold() -> None:
    record = span_record()
    seen = set()
    for seed in range(40):
        copy = augment.paraphrase_span_labels(record, PARAPHRASES, random.Random(seed))
        assert copy is not None and copy.meta["augmented"] == "paraphrase_span_labels"
        described = dict(zip(copy.question.options, copy.question.descriptions, strict=True))
        assert copy.question.options == record.question.options and described["PHONE"] == "a telephone number"
        assert described["PERSON"] in PARAPHRASES["PERSON"][:2]  # never the description it already has
        assert described["EMAIL"] == "an address that e-mail is sent to"
        assert copy.meta["descriptions_from"] == {"PERSON": "a person's name", "EMAIL": ""}
        assert copy.spans == record.spans and copy.target == record.target
        back = reparsed(copy)
        assert back.spans == copy.spans and back.target == copy.target and back.question == copy.question
        seen.add(described["PERSON"])
    assert seen == set(PARAPHRASES["PERSON"][:2])  # both other wordings are drawn


def test_no_paraphrase_copy_without_a_different_listed_description() -> None:
    record = span_record()
    rng = random.Random(0)
    assert augment.paraphrase_span_labels(record, {"ADDRESS": ["a postal address"]}, rng) is None
    assert augment.paraphrase_span_labels(record, {"PERSON": ["a person's name"]}, rng) is None  # the same text
    (choice,) = parse_record(
        {"task": "t", "state": "x", "question": {"type": "choice", "instructions": "?", "criteria": ["a", "b"]},
         "answer": "a"}
    )  # fmt: skip
    assert augment.paraphrase_span_labels(choice, PARAPHRASES, rng) is None
    assert augment.add_absent_span_labels(choice, ABSENT, rng) is None


def test_absent_labels_are_asked_for_with_no_gold_and_the_rest_of_the_grid_kept() -> None:
    record = span_record()
    counts, places = set(), set()
    for seed in range(60):
        copy = augment.add_absent_span_labels(record, ABSENT, random.Random(seed))
        assert copy is not None and copy.meta["augmented"] == "add_absent_span_labels"
        added = copy.meta["absent_labels"]
        assert 1 <= len(added) <= 3 and set(added) <= set(ABSENT)
        assert set(copy.question.options) == set(record.question.options) | set(added)
        own = [o for o in copy.question.options if o not in added]
        assert own == list(record.question.options)  # the record's labels keep their order
        described = dict(zip(copy.question.options, copy.question.descriptions, strict=True))
        assert all(described[label] == ABSENT[label] for label in added)
        assert copy.spans == record.spans
        k, old_k = copy.question.k, record.question.k
        grid = [copy.target[w * k : (w + 1) * k] for w in range(len(copy.target) // k)]
        old = [record.target[w * old_k : (w + 1) * old_k] for w in range(len(record.target) // old_k)]
        column = {label: j for j, label in enumerate(copy.question.options)}
        assert all(row[column[label]] == 0.0 for row in grid for label in added)  # no gold for an absent label
        assert [[row[column[label]] for label in record.question.options] for row in grid] == [list(r) for r in old]
        back = reparsed(copy)
        assert back.target == copy.target and back.spans == copy.spans
        counts.add(len(added))
        places.add(copy.question.options.index(added[0]))
    assert counts == {1, 2, 3} and len(places) > 1  # how many and where vary


def test_absent_labels_respect_the_label_limit_and_skip_a_records_own_label() -> None:
    many = {f"L{j}": f"field number {j}" for j in range(MAX_SPAN_LABELS - 1)}
    full = span_record(criteria=many)
    for seed in range(10):
        copy = augment.add_absent_span_labels(full, ABSENT, random.Random(seed))
        assert copy is not None and copy.question.k == MAX_SPAN_LABELS and len(copy.meta["absent_labels"]) == 1
        assert reparsed(copy).question.k == MAX_SPAN_LABELS
    at_limit = span_record(criteria={**many, "L31": "the last field"})
    assert augment.add_absent_span_labels(at_limit, ABSENT, random.Random(0)) is None
    record = span_record()
    copy = augment.add_absent_span_labels(record, {"email": "an e-mail address", "IBAN": "x"}, random.Random(0))
    assert copy is not None and copy.meta["absent_labels"] == ["IBAN"]  # EMAIL is the record's own, in any case
    assert augment.add_absent_span_labels(record, {"Phone": "a phone"}, random.Random(0)) is None
    assert augment.absent_label_clash(record, {"IBAN": "x", "email": "y"}) == ("email", "EMAIL")
    assert augment.absent_label_clash(record, ABSENT) is None


def test_the_copies_are_chosen_by_the_seed_and_made_the_same_on_a_rerun() -> None:
    records = [span_record(i) for i in range(300)]
    settings = augment.AugmentSettings(
        paraphrase_span_labels=0.3,
        span_label_paraphrases=PARAPHRASES,
        add_absent_span_labels=0.5,
        absent_span_labels=ABSENT,
    )
    out, added = augment.augment(records, settings)
    again, _ = augment.augment(records, settings)
    assert [r.to_json() for r in out] == [r.to_json() for r in again]
    assert 60 <= added["paraphrase_span_labels"] <= 120 and 110 <= added["add_absent_span_labels"] <= 190
    assert len(out) == 300 + sum(added.values())
    other, _ = augment.augment(records, augment.AugmentSettings(**{**settings.__dict__, "seed": 14}))
    assert [r.id for r in other] != [r.id for r in out]
    unlisted, none = augment.augment(records, augment.AugmentSettings(paraphrase_span_labels=1.0))
    assert none["paraphrase_span_labels"] == 0 and len(unlisted) == 300  # no list, no copy


def prepared(tmp_path, augment_keys: dict, rows: list | None = None) -> dict:
    source = write_jsonl(tmp_path / "rows.jsonl", rows or [span_row(i) for i in range(60)])
    recipe = DataRecipe.model_validate(
        {
            "sources": [{"kind": "jsonl", "path": str(source)}],
            "out": str(tmp_path / "out"),
            "split": {"dev_fraction": 0.2, "test_fraction": 0.2},
            "augment": augment_keys,
            "dedup": {"near": {"enabled": False}},
        }
    )
    return prepare(recipe)


def test_prepare_makes_the_copies_in_train_only_and_counts_them(tmp_path) -> None:
    keys = {"schema_resampling": 0.5, "span_label_paraphrases": PARAPHRASES, "absent_span_labels": ABSENT}
    manifest = prepared(tmp_path, keys)
    step = next(s for s in manifest["steps"] if s["step"] == "augment")
    for kind in ("paraphrase_span_labels", "add_absent_span_labels"):
        assert step["added"][kind] > 0 and step["share"][kind] == round(step["added"][kind] / step["in"], 4)
    assert manifest["conservation"]["augmented_copies"] == sum(step["added"].values()) == step["out"] - step["in"]
    out = tmp_path / "out"
    train = load_records(out / "train.jsonl")
    assert {"paraphrase_span_labels", "add_absent_span_labels"} <= {r.meta.get("augmented") for r in train}
    for split in ("dev", "test"):
        rows = load_records(out / f"{split}.jsonl")
        assert rows and not any("augmented" in r.meta for r in rows)
        assert all(r.question.options == ("PERSON", "PHONE", "EMAIL") for r in rows)


def test_prepare_refuses_a_declared_absent_label_that_a_record_asks_for(tmp_path) -> None:
    keys = {"add_absent_span_labels": 0.5, "absent_span_labels": {"IBAN": "a bank account", "Email": "mail"}}
    with pytest.raises(RecipeError) as err:
        prepared(tmp_path, keys)
    message = str(err.value)
    assert "\n" not in message and message.startswith("augment.absent_span_labels: 'Email' (as 'EMAIL')")
    assert "'s0'" in message and "rows.jsonl:1" in message
    assert not (tmp_path / "out" / "train.jsonl").exists()


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("augment.paraphrase_span_labels=0.3", "augment: paraphrase_span_labels > 0 needs span_label_paraphrases"),
        ("augment.span_label_paraphrases={PERSON: []}", 'augment.span_label_paraphrases: label "PERSON" needs'),
        ("augment.span_label_paraphrases={PERSON: ['  ']}", 'augment.span_label_paraphrases: label "PERSON" needs'),
        ("augment.absent_span_labels={IBAN: ''}", 'augment.absent_span_labels: label "IBAN" needs a description'),
        ("augment.absent_span_labels={' ': x}", "augment.absent_span_labels: a label name must not be blank"),
        ("augment.absent_span_labels={IBAN: a, iban: b}", 'augment.absent_span_labels: labels ["IBAN", "iban"] differ'),
        ("augment.add_absent_span_labels=0.5", "augment: add_absent_span_labels > 0 needs absent_span_labels"),
    ],
)
def test_a_bad_key_is_a_one_line_error_naming_it(tmp_path, override: str, key: str) -> None:
    recipe = tmp_path / "data.yaml"
    recipe.write_text(json.dumps({"sources": [{"kind": "jsonl", "path": "rows.jsonl"}]}))
    with pytest.raises(RecipeError) as err:
        load_recipe(recipe, [override], model=DataRecipe)
    message = str(err.value)
    assert "\n" not in message and f"command-line override {override}: {key}" in message
