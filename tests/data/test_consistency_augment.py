"""Consistency augmentation: negated noul pairs with complementary targets, renamed options, train only."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
from prepare_builders import CHOICE, NOUL, make, sentence, write_jsonl

from mydecide.config import AugmentConfig, DataRecipe
from mydecide.data import augment
from mydecide.data.prepare import prepare
from mydecide.recipe_parsing import RecipeError
from mydecide.records import parse_record

NOUL_TEXTS = {**NOUL, "criteria": {"true": "Customers cannot pay", "false": "Everything works"}}


def test_negated_copy_has_swapped_criteria_and_the_complementary_target() -> None:
    hard = parse_record(make(1, question=NOUL_TEXTS, answer=True))[0]
    soft = parse_record({**make(2, question=NOUL), "answer": None, "target": 0.7})[0]
    for original in (hard, soft):
        copy = augment.negate_noul(original, augment.NEGATION_TEMPLATES, random.Random(0))
        assert copy is not None
        assert copy.target[0] + original.target[0] == pytest.approx(1.0)  # P(yes) + P(yes | negated) = 1
        assert copy.target == (original.target[1], original.target[0]) and copy.soft == original.soft
        assert copy.question.instructions in {
            t.format(instructions=original.question.instructions) for t in augment.NEGATION_TEMPLATES
        }
        assert copy.question.descriptions == original.question.descriptions[::-1]
        assert copy.state == original.state and copy.meta["source_id"] == original.id
        assert copy.meta["negation_of"] == original.question.instructions
        parse_record(copy.to_json())  # a valid record
    assert copy.to_json()["target"] == pytest.approx(0.3)
    assert (
        augment.negate_noul(parse_record(make(3, question=CHOICE))[0], augment.NEGATION_TEMPLATES, random.Random(0))
        is None
    )


def test_training_negations_differ_from_the_ones_evaluate_probes_with() -> None:
    from jevbench.relations.mea import NEGATIONS  # evaluate --coherence's complement law (negation_wrapper)

    assert not set(NEGATIONS) & set(augment.NEGATION_TEMPLATES)  # coherence is measured on unseen phrasings


def test_renamed_copy_uses_neutral_codes_and_keeps_the_answer() -> None:
    original = parse_record(make(1, question=CHOICE, answer="support"))[0]
    copy = augment.rename_options(original, random.Random(3))
    assert copy is not None and len(set(copy.question.options)) == 4
    assert all(o.startswith("opt-") and not o.startswith("option_") for o in copy.question.options)
    assert copy.question.descriptions == original.question.descriptions
    assert copy.to_json()["answer"] == copy.meta["renamed"]["support"]
    assert copy.question.descriptions[copy.gold_index] == "How-to questions"
    assert augment.rename_options(parse_record(make(2, question=NOUL))[0], random.Random(0)) is None


def test_copies_are_deterministic_and_follow_their_fractions() -> None:
    rows = [parse_record(make(i, question=NOUL if i % 2 else CHOICE))[0] for i in range(40)]
    settings = augment.AugmentSettings(negate_noul=1.0, rename_options=0.5, seed=7)
    out, added = augment.augment(rows, settings)
    assert added["negate_noul"] == 20 and 0 < added["rename_options"] < 20
    assert augment.augment(rows, settings)[0] == out
    for i, r in enumerate(out):  # each negated copy right after its original
        if r.meta.get("augmented") == "negate_noul":
            assert out[i - 1].id == r.meta["source_id"]


def test_recipe_keys_and_template_checks() -> None:
    cfg = AugmentConfig.model_validate({"negate_noul": 0.5, "negation_templates": ["Not so? {instructions}"]})
    assert cfg.negate_noul == 0.5 and cfg.rename_options == 0.0
    with pytest.raises(ValueError, match=r"consistency was removed .*; set negate_noul and rename_options"):
        AugmentConfig.model_validate({"consistency": 0.5})
    with pytest.raises(ValueError, match="must contain"):
        AugmentConfig.model_validate({"negation_templates": ["no field here"]})
    with pytest.raises(ValueError, match="must contain"):
        AugmentConfig.model_validate({"negation_templates": ["{instructions} {other}"]})


def read(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_prepare_adds_consistency_copies_to_train_only(tmp_path: Path) -> None:
    rows = [
        make(
            i,
            state=sentence(i, 50),
            question=NOUL if i % 2 else CHOICE,
            answer=bool(i % 4 == 1) if i % 2 else "billing",
        )
        for i in range(60)
    ]
    rows += [make(100 + i, state=sentence(100 + i, 50), question=NOUL, task="held") for i in range(8)]
    source = write_jsonl(tmp_path / "records.jsonl", rows)
    recipe = DataRecipe.model_validate(
        {
            "sources": [{"kind": "jsonl", "path": str(source)}],
            "split": {"heldout_tasks": ["held"], "dev_fraction": 0.2, "test_fraction": 0.2, "seed": 13},
            "augment": {"negate_noul": 1.0, "rename_options": 1.0},
        }
    )
    manifest = prepare(recipe, tmp_path / "out")
    out = tmp_path / "out"
    train = read(out / "train.jsonl")
    by_id = {r["id"]: r for r in train}
    negated = [r for r in train if r.get("meta", {}).get("augmented") == "negate_noul"]
    renamed = [r for r in train if r.get("meta", {}).get("augmented") == "rename_options"]
    originals = [r for r in train if "augmented" not in r.get("meta", {})]
    assert len(negated) == sum(r["question"]["type"] == "noul" for r in originals) > 0
    assert len(renamed) == sum(r["question"]["type"] == "choice" for r in originals) > 0
    for copy in negated:  # complementary targets: the negated answer is the opposite one
        source = by_id[copy["meta"]["source_id"]]
        assert copy["answer"] is (not source["answer"]) and copy["state"] == source["state"]
    added = next(step for step in manifest["steps"] if step["step"] == "augment")["added"]
    assert added["negate_noul"] == len(negated) and added["rename_options"] == len(renamed)
    for name in ("dev.jsonl", "test.jsonl", "heldout_tasks.jsonl"):
        part = read(out / name)
        assert part, name
        for row in part:  # never touched: no copies, no negated questions, no renamed options
            assert "augmented" not in row.get("meta", {})
            assert row["question"] in (NOUL, CHOICE)
    with pytest.raises((ValueError, RecipeError)):
        DataRecipe.model_validate(
            {"sources": [{"kind": "jsonl", "path": str(source)}], "augment": {"negate_noul": 1.5}}
        )
