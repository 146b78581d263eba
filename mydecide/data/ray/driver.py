"""``prepare`` on Ray (``engine: ray``), with no process holding all rows: :func:`prepare_on_ray` reads as the
table of contents of the local pipeline (:func:`mydecide.data.prepare.prepare`), step by step on the run's blocks,
then writes the files through a staging directory that replaces ``--out`` whole (:func:`write_files`). The package
docstring (:mod:`mydecide.data.ray`) says how the steps are cut."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from mydecide.config import DataRecipe, dump_recipe
from mydecide.data.ledger import short_reasons
from mydecide.data.outputs import check_output_dir, earlier_outputs
from mydecide.data.ray.engine import ray_engine
from mydecide.data.ray.near_steps import decontaminate, near_dedup
from mydecide.data.ray.steps import cap_per_task, exact_dedup, read, split_and_augment, unique_ids
from mydecide.data.ray.stream import Log, Stream
from mydecide.data.ray.writers import Writer, file_mode, write_near_pairs, write_rejects, write_split
from mydecide.data.task_counts import task_lines
from mydecide.errors import UserError
from mydecide.io import atomic_write_json, atomic_write_text, directory_lock, staged_directory
from mydecide.manifest import MANIFEST
from mydecide.recipe_parsing import RecipeError


def prepare_on_ray(
    recipe: DataRecipe, out: str | Path | None = None, *, progress: bool = False, log: Log | None = None
) -> dict[str, Any]:
    """:func:`mydecide.data.prepare.prepare` on Ray, block by block; returns the manifest. ``progress`` is
    accepted for the same signature (a run on Ray logs one line per step instead of progress bars)."""
    import ray

    out = Path(out if out is not None else recipe.out)
    check_output_dir(out, recipe)
    if recipe.output.format == "parquet" and recipe.output.rows_per_file is None:
        raise RecipeError(
            "engine ray: output.format parquet needs output.rows_per_file (one Parquet file of a whole split would "
            "be built in one process); set output.rows_per_file, e.g. 1000000"
        )
    with directory_lock(out, "prepare"), ray_engine(recipe.ray, log=log) as partitions:
        say = log or (lambda _message: None)
        run = Stream(recipe, partitions, say)
        try:
            read(run)
            exact_dedup(run)
            unique_ids(run)
            near_dedup(run)
            decontaminate(run)
            cap_per_task(run)
            split_and_augment(run)
            for step in run.steps:
                say(f"{step['step']:<14} {step['in']:>8} in  {step['out']:>8} out  {short_reasons(step)}")
            manifest = run.manifest()
            write_files(run, out, manifest)
        except ray.exceptions.RayTaskError as err:  # a data or recipe error on a worker: the local one-line message
            cause = getattr(err, "cause", None)
            if isinstance(cause, UserError):
                raise cause from None
            raise
        for line in task_lines(manifest, out):
            say(line)
        say(f"wrote {', '.join(sorted(manifest['outputs']))} to {out}")
        return manifest


def write_files(run: Stream, out: Path, manifest: dict[str, Any]) -> None:
    """Every file into a staging directory that replaces ``out`` whole (``outputs.write_outputs``'s swap).

    The files are written by Ray tasks on the driver's own node (the staging directory is there, so no storage
    shared between nodes is needed), one task per file set, each holding one block's lines at a time: the
    driver only gets each file's row count and hash back, never the rows (its memory stays flat as rows
    grow). Connected through Ray Client (``ray://``) the driver is not a node, and writes them itself."""
    import ray
    from ray.util.client import ray as client
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    recipe = run.recipe
    check_output_dir(out, recipe)
    mode = file_mode()
    written = ["train", "dev", "heldout"] + (["test"] if recipe.split.test_fraction > 0 else [])
    with staged_directory(out, earlier_outputs(out)) as staging:
        jobs: list[tuple[Callable[..., dict[str, dict[str, Any]]], tuple[Any, ...]]] = [
            (write_split, (str(staging), name, recipe, run.split_rows[name], [run.splits_out[name]], mode))
            for name in written
        ]
        jobs.append((write_rejects, (str(staging), [run.rejects], mode)))
        jobs.append((write_near_pairs, (str(staging), recipe.ray.block_rows, run.near_ranges, mode)))
        table: dict[str, dict[str, Any]] = {}
        if client.is_connected():
            for function, args in jobs:
                table.update(function(*args))
        else:
            here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
            # num_cpus 0: a head node started with no CPUs for tasks still runs them
            refs = [
                ray.remote(function).options(num_cpus=0, scheduling_strategy=here).remote(*args)
                for function, args in jobs
            ]
            for entries in ray.get(refs):
                table.update(entries)
        atomic_write_text(staging / "recipe.yaml", dump_recipe(recipe))
        table["recipe.yaml"] = Writer.of_file(staging / "recipe.yaml")
        manifest["outputs"] = table  # in the local path's order: the splits, rejects, near pairs, recipe
        atomic_write_json(staging / MANIFEST, manifest)
