"""`prepare` on Ray (local mode, 2 worker CPUs) gives the local path's answer: the same rows in every split, the same
rejects and near pairs, the same manifest counts and reasons, for any partition count.

One Ray is started for the module and shut down at its end; the engine reuses it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from prepare_builders import CHOICE, NOUL, WORDS, make, sentence, write_jsonl

from mydecide.config import DataRecipe
from mydecide.data.prepare import prepare
from mydecide.recipe_loading import load_recipe

ray = pytest.importorskip("ray")

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module", autouse=True)
def local_ray() -> Any:
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def outputs(out: Path) -> tuple[dict[str, str], dict[str, Any]]:
    """Every JSONL output as text, and the manifest without timings and provenance."""
    files = {path.name: path.read_text(encoding="utf-8") for path in sorted(out.glob("*.jsonl"))}
    manifest = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
    steps = [{k: v for k, v in step.items() if k != "seconds"} for step in manifest["steps"]]
    return files, {"steps": steps, "conservation": manifest["conservation"], "splits": manifest["splits"]}


def on_ray(recipe: DataRecipe, partitions: int) -> DataRecipe:
    """The in-driver Ray path (``ray.streaming: false``; the streaming path is tests/data/test_streaming_prepare.py)."""
    settings = recipe.ray.model_copy(update={"partitions": partitions, "streaming": False})
    return recipe.model_copy(update={"engine": "ray", "ray": settings})


def assert_same(local: Path, distributed: Path) -> dict[str, str]:
    files, manifest = outputs(local)
    other_files, other_manifest = outputs(distributed)
    assert sorted(files) == sorted(other_files)
    for name in files:
        assert files[name] == other_files[name], f"{name} differs"
    assert manifest == other_manifest
    return files


def test_the_bundled_demo_data_gives_the_local_answer(tmp_path: Path) -> None:
    recipe = load_recipe(ROOT / "recipes/data/demo.yaml", model=DataRecipe)
    prepare(recipe, tmp_path / "local")
    lines: list[str] = []
    prepare(on_ray(recipe, 3), tmp_path / "ray", log=lines.append)
    files = assert_same(tmp_path / "local", tmp_path / "ray")
    assert lines[0].startswith("engine ray: 2 CPUs, 3 partitions")
    rejects = [json.loads(line) for line in files["rejects.jsonl"].split("\n")[:-1]]
    assert sum(r["step"] == "near_dedup" for r in rejects) > 50  # the demo has near duplicates to agree on


def edited(text: str, at: int, word: str = "zzyzx") -> str:
    words = text.split()
    words[at] = word
    return " ".join(words)


def planted(tmp_path: Path) -> tuple[DataRecipe, dict[str, str]]:
    """600 rows whose near duplicates sit in other partitions than the rows they repeat, a chain (b repeats a, c
    repeats b but not a), look-alikes with another number, the same text under another question, and eval items
    found exactly, nearly, and as a short phrase that is rare (2 rows) or common (4 rows, in several partitions)."""
    rows = [make(i, question=CHOICE if i % 3 else NOUL) for i in range(540)]
    expect: dict[str, str] = {}
    for k in range(0, 40, 2):  # an early row repeated with one word changed near the end
        rows.append(make(1000 + k, state=edited(rows[k]["state"], 7), question=rows[k]["question"]))
        expect[f"r{1000 + k}"] = "near_dedup"
    chain_a = sentence(5000, 24)
    chain_b = edited(edited(chain_a, 3), 11, "yyqq")
    chain_c = edited(edited(chain_b, 17, "wwvv"), 20, "uutt")
    rows.insert(10, make(5000, state=chain_a, question=NOUL))
    rows.insert(300, make(5001, state=chain_b, question=NOUL))
    rows.append(make(5002, state=chain_c, question=NOUL))
    rows.insert(5, make(6000, state="Set an alarm for 7 am tomorrow please", question=NOUL))
    rows.append(make(6001, state="Set an alarm for 9 am tomorrow please", question=NOUL))
    rows.append(make(6002, state=rows[20]["state"], question={**NOUL, "instructions": "Is it about rivers?"}))
    common = "quartz meadow willow harbor canyon beacon"
    for k, at in enumerate((50, 200, 380, 560)):  # a 6-word eval phrase inside 4 rows: common, not contamination
        rows.insert(at, make(7000 + k, state=f"{sentence(7000 + k, 12)} {common} {sentence(7100 + k, 12)}"))
    rare = "glacier lagoon yarrow tundra sierra ember"
    for k, at in enumerate((120, 500)):  # inside 2 rows: a copied eval item
        rows.insert(at, make(7200 + k, state=f"{sentence(7200 + k, 12)} {rare} {sentence(7300 + k, 12)}"))
        expect[f"r{7200 + k}"] = "decontaminate"
    source = write_jsonl(tmp_path / "rows.jsonl", rows)
    evals = [
        {"id": "e-exact", "state": rows[400]["state"]},
        {"id": "e-near", "state": edited(rows[450]["state"], 30)},
        {"id": "e-common", "state": common},
        {"id": "e-rare", "state": rare},
        {"id": "e-other", "state": " ".join(WORDS[:20])},
    ]
    expect[rows[400]["id"]] = expect[rows[450]["id"]] = "decontaminate"
    eval_file = write_jsonl(tmp_path / "eval.jsonl", evals)
    recipe = DataRecipe.model_validate(
        {
            "sources": [{"kind": "jsonl", "path": str(source)}],
            "decontaminate_against": [str(eval_file)],
            "dedup": {"near": {"threshold": 0.7}},
            "split": {"dev_fraction": 0.1, "test_fraction": 0.1},
            "augment": {"anonymize_options": 0.2, "drop_distractors": 0.2},
        }
    )
    return recipe, expect


def test_planted_near_duplicates_across_partitions_give_the_local_answer_for_any_partition_count(
    tmp_path: Path,
) -> None:
    recipe, expect = planted(tmp_path)
    prepare(recipe, tmp_path / "local")
    for partitions in (2, 5):
        prepare(on_ray(recipe, partitions), tmp_path / f"ray{partitions}")
        files = assert_same(tmp_path / "local", tmp_path / f"ray{partitions}")
    rejects = {r["id"]: r for r in map(json.loads, files["rejects.jsonl"].split("\n")[:-1])}
    for row_id, step in expect.items():  # the planted rows left at the step they were planted for ...
        assert rejects[row_id]["step"] == step, row_id
    for k in range(0, 40, 2):  # ... matched to a row in the first partition (they sit in the last)
        assert rejects[f"r{1000 + k}"]["matched"]["id"] == f"r{k}"
    assert "r5001" in rejects and "r6001" not in rejects and "r6002" not in rejects
    assert not any(f"r{7000 + k}" in rejects for k in range(4))  # the common phrase stays
    assert {r["matched"]["eval_id"] for r in rejects.values() if r["step"] == "decontaminate"} >= {
        "e-exact",
        "e-near",
        "e-rare",
    }


def test_the_command_line_runs_the_ray_engine(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from mydecide.cli import app

    source = write_jsonl(tmp_path / "rows.jsonl", [make(i) for i in range(30)] + [make(99, state=sentence(3))])
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(f"sources:\n  - {{kind: jsonl, path: {source}}}\n", encoding="utf-8")
    result = CliRunner().invoke(app, ["prepare", str(recipe), "--engine", "ray", "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text(encoding="utf-8"))
    assert manifest["recipe"]["engine"] == "ray"
    assert manifest["recipe"]["ray"]["streaming"] is True  # the default: no process holds all rows
    assert manifest["conservation"]["removed"] == 1  # r99 repeats r3's state exactly


def test_decontamination_without_near_dedup_signs_the_rows_itself_and_gives_the_local_answer(tmp_path: Path) -> None:
    recipe, _ = planted(tmp_path)
    recipe = recipe.model_copy(update={"dedup": recipe.dedup.model_copy(update={"near": {"enabled": False}})})
    recipe = DataRecipe.model_validate(recipe.model_dump())
    prepare(recipe, tmp_path / "local")
    prepare(on_ray(recipe, 3), tmp_path / "ray")
    files = assert_same(tmp_path / "local", tmp_path / "ray")
    rejects = [json.loads(line) for line in files["rejects.jsonl"].split("\n")[:-1]]
    assert any(r["matched"]["method"] == "near" for r in rejects if r["step"] == "decontaminate")


def test_records_whose_content_is_in_the_question_give_the_local_answer(tmp_path: Path) -> None:
    """Trivia rows (a question asked of one or two rows is part of their content) among rows sharing an
    instruction: copies with an edited question, look-alike questions, and an eval item whose content is in its
    question, on any partition count."""
    state = "Answer from general knowledge."
    questions = [f"Is the river number {k} longer than {k * 10} km?" for k in range(60)]
    rows = [make(i, question=NOUL) for i in range(200)]
    rows += [make(300 + k, state=state, question={**NOUL, "instructions": q}) for k, q in enumerate(questions)]
    for k in range(0, 60, 6):  # copies: the "?" lost, a word gained, a phrase appended
        edits = [
            questions[k].rstrip("?").lower(),
            questions[k].replace("longer", "much longer"),
            f"{questions[k]} Yes?",
        ]
        rows.append(make(400 + k, state=state, question={**NOUL, "instructions": edits[k // 6 % 3]}))
        rows.append(make(500 + k, state=state, question={**NOUL, "instructions": questions[k].replace("0 km", "5 km")}))
    copied = questions[13].replace("longer", "really longer").rstrip("?")  # an eval item: r313, edited
    evals = [{"id": "e-q", "state": state, "question": {"type": "noul", "instructions": copied}}]
    recipe = DataRecipe.model_validate(
        {
            "sources": [{"kind": "jsonl", "path": str(write_jsonl(tmp_path / "rows.jsonl", rows))}],
            "decontaminate_against": [str(write_jsonl(tmp_path / "eval.jsonl", evals))],
            "split": {"dev_fraction": 0.1},
        }
    )
    prepare(recipe, tmp_path / "local")
    for partitions in (2, 5):
        prepare(on_ray(recipe, partitions), tmp_path / f"ray{partitions}")
        files = assert_same(tmp_path / "local", tmp_path / f"ray{partitions}")
    rejects = {r["id"]: r for r in map(json.loads, files["rejects.jsonl"].split("\n")[:-1])}
    assert {i for i, r in rejects.items() if r["step"] == "near_dedup"} == {f"r{400 + k}" for k in range(0, 60, 6)}
    assert not any(f"r{500 + k}" in rejects for k in range(0, 60, 6))  # another number: another question
    assert [i for i, r in rejects.items() if r["step"] == "decontaminate"] == ["r313"]
