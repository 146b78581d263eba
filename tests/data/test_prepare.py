"""The prepare pipeline end to end on a small fixture: every row is accounted for, and each step does its job."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
from prepare_builders import CHOICE, NOUL, make, sentence, write_jsonl

from mydecide.config import DataRecipe
from mydecide.data.prepare import prepare
from mydecide.recipe_parsing import RecipeError
from mydecide.records import parse_record


def read(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


@pytest.fixture
def fixture(tmp_path: Path) -> dict[str, Any]:
    """A JSONL source with planted duplicates, eval overlaps, bad lines and a held-out task; and an eval file."""
    rows: list[Any] = [make(i, state=sentence(i, 60)) for i in range(30)]  # lines 1-30: distinct tickets
    rows.append(make(100, state="  " + rows[1]["state"].upper()))  # line 31: exact duplicate of r1
    near = rows[2]["state"].split()
    near[30] = "edited"
    rows.append(make(101, state=" ".join(near)))  # line 32: near duplicate of r2
    rows.append('{"id": "broken", "task": ')  # line 33: not JSON
    rows.append(make(102, answer="marketing"))  # line 34: answer not among the options
    rows.append(
        {
            "id": "wire",
            "task": "tickets",
            "state": sentence(103, 60),  # line 35: two questions
            "questions": {"team": CHOICE, "down": NOUL},
            "expected": {"team": "billing", "down": False},
        }
    )
    eval_states = [sentence(200 + i, 40) for i in range(3)]
    rows.append(make(104, state=eval_states[0]))  # line 36: exact eval overlap
    words = eval_states[1].split()
    words[20] = "edited"
    rows.append(make(105, state=" ".join(words)))  # line 37: near eval overlap
    rows.append(make(106, state=sentence(300, 20) + " " + " ".join(eval_states[2].split()[:13])))  # 38: 13-gram
    rows.extend(make(400 + i, question=NOUL, task="outage") for i in range(12))  # lines 39-50: held-out task
    source = write_jsonl(tmp_path / "records.jsonl", rows)
    evals = write_jsonl(tmp_path / "eval.jsonl", [{"id": f"ev{i}", "state": s} for i, s in enumerate(eval_states)])
    recipe = DataRecipe.model_validate(
        {
            "sources": [{"kind": "jsonl", "path": str(source)}],
            "decontaminate_against": [str(evals)],
            "dedup": {"near": {"threshold": 0.7}},
            "split": {"heldout_tasks": ["outage"], "dev_fraction": 0.25, "test_fraction": 0.15, "seed": 13},
            "augment": {"anonymize_options": 1.0, "drop_distractors": 1.0},
        }
    )
    return {"recipe": recipe, "source": source, "rows": rows, "out": tmp_path / "out"}


def test_every_row_is_accounted_for(fixture: dict[str, Any]) -> None:
    manifest = prepare(fixture["recipe"], fixture["out"])
    c = manifest["conservation"]
    assert c["rows_read"] == 50 and c["exploded_extra"] == 1 and c["input"] == 51
    assert c["rejected"] == 2 and c["removed"] == 5  # 1 exact + 1 near + 3 eval overlaps
    assert c["input"] == c["kept"] + c["rejected"] + c["removed"]
    out = fixture["out"]
    kept = (
        read(out / "train.jsonl")
        + read(out / "dev.jsonl")
        + read(out / "test.jsonl")
        + read(out / "heldout_tasks.jsonl")
    )
    assert len([r for r in kept if "augmented" not in r.get("meta", {})]) == c["kept"] == 44
    assert len(read(out / "rejects.jsonl")) == c["rejected"] + c["removed"]
    steps = {s["step"]: s for s in manifest["steps"]}
    assert [s["step"] for s in manifest["steps"]] == [
        "validate",
        "exact_dedup",
        "duplicate_ids",
        "near_dedup",
        "decontaminate",
        "cap_per_task",
        "split",
        "augment",
    ]
    for name in ("exact_dedup", "duplicate_ids", "near_dedup", "decontaminate", "cap_per_task"):
        assert steps[name]["in"] == steps[name]["out"] + steps[name]["removed"]
        assert sum(v["in"] for v in steps[name]["by_type"].values()) == steps[name]["in"]
    assert steps["near_dedup"]["by_source"] == {"jsonl": {"in": 48, "out": 47}}
    assert steps["validate"]["by_source"] == {"jsonl": {"in": 50, "rejected": 2, "out": 49}}


def test_rejects_name_the_line_the_reason_and_the_match(fixture: dict[str, Any]) -> None:
    prepare(fixture["recipe"], fixture["out"])
    rejects = {(r["step"], r["where"]): r for r in read(fixture["out"] / "rejects.jsonl")}
    assert set(rejects) == {
        ("validate", "records.jsonl:33"),
        ("validate", "records.jsonl:34"),
        ("exact_dedup", "records.jsonl:31"),
        ("near_dedup", "records.jsonl:32"),
        ("decontaminate", "records.jsonl:36"),
        ("decontaminate", "records.jsonl:37"),
        ("decontaminate", "records.jsonl:38"),
    }
    assert rejects["validate", "records.jsonl:33"]["reason"].startswith("invalid JSON")
    assert "'marketing' is not one of the options" in rejects["validate", "records.jsonl:34"]["reason"]
    assert rejects["exact_dedup", "records.jsonl:31"]["matched"] == {
        "id": "r1",
        "source": "jsonl",
        "where": "records.jsonl:2",
    }
    assert rejects["near_dedup", "records.jsonl:32"]["matched"]["id"] == "r2"
    matched = {
        r["where"]: (r["matched"]["method"], r["matched"]["eval_id"])
        for r in rejects.values()
        if r["step"] == "decontaminate"
    }
    assert matched == {
        "records.jsonl:36": ("exact", "ev0"),
        "records.jsonl:37": ("near", "ev1"),
        "records.jsonl:38": ("ngram", "ev2"),
    }
    assert all(
        r["matched"]["eval_file"].endswith("eval.jsonl") for r in rejects.values() if r["step"] == "decontaminate"
    )


def test_splits_augmentation_and_outputs(fixture: dict[str, Any]) -> None:
    manifest = prepare(fixture["recipe"], fixture["out"])
    out = fixture["out"]
    originals = {r["id"]: r for r in fixture["rows"] if isinstance(r, dict)}
    heldout, dev, test = read(out / "heldout_tasks.jsonl"), read(out / "dev.jsonl"), read(out / "test.jsonl")
    assert {r["task"] for r in heldout} == {"outage"} and len(heldout) == 12
    assert dev and test and not {r["task"] for r in dev + test} & {"outage"}
    for row in dev + test + heldout:  # untouched: the question is the one given, no augmentation meta
        assert "augmented" not in row.get("meta", {})
        if row["id"] in originals:
            assert row["question"] == originals[row["id"]]["question"]
    train = read(out / "train.jsonl")
    copies = [r for r in train if "augmented" in r.get("meta", {})]
    assert copies and manifest["conservation"]["augmented_copies"] == len(copies)
    train_ids = {r["id"] for r in train}
    for copy in copies:
        assert copy["meta"]["source_id"] in train_ids
        source = next(r for r in train if r["id"] == copy["meta"]["source_id"])
        answer = source["answer"]
        if copy["meta"]["augmented"] == "anonymize_options":
            assert copy["answer"] == copy["meta"]["renamed"][answer]
        else:
            assert copy["answer"] == answer and answer not in copy["meta"]["dropped"]
    for row in train + dev + test + heldout:
        parse_record(row)  # every output row is a valid record
    for name, info in manifest["outputs"].items():
        assert hashlib.sha256((out / name).read_bytes()).hexdigest() == info["sha256"]
    assert json.loads((out / "manifest.json").read_text())["outputs"] == manifest["outputs"]
    assert manifest["splits"]["heldout"]["type"] == {"noul": 12}
    assert manifest["recipe"]["split"]["test_fraction"] == 0.15 and manifest["provenance"]["versions"]


def test_no_test_split_by_default_and_caps(fixture: dict[str, Any]) -> None:
    earlier = fixture["recipe"].model_copy(
        update={"split": fixture["recipe"].split.model_copy(update={"test_fraction": 0.2})}
    )
    prepare(earlier, fixture["out"])  # an earlier run with a test split leaves a test.jsonl that is prepare's own
    assert (fixture["out"] / "test.jsonl").exists()
    recipe = fixture["recipe"].model_copy(
        update={
            "split": fixture["recipe"].split.model_copy(update={"test_fraction": 0.0}),
            "cap_per_task": {"outage": 5},
        }
    )
    manifest = prepare(recipe, fixture["out"])
    assert not (fixture["out"] / "test.jsonl").exists() and "test.jsonl" not in manifest["outputs"]
    assert len(read(fixture["out"] / "heldout_tasks.jsonl")) == 5
    assert manifest["conservation"]["removed"] == 5 + 7


@pytest.mark.parametrize("caps", [{"outage": 5}, {"tickets": 30, "outage": 3}, 31])
def test_under_a_cap_the_manifest_agrees_with_the_rows_written(fixture: dict[str, Any], caps: Any) -> None:
    """Issue 64 saw a cap_per_task manifest that disagreed with the rows kept. Per task: the cap step's counts, the
    rows it removed (rejects.jsonl), the split's counts and every split file's rows are one account."""
    recipe = fixture["recipe"].model_copy(update={"cap_per_task": caps, "augment": type(fixture["recipe"].augment)()})
    out = fixture["out"]
    manifest = prepare(recipe, out)
    step = {s["step"]: s for s in manifest["steps"]}
    cap, split = step["cap_per_task"], step["split"]
    cap_of = caps if isinstance(caps, dict) else {task: caps for task in cap["by_task"]}
    for task, count in cap["by_task"].items():
        assert count["out"] == min(count["in"], cap_of.get(task, count["in"]))
        assert cap["removed_by_task"].get(task, 0) == count["in"] - count["out"]
    capped = [r["task"] for r in read(out / "rejects.jsonl") if r["step"] == "cap_per_task"]
    assert {t: capped.count(t) for t in set(capped)} == cap["removed_by_task"]
    files = {"train": "train.jsonl", "dev": "dev.jsonl", "test": "test.jsonl", "heldout": "heldout_tasks.jsonl"}
    written: dict[str, dict[str, int]] = {}
    for name, file in files.items():
        tasks = [row["task"] for row in read(out / file)]
        written[name] = {t: tasks.count(t) for t in sorted(set(tasks))}
        assert manifest["splits"][name]["task"] == written[name] and manifest["splits"][name]["rows"] == len(tasks)
        assert manifest["outputs"][file]["rows"] == len(tasks)
    assert {name: {t: n for t, n in part.items() if n} for name, part in split["by_task"].items()} == written
    assert sum(sum(part.values()) for part in written.values()) == manifest["conservation"]["kept"]
    assert {t: sum(part.get(t, 0) for part in written.values()) for t in cap["by_task"]} == {
        t: c["out"] for t, c in cap["by_task"].items()
    }


def test_source_problems_are_recipe_errors_naming_the_source(tmp_path: Path) -> None:
    def run(source: dict[str, Any]) -> None:
        prepare(DataRecipe.model_validate({"sources": [source]}), tmp_path / "out")

    with pytest.raises(
        RecipeError, match=r"sources\[0\] \(kind nope\): unknown source kind 'nope'; known kinds: .*jsonl"
    ):
        run({"kind": "nope"})
    with pytest.raises(RecipeError, match=r"sources\[0\] \(kind jsonl\).*colour"):
        run({"kind": "jsonl", "path": str(write_jsonl(tmp_path / "a.jsonl", [make(1)])), "options": {"colour": 1}})
    with pytest.raises(RecipeError, match=r"missing\.jsonl"):
        run({"kind": "jsonl", "path": str(tmp_path / "missing.jsonl")})
    with pytest.raises(RecipeError, match=r"heldout_tasks.*\['nothing'\]"):
        prepare(
            DataRecipe.model_validate(
                {
                    "sources": [{"kind": "jsonl", "path": str(tmp_path / "a.jsonl")}],
                    "split": {"heldout_tasks": ["nothing"]},
                }
            ),
            tmp_path / "out",
        )


def test_a_rerun_writes_the_same_bytes(fixture: dict[str, Any], tmp_path: Path) -> None:
    first = prepare(fixture["recipe"], tmp_path / "one")["outputs"]
    second = prepare(fixture["recipe"], tmp_path / "two")["outputs"]
    for name in ("train.jsonl", "dev.jsonl", "test.jsonl", "heldout_tasks.jsonl", "rejects.jsonl"):
        assert first[name]["sha256"] == second[name]["sha256"], name


def test_a_short_eval_item_with_a_sign_off_is_decontaminated_unless_short_edits_is_off(tmp_path: Path) -> None:
    item = "Strange and beautiful film."
    rows = [make(i, state=sentence(i, 30)) for i in range(4)]
    rows.append(make(50, state=f"{item}\n\nKind regards,\nPriya Shah"))  # line 5: the item with a sign-off
    source = write_jsonl(tmp_path / "records.jsonl", rows)
    evals = write_jsonl(tmp_path / "eval.jsonl", [{"id": "review", "state": item}])
    base = {
        "sources": [{"kind": "jsonl", "path": str(source)}],
        "decontaminate_against": [str(evals)],
        "split": {"dev_fraction": 0},  # 4 rows: no dev split
    }
    for short_edits, out in ((True, tmp_path / "on"), (False, tmp_path / "off")):
        recipe = DataRecipe.model_validate({**base, "decontamination": {"short_edits": short_edits}})
        manifest = prepare(recipe, out)
        step = next(s for s in manifest["steps"] if s["step"] == "decontaminate")
        assert step["short_edits"] is short_edits
        rejects = [r for r in read(out / "rejects.jsonl") if r["step"] == "decontaminate"]
        if short_edits:
            assert [(r["where"], r["matched"]["method"], r["matched"]["eval_id"]) for r in rejects] == [
                ("records.jsonl:5", "edit", "review")
            ]
            assert rejects[0]["matched"]["edit"] == "words around it"
        else:
            assert rejects == []
