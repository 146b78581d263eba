"""The streaming Ray path (``ray.streaming: true``: every step on the workers, block by block, the driver holding no
rows) writes the local path's files byte for byte: the same rows in every split in the same order, the same
rejects.jsonl and near_pairs.jsonl, the same manifest counts, for any block size. One local Ray with 2 CPUs is
started for the module.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from prepare_builders import CHOICE, NOUL, SCORE, make, sentence, write_jsonl
from test_distributed_prepare import ROOT, outputs, planted
from test_distributed_retry import crashing

from mydecide.config import DataRecipe
from mydecide.data import streaming
from mydecide.data.prepare import prepare
from mydecide.recipe_loading import load_recipe
from mydecide.recipe_parsing import RecipeError

ray = pytest.importorskip("ray")


@pytest.fixture(scope="module", autouse=True)
def local_ray() -> Any:
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def streamed(recipe: DataRecipe, block_rows: int, partitions: int = 2) -> DataRecipe:
    settings = recipe.ray.model_copy(update={"streaming": True, "block_rows": block_rows, "partitions": partitions})
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
    streamed_listed = json.loads((other / "manifest.json").read_text())["outputs"]
    assert {k: v for k, v in listed.items() if k != "recipe.yaml"} == {
        k: v for k, v in streamed_listed.items() if k != "recipe.yaml"
    }
    return files


def test_planted_near_duplicates_and_eval_items_give_the_local_files_for_any_block_size(tmp_path: Path) -> None:
    recipe, expect = planted(tmp_path)
    prepare(recipe, tmp_path / "local")
    for block_rows, partitions in ((37, 3), (5000, 2)):  # 16 blocks with near duplicates across them; one block
        lines: list[str] = []
        prepare(streamed(recipe, block_rows, partitions), tmp_path / f"s{block_rows}", log=lines.append)
        files = assert_same(tmp_path / "local", tmp_path / f"s{block_rows}")
        assert any(line.startswith("engine ray, streaming:") for line in lines)
    rejects = {r["id"]: r for r in map(json.loads, files["rejects.jsonl"].decode().splitlines())}
    for row_id, step in expect.items():
        assert rejects[row_id]["step"] == step, row_id
    assert sum(r["step"] == "near_dedup" for r in rejects.values()) == 21


def test_the_bundled_demo_data_gives_the_local_files(tmp_path: Path) -> None:
    recipe = load_recipe(ROOT / "recipes/data/demo.yaml", model=DataRecipe)
    prepare(recipe, tmp_path / "local")
    lines: list[str] = []
    prepare(streamed(recipe, 700, 3), tmp_path / "ray", log=lines.append)
    files = assert_same(tmp_path / "local", tmp_path / "ray")
    assert any(line.startswith("engine ray, streaming:") for line in lines)
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
    prepare(streamed(recipe, 33), tmp_path / "ray")
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
    prepare(streamed(recipe, 10, 3), tmp_path / "ray")
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
    prepare(streamed(recipe, 10), tmp_path / "ray")
    assert_same(tmp_path / "local", tmp_path / "ray")
    assert len(list((tmp_path / "ray" / "train").iterdir())) > 1


def test_one_parquet_file_per_split_is_refused_in_one_line(tmp_path: Path) -> None:
    recipe = mixed(tmp_path)
    recipe = recipe.model_copy(update={"output": recipe.output.model_copy(update={"format": "parquet"})})
    with pytest.raises(RecipeError, match=r"output\.rows_per_file"):
        prepare(streamed(recipe, 10), tmp_path / "ray")


def test_a_recipe_error_on_a_worker_is_the_local_message(tmp_path: Path) -> None:
    recipe = mixed(tmp_path)
    recipe = recipe.model_copy(update={"split": recipe.split.model_copy(update={"heldout_tasks": ["nope"]})})
    with pytest.raises(RecipeError) as local:
        prepare(recipe, tmp_path / "local")
    with pytest.raises(RecipeError) as streamed_error:
        prepare(streamed(recipe, 10), tmp_path / "ray")
    assert str(streamed_error.value) == str(local.value)
    missing = recipe.model_copy(
        update={"sources": [recipe.sources[0].model_copy(update={"path": str(tmp_path / "no.jsonl")})]}
    )
    with pytest.raises(RecipeError) as local:
        prepare(missing, tmp_path / "local")
    with pytest.raises(RecipeError) as streamed_error:
        prepare(streamed(missing, 10), tmp_path / "ray")
    assert str(streamed_error.value) == str(local.value)
    assert not (tmp_path / "ray").exists()


def test_a_worker_that_dies_is_retried_and_one_that_always_dies_leaves_the_previous_outputs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    recipe, _ = planted(tmp_path)
    prepare(recipe, tmp_path / "local")
    folders = [tmp_path / "sign", tmp_path / "render", tmp_path / "write"]
    for folder, task in zip(folders, ("_sign_block", "_split_render", "_write_split"), strict=True):
        folder.mkdir()
        (folder / "crashes").write_text("1")
        monkeypatch.setattr(streaming, task, crashing(getattr(streaming, task), folder))
    prepare(streamed(recipe, 100), tmp_path / "ray")
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
        prepare(streamed(changed, 100), tmp_path / "ray")
    assert every_file(tmp_path / "ray") == before  # the previous outputs, whole
    assert not list(tmp_path.glob(".ray.staging-*"))


def test_a_first_seen_share_removes_every_row_but_the_lowest_seq_of_its_key_across_blocks_and_waves() -> None:
    """FirstSeen (the actor of the exact-dedup and duplicate-id shuffles) called wave by wave, blocks in order: a
    later row of a key already seen is removed against the first row's ref, with its target conflict."""
    seen = streaming.FirstSeen()

    def share(keys: list[int], seqs: list[int], targets: list[int]) -> tuple[Any, ...]:
        k = np.array([[key, 0] for key in keys], dtype=np.uint64).reshape(-1, 2)
        return (k, np.array(seqs, dtype=np.int64), np.array(targets, dtype=np.uint64), [f"row{q}" for q in seqs])

    # wave 1: block 0 (seqs 0-2; rows given out of seq order) and block 1 (seqs 3-5)
    b0, b1 = seen.add(share([7, 9, 7], [2, 0, 1], [1, 1, 2]), share([9, 5, 5], [3, 4, 5], [1, 0, 0]))
    assert b0[0].tolist() == [2] and b0[1] == ["row1"] and b0[2].tolist() == [True]  # seq 1 came first; other target
    assert b1[0].tolist() == [3, 5] and b1[1] == ["row0", "row4"] and b1[2].tolist() == [False, False]
    # wave 2: one block; every key seen in wave 1 is still held
    removed, matched, conflicts = seen.add(share([5, 8, 7], [6, 7, 8], [0, 0, 2]))
    assert removed.tolist() == [6, 8] and matched == ["row4", "row1"] and conflicts.tolist() == [False, False]


def dead(actor: Any, wait: float = 30.0) -> bool:
    """Whether ``actor`` is gone: ``ray.kill`` returns before the actor stops, so a call made right after it may
    still be answered; poll until a call fails with the actor's death, for at most ``wait`` seconds."""
    import time

    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        try:
            ray.get(actor.__ray_ready__.remote(), timeout=max(0.1, deadline - time.monotonic()))
        except ray.exceptions.RayActorError:
            return True
        except ray.exceptions.GetTimeoutError:
            break
        time.sleep(0.1)
    return False


def test_the_key_holding_actors_go_when_their_step_ends_or_fails() -> None:
    """A waved shuffle's actors hold a share of every key seen: they are killed when the step is over, and also when
    it raises, so a failed step leaves no actor holding keys in the cluster."""
    with streaming.key_actors(streaming.KeyCounts, 2) as counts:
        ray.get([a.add.remote(np.array([4, 4, 4, 4], dtype=np.uint64)) for a in counts])
        assert [x.tolist() for x in ray.get([a.frequent.remote() for a in counts])] == [[4], [4]]
        assert not dead(counts[0], wait=0.5)  # alive while the step runs
    assert all(dead(a) for a in counts)
    with pytest.raises(RuntimeError, match="a step failed"), streaming.key_actors(streaming.FirstSeen, 1) as seen:
        raise RuntimeError("a step failed")
    assert dead(seen[0])


def test_the_keep_rule_on_arrays_removes_a_row_only_for_the_most_similar_earlier_kept_row() -> None:
    from mydecide.data.distributed import kept_by

    # row 2 matches 1 (0.9) and 0 (0.8), but 1 is removed by 0: 2 goes with 0; row 5 matches only 4, kept: removed;
    # row 6 matches only 5, itself removed: 6 stays; row 7 ties 0.75 on 4 and 3: the first, 3
    matches = [(1, 0, 0.95), (2, 1, 0.9), (2, 0, 0.8), (5, 4, 0.7), (6, 5, 0.99), (7, 4, 0.75), (7, 3, 0.75)]
    table = kept_by(np.array(matches[::-1], dtype=np.float64))
    assert table.tolist() == [[1, 0, 0.95], [2, 0, 0.8], [5, 4, 0.7], [7, 3, 0.75]]
    assert kept_by(np.zeros((0, 3))).shape == (0, 3)


def test_the_files_are_written_by_tasks_on_the_drivers_node_or_by_a_ray_client_driver(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ray.util.client import ray as client

    recipe = mixed(tmp_path)
    recipe = recipe.model_copy(update={"output": recipe.output.model_copy(update={"rows_per_file": 7})})
    prepare(recipe, tmp_path / "local")
    writers: list[int] = []
    write_split = streaming._write_split

    def recorded(*args: Any) -> Any:
        writers.append(os.getpid())
        return write_split(*args)

    monkeypatch.setattr(streaming, "_write_split", recorded)
    prepare(streamed(recipe, 10), tmp_path / "ray")
    assert_same(tmp_path / "local", tmp_path / "ray")
    assert writers == []  # the calls ran in Ray workers, not in this (the driver's) process
    monkeypatch.setattr(client, "is_connected", lambda: True)  # through Ray Client the driver writes itself
    prepare(streamed(recipe, 10), tmp_path / "client")
    assert_same(tmp_path / "local", tmp_path / "client")
    assert writers == [os.getpid()] * 4  # train, dev, held-out, test
