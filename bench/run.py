"""Run every benchmark (`bench/bench_*.py`), each in its own process, and merge their results.

Each benchmark prints its own table of ratios against a baseline measured in the same run and writes
`bench/results/<name>.json` (committed); this script runs them in turn, prints a one-line summary per benchmark, and
writes everything to `bench/results.json`, a local file that is not committed (.gitignore). The dated snapshots worth
keeping go to docs/LOG.md, as an entry with the table and the commands that produced it.

    .venv/bin/python bench/run.py [NAME ...]      # e.g. `bench/run.py train serve`; default: all
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

from _common import BENCH, RESULTS, ROOT

HEADLINES = {  # benchmark → (key, label) of its headline ratio
    "prepare": ("speedup_vs_bulk", "near dedup speed-up vs datasketch MinHash.bulk"),
    "prepare_distributed": ("ray_over_local_records_per_s", "prepare rows/s, Ray (2 CPUs) / local"),
    "dedup": ("near_dup_recall_j70", "near-dup recall (char-5-gram Jaccard >= 0.7)"),
    "scoring": ("speedup", "shared-state speed-up"),
    "train": ("speedup", "bucketed+shared speed-up"),
    "train_command": ("speedup_seed_settings_default_forms", "seed train.py / mydecide train, its settings"),
    "serve": ("concurrent_throughput_ratio", "concurrent throughput ratio"),
    "many_options": ("time_ratio", "time per question, 77 options / 10"),
    "option_forms": ("time_ratio_k4", "per-option (default) / letters time, 4 options"),
    "calibration": ("shipped_over_per_option_excess_log_loss", "temperature fit: held-out excess log loss, new / old"),
}


def main() -> int:
    wanted = sys.argv[1:]
    scripts = sorted(BENCH.glob("bench_*.py"))
    if wanted:
        scripts = [s for s in scripts if s.stem.removeprefix("bench_") in wanted]
    merged: dict[str, object] = {}
    failed = []
    for script in scripts:
        name = script.stem.removeprefix("bench_")
        print(f"\n=== {name} ({script.relative_to(ROOT)}) ===", flush=True)
        started = time.perf_counter()
        result = subprocess.run([sys.executable, str(script)], cwd=ROOT)
        seconds = time.perf_counter() - started
        out = RESULTS / f"{name}.json"
        if result.returncode != 0 or not out.is_file():
            failed.append(name)
            print(f"{name}: FAILED (exit {result.returncode})", flush=True)
            continue
        data = json.loads(out.read_text())
        data["wall_seconds"] = round(seconds, 1)
        merged[name] = data
    (BENCH / "results.json").write_text(json.dumps(merged, indent=2) + "\n")
    print("\n=== summary ===")
    for name, data in merged.items():
        key, label = HEADLINES.get(name, ("", ""))
        value = data.get(key) if isinstance(data, dict) else None
        shown = f"{label}: {value:.3g}" if isinstance(value, (int, float)) else ""
        print(f"  {name:10s} {data['wall_seconds']:7.1f}s  {shown}")  # type: ignore[index]
    print(f"wrote {BENCH / 'results.json'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
