"""`prepare` on Ray (``engine: ray``: every step on the workers, block by block, the driver holding no rows) writes
the local path's files byte for byte: the same rows in every split in the same order, the same rejects.jsonl and
near_pairs.jsonl, the same manifest counts, for any block size and partition count. One local Ray with 2 CPUs is
started for the module.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from prepare_builders import CHOICE, NOUL, SCORE, WORDS, make, sentence, write_jsonl

from mydecide.config import DataRecipe
from mydecide.data.prepare import prepare
from mydecide.data.ray import driver, near_steps, steps
from mydecide.recipe_loading import load_recipe
from mydecide.recipe_parsing import RecipeError

ray = pytest.importorskip("ray")

ROOT = Path(__file__).resolve().parents[2]


def outputs(out: Path) -> tuple[dict[str, str], dict[str, Any]]:
    """Every JSONL output as text, and the manifest without timings and provenance."""
    files = {path.name: path.read_text(encoding="utf-8") for path in sorted(out.glob("*.jsonl"))}
    manifest = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
    steps = [{k: v for k, v in step.items() if k != "seconds"} for step in manifest["steps"]]
    return files, {"steps": steps, "conservation": manifest["conservation"], "splits": manifest["splits"]}


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


def crashing(task: Callable[..., Any], folder: Path) -> Callable[..., Any]:
    """``task``, except that the first N calls to start (N in ``folder/crashes``) end their worker process first.

    A nested function, so Ray ships it to the workers by value, with ``task`` and ``folder``."""

    def crash_then_run(*args: Any, **kwargs: Any) -> Any:
        for slot in range(int((folder / "crashes").read_text())):
            try:  # claim a crash slot atomically: two workers starting together must not both take the same one
                os.close(os.open(folder / f"crash-{slot}", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            except FileExistsError:
                continue
            os._exit(1)
        return task(*args, **kwargs)

    return crash_then_run


@pytest.fixture(scope="module", autouse=True)
def local_ray() -> Any:
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def on_ray(recipe: DataRecipe, block_rows: int, partitions: int = 2) -> DataRecipe:
    settings = recipe.ray.model_copy(update={"block_rows": block_rows, "partitions": partitions})
    return recipe.model_copy(update={"engine": "ray", "ray": settings})


def every_file(out: Path) -> dict[str, bytes]:
    """Every output file but the manifest (and recipe.yaml, which names the engine), by its path under ``out``."""
    return {
        str(p.relative_to(out)): p.read_bytes()
        for p in sorted(out.rglob("*"))
        if p.is_file() and p.name not in ("manifest.json", "recipe.yaml")
    }


def assert_same(local: Path, other: Path) -> dict[str, bytes]:
    files = every_file(local)
    assert list(files) == list(every_file(other))
    for name, data in every_file(other).items():
        assert data == files[name], f"{name} differs"
    assert outputs(local)[1] == outputs(other)[1]
    listed = json.loads((local / "manifest.json").read_text())["outputs"]
    ray_listed = json.loads((other / "manifest.json").read_text())["outputs"]
    assert {k: v for k, v in listed.items() if k != "recipe.yaml"} == {
        k: v for k, v in ray_listed.items() if k != "recipe.yaml"
    }
    return files


def test_planted_near_duplicates_and_eval_items_give_the_local_files_for_any_block_size(tmp_path: Path) -> None:
    recipe, expect = planted(tmp_path)
    prepare(recipe, tmp_path / "local")
    for block_rows, partitions in ((37, 3), (5000, 2)):  # 16 blocks with near duplicates across them; one block
        lines: list[str] = []
        prepare(on_ray(recipe, block_rows, partitions), tmp_path / f"s{block_rows}", log=lines.append)
        files = assert_same(tmp_path / "local", tmp_path / f"s{block_rows}")
        blocks = 16 if block_rows == 37 else 1
        assert lines[:2] == [
            f"engine ray: 2 CPUs, {partitions} partitions",
            f"engine ray: {blocks} blocks of up to {block_rows} rows read, {partitions} reducers",
        ]
    rejects = {r["id"]: r for r in map(json.loads, files["rejects.jsonl"].decode().splitlines())}
    for row_id, step in expect.items():
        assert rejects[row_id]["step"] == step, row_id
    assert sum(r["step"] == "near_dedup" for r in rejects.values()) == 21
    for k in range(0, 40, 2):  # matched to a row of the first block (they sit in the last)
        assert rejects[f"r{1000 + k}"]["matched"]["id"] == f"r{k}"
    assert "r5001" in rejects and "r6001" not in rejects and "r6002" not in rejects
    assert not any(f"r{7000 + k}" in rejects for k in range(4))  # the common phrase stays
    assert {r["matched"]["eval_id"] for r in rejects.values() if r["step"] == "decontaminate"} >= {
        "e-exact",
        "e-near",
        "e-rare",
    }


def test_the_bundled_demo_data_gives_the_local_files(tmp_path: Path) -> None:
    recipe = load_recipe(ROOT / "recipes/data/demo.yaml", model=DataRecipe)
    prepare(recipe, tmp_path / "local")
    lines: list[str] = []
    prepare(on_ray(recipe, 700, 3), tmp_path / "ray", log=lines.append)
    files = assert_same(tmp_path / "local", tmp_path / "ray")
    assert lines[0] == "engine ray: 2 CPUs, 3 partitions"
    assert re.fullmatch(r"engine ray: \d+ blocks of up to 700 rows read, 3 reducers", lines[1])
    assert files["near_pairs.jsonl"].count(b"\n") > 50


def test_records_whose_content_is_in_the_question_give_the_local_files(tmp_path: Path) -> None:
    """Whether a question is content is a count over all rows: a question asked of four rows spread over four
    blocks is an instruction, one asked of two rows content, whichever blocks hold them."""
    state = "Answer from general knowledge."
    questions = [f"Is the river number {k} longer than {k * 10} km?" for k in range(40)]
    rows = [make(i, question=NOUL) for i in range(60)]
    rows += [make(300 + k, state=state, question={**NOUL, "instructions": q}) for k, q in enumerate(questions)]
    for k in range(0, 40, 5):
        rows.append(make(400 + k, state=state, question={**NOUL, "instructions": questions[k].rstrip("?").lower()}))
    shared = {**NOUL, "instructions": "Is the harbor open today?"}
    for k, at in enumerate((3, 40, 80, 130)):  # one question, four rows, four blocks: an instruction
        rows.insert(at, make(600 + k, state=sentence(600 + k, 12), question=shared))
    # its edit asked once is content: another group than the instruction's rows, so not a copy of r600 (were the
    # four counted per block, all five would be content questions, compared, and r700 removed)
    asked_once = {**NOUL, "instructions": "Is the harbor open today, please?"}
    rows.append(make(700, state=sentence(600, 12), question=asked_once))
    recipe = DataRecipe.model_validate(
        {"sources": [{"kind": "jsonl", "path": str(write_jsonl(tmp_path / "rows.jsonl", rows))}]}
    )
    prepare(recipe, tmp_path / "local")
    prepare(on_ray(recipe, 33), tmp_path / "ray")
    files = assert_same(tmp_path / "local", tmp_path / "ray")
    near = [json.loads(line) for line in files["rejects.jsonl"].decode().splitlines()]
    assert {r["id"] for r in near if r["step"] == "near_dedup"} == {f"r{400 + k}" for k in range(0, 40, 5)}
    assert "r700" not in {r["id"] for r in near}


def mixed(tmp_path: Path) -> DataRecipe:
    """Two sources with bad rows, exact duplicates and repeated ids in other blocks than their first, three
    tasks (one held out, one capped), a score task."""
    rows: list[Any] = [
        make(i, question=CHOICE if i % 2 else NOUL, task="tickets" if i % 3 else "mail") for i in range(90)
    ]
    rows.insert(17, "{not json")
    rows.insert(44, {"id": "bad", "task": "tickets", "state": "x", "question": {"type": "choice"}, "answer": "a"})
    rows.append(make(3, state=sentence(999), task="mail"))  # the id r3 again, another record
    rows.append({**rows[2], "id": "copy-of-r2"})  # r2's record exactly, under another id
    other = [make(200 + i, question=SCORE, task="urgency") for i in range(40)] + [make(205, question=SCORE)]
    other.insert(30, {"id": "r299", "task": "urgency", "state": "", "question": SCORE, "answer": 9})
    return DataRecipe.model_validate(
        {
            "sources": [
                {"kind": "jsonl", "path": str(write_jsonl(tmp_path / "a.jsonl", rows)), "name": "a"},
                {"kind": "jsonl", "path": str(write_jsonl(tmp_path / "b.jsonl", other)), "name": "b"},
            ],
            "cap_per_task": {"tickets": 25},
            "split": {"heldout_tasks": ["mail"], "dev_fraction": 0.2, "test_fraction": 0.1},
            "augment": {"anonymize_options": 0.3},
        }
    )


def test_bad_rows_duplicates_ids_caps_and_held_out_tasks_give_the_local_files(tmp_path: Path) -> None:
    recipe = mixed(tmp_path)
    prepare(recipe, tmp_path / "local")
    prepare(on_ray(recipe, 10, 3), tmp_path / "ray")
    files = assert_same(tmp_path / "local", tmp_path / "ray")
    rejects = [json.loads(line) for line in files["rejects.jsonl"].decode().splitlines()]
    wheres = {r["where"] for r in rejects if r["step"] == "validate"}
    assert {"a.jsonl:18", "a.jsonl:45", "b.jsonl:31"} <= wheres  # each bad row named by its file and line
    steps = {r["step"] for r in rejects}
    assert {"validate", "exact_dedup", "duplicate_ids", "cap_per_task"} <= steps


@pytest.mark.parametrize("layout", [{"rows_per_file": 7}, {"format": "parquet", "rows_per_file": 9}])
def test_part_files_are_the_local_ones(tmp_path: Path, layout: dict[str, Any]) -> None:
    recipe = mixed(tmp_path)
    recipe = recipe.model_copy(update={"output": recipe.output.model_copy(update=layout)})
    prepare(recipe, tmp_path / "local")
    prepare(on_ray(recipe, 10), tmp_path / "ray")
    assert_same(tmp_path / "local", tmp_path / "ray")
    assert len(list((tmp_path / "ray" / "train").iterdir())) > 1


def test_one_parquet_file_per_split_is_refused_in_one_line(tmp_path: Path) -> None:
    recipe = mixed(tmp_path)
    recipe = recipe.model_copy(update={"output": recipe.output.model_copy(update={"format": "parquet"})})
    with pytest.raises(RecipeError) as refused:
        prepare(on_ray(recipe, 10), tmp_path / "ray")
    assert str(refused.value) == (
        "engine ray: output.format parquet needs output.rows_per_file (one Parquet file of a whole split would be "
        "built in one process); set output.rows_per_file, e.g. 1000000"
    )
    assert not (tmp_path / "ray").exists()


def test_a_recipe_error_on_a_worker_is_the_local_message(tmp_path: Path) -> None:
    recipe = mixed(tmp_path)
    recipe = recipe.model_copy(update={"split": recipe.split.model_copy(update={"heldout_tasks": ["nope"]})})
    with pytest.raises(RecipeError) as local:
        prepare(recipe, tmp_path / "local")
    with pytest.raises(RecipeError) as ray_error:
        prepare(on_ray(recipe, 10), tmp_path / "ray")
    assert str(ray_error.value) == str(local.value)
    missing = recipe.model_copy(
        update={"sources": [recipe.sources[0].model_copy(update={"path": str(tmp_path / "no.jsonl")})]}
    )
    with pytest.raises(RecipeError) as local:
        prepare(missing, tmp_path / "local")
    with pytest.raises(RecipeError) as ray_error:
        prepare(on_ray(missing, 10), tmp_path / "ray")
    assert str(ray_error.value) == str(local.value)
    assert not (tmp_path / "ray").exists()


def test_a_worker_that_dies_is_retried_and_one_that_always_dies_leaves_the_previous_outputs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    recipe, _ = planted(tmp_path)
    prepare(recipe, tmp_path / "local")
    folders = [tmp_path / "sign", tmp_path / "render", tmp_path / "write"]
    tasks = ((near_steps, "sign_block"), (steps, "split_render"), (driver, "write_split"))
    for folder, (module, task) in zip(folders, tasks, strict=True):
        folder.mkdir()
        (folder / "crashes").write_text("1")
        monkeypatch.setattr(module, task, crashing(getattr(module, task), folder))
    prepare(on_ray(recipe, 100), tmp_path / "ray")
    for folder in folders:  # a worker died mid near dedup, another mid rendering, another writing a split
        assert len(list(folder.glob("crash-*"))) == 1
    assert_same(tmp_path / "local", tmp_path / "ray")
    before = every_file(tmp_path / "ray")
    for folder in folders:
        (folder / "crashes").write_text("1000")
        for marker in folder.glob("crash-*"):
            marker.unlink()
    changed = recipe.model_copy(update={"split": recipe.split.model_copy(update={"seed": 99})})
    with pytest.raises(ray.exceptions.RayError):
        prepare(on_ray(changed, 100), tmp_path / "ray")
    assert every_file(tmp_path / "ray") == before  # the previous outputs, whole
    assert not list(tmp_path.glob(".ray.staging-*"))


def test_the_files_are_written_by_tasks_on_the_drivers_node_or_by_a_ray_client_driver(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ray.util.client import ray as client

    recipe = mixed(tmp_path)
    recipe = recipe.model_copy(update={"output": recipe.output.model_copy(update={"rows_per_file": 7})})
    prepare(recipe, tmp_path / "local")
    writers: list[int] = []
    write_split = driver.write_split

    def recorded(*args: Any) -> Any:
        writers.append(os.getpid())
        return write_split(*args)

    monkeypatch.setattr(driver, "write_split", recorded)
    prepare(on_ray(recipe, 10), tmp_path / "ray")
    assert_same(tmp_path / "local", tmp_path / "ray")
    assert writers == []  # the calls ran in Ray workers, not in this (the driver's) process
    monkeypatch.setattr(client, "is_connected", lambda: True)  # through Ray Client the driver writes itself
    prepare(on_ray(recipe, 10), tmp_path / "client")
    assert_same(tmp_path / "local", tmp_path / "client")
    assert writers == [os.getpid()] * 4  # train, dev, held-out, test


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
    assert manifest["conservation"]["removed"] == 1  # r99 repeats r3's state exactly


def test_decontamination_without_near_dedup_signs_the_rows_itself_and_gives_the_local_answer(tmp_path: Path) -> None:
    recipe, _ = planted(tmp_path)
    recipe = recipe.model_copy(update={"dedup": recipe.dedup.model_copy(update={"near": {"enabled": False}})})
    recipe = DataRecipe.model_validate(recipe.model_dump())
    prepare(recipe, tmp_path / "local")
    prepare(on_ray(recipe, 50, 3), tmp_path / "ray")
    files = assert_same(tmp_path / "local", tmp_path / "ray")
    rejects = [json.loads(line) for line in files["rejects.jsonl"].decode().splitlines()]
    assert any(r["matched"]["method"] == "near" for r in rejects if r["step"] == "decontaminate")
