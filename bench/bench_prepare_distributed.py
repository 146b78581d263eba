"""Benchmark of `mydecide prepare` on Ray (local mode) and the local path on the same records.

Run: ``.venv/bin/python bench/bench_prepare_distributed.py`` (``--records N``; ``--workers 2 4`` runs the Ray path
once per worker count; ``--block-rows`` sets ``ray.block_rows``; ``--no-local`` skips the local path, which
otherwise runs too, and every run must have written its files). The records are ``bench_prepare.py``'s (mixed
lengths, 10% planted near duplicates, 500 eval states to decontaminate against).

Each run is its own process (``--child``), so the driver's peak memory is that of one run and not of the records
this script generates: the parent samples the run's resident memory, and that of every Ray worker process (``ray::``
in its command line), every 0.2 s, as RSS and as private memory (RSS less shared pages): a process's RSS counts the
object-store pages it has touched (zero-copy reads and writes of blocks), which are the store's, not its own. It
reports wall time (the process, Ray start and stop included), the steps' own seconds, rows/s, and the peaks.

Writes ``bench/results/prepare_distributed.json`` (``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil
from _common import RESULTS
from bench_prepare import synthetic

from mydecide.config import DataRecipe, RayEngineConfig

MIB = 1 << 20


class PeakMemory:
    """Peak RSS of one process and of each Ray worker process (``ray::`` in its command line), sampled."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.driver = 0
        self.driver_private = 0
        self.workers: dict[int, int] = {}
        self.workers_private: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> PeakMemory:
        self._thread.start()
        return self

    def __exit__(self, *_: Any) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        me = psutil.Process(self.pid)
        while not self._stop.wait(0.2):
            try:
                self.driver = max(self.driver, me.memory_info().rss)
                self.driver_private = max(self.driver_private, private(me))
            except psutil.NoSuchProcess:
                return
            for proc in psutil.process_iter(["pid", "cmdline"]):
                try:
                    if any("ray::" in part for part in proc.info["cmdline"] or []):
                        self.workers[proc.pid] = max(self.workers.get(proc.pid, 0), proc.memory_info().rss)
                        self.workers_private[proc.pid] = max(self.workers_private.get(proc.pid, 0), private(proc))
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    continue


def private(proc: psutil.Process) -> int:
    """Resident memory that is the process's own: RSS less its shared pages (files and the object store's shared
    memory, which every process that reads a block maps)."""
    info = proc.memory_info()
    return int(info.rss - getattr(info, "shared", 0))


def child(recipe_file: Path, out: Path, result: Path) -> None:
    """One prepare run in this process; its manifest's step seconds and its own wall time go to ``result``."""
    from mydecide.data.prepare import prepare

    recipe = DataRecipe.model_validate_json(recipe_file.read_text(encoding="utf-8"))
    start = time.perf_counter()
    manifest = prepare(recipe, out)
    seconds = time.perf_counter() - start
    steps = {s["step"]: s["seconds"] for s in manifest["steps"]}
    result.write_text(json.dumps({"seconds": seconds, "steps": steps}), encoding="utf-8")


def run(recipe: DataRecipe, out: Path, records: int) -> dict[str, Any]:
    """``recipe`` prepared into ``out`` by a child process, with its wall time and memory peaks."""
    recipe_file, result = out.with_suffix(".recipe.json"), out.with_suffix(".result.json")
    recipe_file.write_text(recipe.model_dump_json(), encoding="utf-8")
    command = [sys.executable, __file__, "--child", str(recipe_file), str(out), str(result)]
    start = time.perf_counter()
    process = subprocess.Popen(command)
    with PeakMemory(process.pid) as memory:
        code = process.wait()
    wall = time.perf_counter() - start
    if code != 0:
        raise SystemExit(f"the run into {out} failed ({code})")
    inner = json.loads(result.read_text(encoding="utf-8"))
    workers = sorted(memory.workers.values(), reverse=True)
    workers_private = sorted(memory.workers_private.values(), reverse=True)
    return {
        "wall_seconds": round(wall, 2),
        "prepare_seconds": round(inner["seconds"], 2),
        "rows_per_s": round(records / inner["seconds"]),
        "step_seconds": inner["steps"],
        "driver_peak_rss_mib": round(memory.driver / MIB),
        "worker_peak_rss_mib": round(workers[0] / MIB) if workers else None,
        "worker_processes": len(workers),
        "workers_peak_rss_mib": [round(w / MIB) for w in workers[:8]],
        # RSS less shared pages (object-store blocks mapped for zero-copy reads, files): what the process holds
        "driver_peak_private_mib": round(memory.driver_private / MIB),
        "worker_peak_private_mib": round(workers_private[0] / MIB) if workers_private else None,
    }


def same_outputs(a: Path, b: Path) -> bool:
    """Every output file but the manifest and recipe.yaml byte for byte."""

    def files(out: Path) -> dict[str, Path]:
        skip = ("manifest.json", "recipe.yaml")
        return {str(p.relative_to(out)): p for p in out.rglob("*") if p.is_file() and p.name not in skip}

    mine, theirs = files(a), files(b)
    return sorted(mine) == sorted(theirs) and all(mine[k].read_bytes() == theirs[k].read_bytes() for k in mine)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--workers", type=int, nargs="+", default=[2], help="CPUs of the local Ray, one run each")
    parser.add_argument("--block-rows", type=int, default=20_000, help="ray.block_rows: rows read per block")
    parser.add_argument("--partitions", type=int, default=None, help="ray.partitions; default: 2 per worker CPU")
    parser.add_argument(
        "--local", action=argparse.BooleanOptionalAction, default=True, help="also run the local path, compare files"
    )
    parser.add_argument(
        "--near", action=argparse.BooleanOptionalAction, default=True, help="near dedup on (off: every other step)"
    )
    parser.add_argument("--out", type=Path, default=RESULTS / "prepare_distributed.json")
    parser.add_argument("--child", nargs=3, type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(*args.child)
        return

    load_before = round(os.getloadavg()[0], 2)
    records, _planted = synthetic(args.records, 0.10)
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "records.jsonl"
        source.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
        eval_file = Path(tmp) / "eval.jsonl"
        evals = records[: 500 * 7 : 7]
        eval_file.write_text(
            "".join(json.dumps({"id": f"e{i}", "state": r["state"]}) + "\n" for i, r in enumerate(evals)),
            encoding="utf-8",
        )
        del records, evals
        recipe = DataRecipe.model_validate(
            {
                "sources": [{"kind": "jsonl", "path": str(source)}],
                "decontaminate_against": [str(eval_file)],
                "dedup": {
                    "near": {"enabled": args.near, "threshold": 0.7, "num_perm": 128, "ngram": 5, "shingle": "char"}
                },
                "split": {"dev_fraction": 0.05, "seed": 13},
                "augment": {"anonymize_options": 0.1, "drop_distractors": 0.1},
            }
        )
        outs = []
        for workers in args.workers:
            settings = RayEngineConfig(num_workers=workers, partitions=args.partitions, block_rows=args.block_rows)
            out = Path(tmp) / f"ray-{workers}"
            measured = run(recipe.model_copy(update={"engine": "ray", "ray": settings}), out, args.records)
            runs.append({"path": "ray", "workers": workers, **measured})
            outs.append(out)
            print(
                f"ray       {workers} workers: {measured['prepare_seconds']:8.1f} s  "
                f"{measured['rows_per_s']:>6} rows/s  driver {measured['driver_peak_rss_mib']} MiB  "
                f"worker {measured['worker_peak_rss_mib']} MiB; private: driver "
                f"{measured['driver_peak_private_mib']}, worker {measured['worker_peak_private_mib']} MiB",
                flush=True,
            )
        same = None
        if args.local:
            measured = run(recipe, Path(tmp) / "local", args.records)
            runs.append({"path": "local", "workers": 1, **measured})
            print(f"local              {measured['prepare_seconds']:8.1f} s  {measured['rows_per_s']:>6} rows/s")
            same = all(same_outputs(Path(tmp) / "local", out) for out in outs)
        elif len(outs) > 1:
            same = all(same_outputs(outs[0], out) for out in outs[1:])

    local_rate = next((r["rows_per_s"] for r in runs if r["path"] == "local"), None)
    result = {
        "records": args.records,
        # the first Ray run's rows/s over the local path's (make bench's headline)
        "ray_over_local_records_per_s": round(runs[0]["rows_per_s"] / local_rate, 3) if local_rate else None,
        "block_rows": args.block_rows,
        "partitions": args.partitions,
        "near_dedup": args.near,
        "runs": runs,
        # every run's files equal (the local run's when --local): all but manifest.json and recipe.yaml
        "same_outputs": same,
        # the 1-minute load average at the start and the end: above the CPU count, other processes shared them
        "machine": {"cpus": len(os.sched_getaffinity(0)), "load_average": [load_before, round(os.getloadavg()[0], 2)]},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"same outputs: {same}  load average {result['machine']['load_average']}  → {args.out}")


if __name__ == "__main__":
    main()
