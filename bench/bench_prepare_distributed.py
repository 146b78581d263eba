"""Benchmark of `mydecide prepare` on Ray (local mode) beside the local path, same records, same run.

Run: ``.venv/bin/python bench/bench_prepare_distributed.py`` (``--records N``; ``--ray-only`` skips the local run,
for a scaling point too slow to run twice). The records are ``bench_prepare.py``'s (mixed lengths, 10% planted
near duplicates, 500 eval states to decontaminate against); the Ray run starts a local Ray with ``--workers``
CPUs. It reports records/s of both paths and their ratio, seconds per step, whether the two wrote the same files
(they must), and the peak resident memory of the driver and of each Ray worker process (sampled every 0.2 s).

Writes ``bench/results/prepare_distributed.json`` (``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil
from _common import RESULTS
from bench_prepare import synthetic

from mydecide.config import DataRecipe, RayEngineConfig
from mydecide.data.prepare import prepare


class PeakMemory:
    """Peak RSS of this process and of each Ray worker process (``ray::`` in its command line), sampled."""

    def __init__(self) -> None:
        self.driver = 0
        self.workers: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> PeakMemory:
        self._thread.start()
        return self

    def __exit__(self, *_: Any) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        me = psutil.Process(os.getpid())
        while not self._stop.wait(0.2):
            self.driver = max(self.driver, me.memory_info().rss)
            for proc in psutil.process_iter(["pid", "cmdline"]):
                try:
                    if any("ray::" in part for part in proc.info["cmdline"] or []):
                        rss = proc.memory_info().rss
                        self.workers[proc.pid] = max(self.workers.get(proc.pid, 0), rss)
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    continue


def run(recipe: DataRecipe, out: Path) -> tuple[dict[str, Any], float, PeakMemory]:
    with PeakMemory() as memory:
        start = time.perf_counter()
        manifest = prepare(recipe, out)
        seconds = time.perf_counter() - start
    return manifest, seconds, memory


def same_outputs(a: Path, b: Path) -> bool:
    names = sorted(p.name for p in a.glob("*.jsonl"))
    return names == sorted(p.name for p in b.glob("*.jsonl")) and all(
        (a / name).read_bytes() == (b / name).read_bytes() for name in names
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--workers", type=int, default=2, help="CPUs of the local Ray")
    parser.add_argument("--partitions", type=int, default=None, help="default: 2 per worker CPU")
    parser.add_argument("--ray-only", action="store_true", help="skip the local run (a scaling point)")
    parser.add_argument("--out", type=Path, default=RESULTS / "prepare_distributed.json")
    args = parser.parse_args()

    load_before = round(os.getloadavg()[0], 2)
    records, _planted = synthetic(args.records, 0.10)
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "records.jsonl"
        source.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
        del records
        eval_file = Path(tmp) / "eval.jsonl"
        eval_file.write_text(
            "".join(
                json.dumps({"id": f"e{i}", "state": json.loads(line)["state"]}) + "\n"
                for i, line in enumerate(source.read_text(encoding="utf-8").splitlines()[: 500 * 7 : 7])
            ),
            encoding="utf-8",
        )
        recipe = DataRecipe.model_validate(
            {
                "sources": [{"kind": "jsonl", "path": str(source)}],
                "decontaminate_against": [str(eval_file)],
                "dedup": {"near": {"threshold": 0.7, "num_perm": 128, "ngram": 5, "shingle": "char"}},
                "split": {"dev_fraction": 0.05, "seed": 13},
                "augment": {"anonymize_options": 0.1, "drop_distractors": 0.1},
            }
        )
        ray_settings = RayEngineConfig(num_workers=args.workers, partitions=args.partitions)
        on_ray = recipe.model_copy(update={"engine": "ray", "ray": ray_settings})
        ray_manifest, ray_s, ray_memory = run(on_ray, Path(tmp) / "ray")
        local_s = None
        same = None
        local_memory = None
        local_steps = None
        if not args.ray_only:
            local_manifest, local_s, local_memory = run(recipe, Path(tmp) / "local")
            same = same_outputs(Path(tmp) / "local", Path(tmp) / "ray")
            local_steps = {s["step"]: s["seconds"] for s in local_manifest["steps"]}

    mib = 1 << 20
    workers = sorted(ray_memory.workers.values(), reverse=True)
    result = {
        "records": args.records,
        "workers": args.workers,
        "partitions": args.partitions or 2 * args.workers,
        "ray_seconds": round(ray_s, 2),
        "ray_records_per_s": round(args.records / ray_s),
        # the steps alone (without starting and stopping the local Ray, and without writing the outputs)
        "ray_steps_seconds": round(sum(s["seconds"] for s in ray_manifest["steps"]), 2),
        "ray_step_seconds": {s["step"]: s["seconds"] for s in ray_manifest["steps"]},
        "local_seconds": None if local_s is None else round(local_s, 2),
        "local_records_per_s": None if local_s is None else round(args.records / local_s),
        "local_steps_seconds": None if local_steps is None else round(sum(local_steps.values()), 2),
        "local_step_seconds": local_steps,
        "ray_over_local_records_per_s": None if local_s is None else round(local_s / ray_s, 3),
        "same_outputs": same,
        "peak_rss_mib": {
            "ray_driver": round(ray_memory.driver / mib),
            "ray_workers": [round(w / mib) for w in workers[: args.workers + 2]],
            "local": None if local_memory is None else round(local_memory.driver / mib),
        },
        # the 1-minute load average at the start and the end: above the CPU count, other processes shared them
        "machine": {"cpus": len(os.sched_getaffinity(0)), "load_average": [load_before, round(os.getloadavg()[0], 2)]},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"prepare of {args.records} records, Ray local mode with {args.workers} worker CPUs:")
    print(f"  ray   {ray_s:8.1f} s  {result['ray_records_per_s']:>7} records/s  steps {result['ray_step_seconds']}")
    if local_s is not None:
        print(f"  local {local_s:8.1f} s  {result['local_records_per_s']:>7} records/s  steps {local_steps}")
        print(f"  ray / local records/s: {result['ray_over_local_records_per_s']:.2f}x  same outputs: {same}")
    print(f"  peak RSS MiB: {result['peak_rss_mib']}  load average {result['machine']['load_average']}")
    print(f"→ {args.out}")


if __name__ == "__main__":
    main()
