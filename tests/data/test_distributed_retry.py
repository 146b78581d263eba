"""A Ray worker that dies mid-run (its process ends, as on a lost machine) has its task retried by Ray, and the run
still gives the local path's answer; a run whose tasks keep failing stops with an error and writes no output
directory. The test injects the fault itself: it wraps the signing task (``distributed._sign``) so that the first N
signing tasks to start end their worker process, as a machine failure would."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from prepare_builders import make, sentence, write_jsonl

from mydecide.config import DataRecipe
from mydecide.data import distributed
from mydecide.data.prepare import prepare

ray = pytest.importorskip("ray")


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


@pytest.fixture(scope="module")
def crash_dir(tmp_path_factory: pytest.TempPathFactory) -> Any:
    folder = tmp_path_factory.mktemp("crashes")
    (folder / "crashes").write_text("0")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(distributed, "_sign", crashing(distributed._sign, folder))
        yield folder
    ray.shutdown()


def data(tmp_path: Path) -> DataRecipe:
    rows = [make(i) for i in range(80)] + [make(100 + i, state=sentence(i)[:-3] + "zzz") for i in range(0, 80, 7)]
    source = write_jsonl(tmp_path / "rows.jsonl", rows)
    return DataRecipe.model_validate({"sources": [{"kind": "jsonl", "path": str(source)}]})


def in_driver(recipe: DataRecipe, partitions: int) -> Any:
    """The in-driver Ray path's settings (``ray.streaming: false``), whose near dedup calls ``distributed._sign``."""
    return recipe.ray.model_copy(update={"partitions": partitions, "streaming": False})


def files(out: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted(out.glob("*.jsonl"))}


def test_a_worker_that_dies_is_retried_and_the_answer_is_the_local_one(tmp_path: Path, crash_dir: Path) -> None:
    recipe = data(tmp_path)
    prepare(recipe, tmp_path / "local")
    (crash_dir / "crashes").write_text("1")
    on_ray = recipe.model_copy(update={"engine": "ray", "ray": in_driver(recipe, 3)})
    prepare(on_ray, tmp_path / "ray")
    assert len(list(crash_dir.glob("crash-*"))) == 1  # one worker died
    assert files(tmp_path / "ray") == files(tmp_path / "local")
    assert "near duplicate" in files(tmp_path / "ray")["rejects.jsonl"]


def test_a_run_whose_tasks_keep_failing_stops_and_writes_nothing(tmp_path: Path, crash_dir: Path) -> None:
    recipe = data(tmp_path)
    for marker in crash_dir.glob("crash-*"):
        marker.unlink()
    (crash_dir / "crashes").write_text("1000")
    on_ray = recipe.model_copy(update={"engine": "ray", "ray": in_driver(recipe, 2)})
    with pytest.raises(ray.exceptions.RayError):
        prepare(on_ray, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    assert not list(tmp_path.glob(".out.staging-*"))
    (crash_dir / "crashes").write_text("0")
