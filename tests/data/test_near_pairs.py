"""prepare's near-duplicate report: near_pairs.jsonl lists every removed pair with its similarity, least similar
first, and the manifest names the shingling and counts removals per similarity band."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from prepare_builders import NOUL, make, write_jsonl

from mydecide.config import DataRecipe
from mydecide.data.prepare import prepare

TICKETS = [
    "my package still has not arrived and the tracking page shows nothing",
    "the invoice for March lists the premium plan twice",
    "set an alarm for 7 am",
    "password reset emails never reach my work address",
]


def test_near_pairs_report_every_removed_pair_least_similar_first(tmp_path: Path) -> None:
    states = [
        *TICKETS,
        TICKETS[0].replace("package", "parcel"),  # one word changed in a 12-word text
        TICKETS[1].upper() + "!",  # case and punctuation: the same shingles
        "set an alarm for 9 pm",  # another slot value: kept
        "Hi, " + TICKETS[3] + ". Thanks, Anna",
    ]  # a greeting and a signature
    source = write_jsonl(tmp_path / "records.jsonl", [make(i, state=s, question=NOUL) for i, s in enumerate(states)])
    # no dev split: a dev share of 5 rows may well be empty, which prepare refuses unless it is asked for
    recipe = DataRecipe.model_validate(
        {"sources": [{"kind": "jsonl", "path": str(source)}], "split": {"dev_fraction": 0}}
    )
    manifest = prepare(recipe, tmp_path / "out")

    pairs = [json.loads(line) for line in (tmp_path / "out" / "near_pairs.jsonl").read_text().splitlines()]
    assert [(p["removed"]["id"], p["kept"]["id"]) for p in pairs] == [("r7", "r3"), ("r4", "r0"), ("r5", "r1")]
    assert [p["similarity"] for p in pairs] == sorted(p["similarity"] for p in pairs)
    assert pairs[-1]["similarity"] == 1.0 and pairs[-1]["band"] == "1.0"
    assert pairs[1]["removed"]["state"] == states[4] and pairs[1]["kept"]["state"] == TICKETS[0]
    assert 0.7 <= pairs[0]["similarity"] <= pairs[1]["similarity"] < 0.9

    step = next(s for s in manifest["steps"] if s["step"] == "near_dedup")
    assert step["shingling"]["unit"] == "char" and step["shingling"]["n"] == 5 and step["threshold"] == 0.7
    assert sum(step["by_similarity"].values()) == step["removed"] == 3 and step["pairs"] == "near_pairs.jsonl"
    written = (tmp_path / "out" / "near_pairs.jsonl").read_bytes()
    assert manifest["outputs"]["near_pairs.jsonl"] == {"rows": 3, "sha256": hashlib.sha256(written).hexdigest()}


def test_word_shingles_remain_a_recipe_choice(tmp_path: Path) -> None:
    states = [*TICKETS, TICKETS[0].replace("package", "parcel")]
    source = write_jsonl(tmp_path / "records.jsonl", [make(i, state=s, question=NOUL) for i, s in enumerate(states)])
    recipe = DataRecipe.model_validate(
        {
            "sources": [{"kind": "jsonl", "path": str(source)}],
            "dedup": {"near": {"shingle": "word", "threshold": 0.8}},
            "split": {"dev_fraction": 0},
        }
    )
    manifest = prepare(recipe, tmp_path / "out")
    step = next(s for s in manifest["steps"] if s["step"] == "near_dedup")
    assert step["shingling"]["unit"] == "word" and step["removed"] == 0  # the short copy is missed by word 5-grams
    assert (tmp_path / "out" / "near_pairs.jsonl").read_text() == ""
