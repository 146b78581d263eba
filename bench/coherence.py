"""JevBench's coherence suite against `mydecide serve`: the dimension and group table of one model.

Starts ``mydecide serve`` on a free loopback port with the given base model, adapter and temperatures, waits for
``/health``, runs the pinned ``jevbench eval`` (requirements.lock) against its ``/v1/systemone`` and stops the server.
JevBench rewrites the questions of its cases (never the state) and checks 50 laws in 5 dimensions: REP
(representation), BAT (batch independence), MEA (probability measure), LOG (logical), CHO (choice set). A dimension or
group with no scored trial shows as "-".

    make bench-coherence ADAPTER=RUN/train/adapter TEMPERATURES=RUN/temperatures.json      # jevbench-mini
    .venv/bin/python bench/coherence.py --adapter RUN/train/adapter -t RUN/temperatures.json \\
        [--groups REP.type,MEA.complement] [--suite jevbench-240] [--name demo]

Without ``--adapter`` the base model is measured. The whole jevbench-mini suite (1,248 requests) took about 33 min
on 2 CPU cores with the 135M default. Writes bench/results/<name>.json (jevbench's report, the settings and the
seconds; the trials' own outcomes are left out) and bench/results/<name>.md (the table).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import RESULTS, ROOT, free_port, wait_healthy

from mydecide.io import atomic_write_text

DIMENSIONS = ("REP", "BAT", "MEA", "LOG", "CHO")


def serve_command(args: argparse.Namespace, port: int) -> list[str]:
    cmd = [sys.executable, "-m", "mydecide.cli", "serve", "--model", args.model, "--port", str(port)]
    cmd += ["--name", args.name, "--log-level", "warning", "--max-pending", "256"]
    if args.adapter:
        cmd += ["--adapter", args.adapter]
    if args.temperatures:
        cmd += ["--temperatures", args.temperatures]
    return cmd


def jevbench_command(args: argparse.Namespace, port: int, report: Path) -> list[str]:
    jevbench = args.jevbench or str(Path(sys.executable).with_name("jevbench"))
    cmd = [jevbench, "eval", "--url", f"http://127.0.0.1:{port}/v1/systemone", "--model", args.name]
    cmd += ["--suite", args.suite, "--concurrency", str(args.concurrency), "--name", args.name]
    cmd += ["--seed", str(args.seed), "--no-cache", "--out", str(report)]
    for flag in ("groups", "dimensions"):
        if getattr(args, flag):
            cmd += [f"--{flag}", getattr(args, flag)]
    return cmd


def table(report: dict[str, Any], name: str) -> str:
    """The dimension and group table of one jevbench report (scores 0–100)."""
    scores = report["scores"]

    def pct(value: float | None) -> str:
        return "-" if value is None else f"{100 * value:.1f}"

    lines = [
        f"JevBench coherence of {name} ({scores.get('n_cases', '?')} cases, tolerance {scores.get('tolerance')})",
        "",
        "| dimension / group | score |",
        "|---|---|",
        f"| **overall** | **{pct(scores.get('overall'))}** |",
    ]
    for dim in DIMENSIONS:
        lines.append(f"| **{dim}** | **{pct(scores['pillars'].get(dim))}** |")
        for group, value in scores["groups"].items():
            if group.startswith(dim + "."):
                lines.append(f"| {group} | {pct(value)} |")
    return "\n".join(lines) + "\n"


def run(args: argparse.Namespace) -> dict[str, Any]:
    port = free_port()
    env = os.environ | {"PYTHONPATH": str(ROOT)}
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "serve.log"
        report_path = Path(tmp) / "report.json"
        with log.open("w") as out:
            server = subprocess.Popen(serve_command(args, port), stdout=out, stderr=subprocess.STDOUT, env=env)
        try:
            wait_healthy(f"http://127.0.0.1:{port}/health", server, args.start_timeout, "mydecide serve")
            started = time.monotonic()
            subprocess.run(jevbench_command(args, port, report_path), check=True)
            seconds = time.monotonic() - started
        except (RuntimeError, subprocess.CalledProcessError) as exc:
            tail = log.read_text(errors="replace")[-2000:]
            raise SystemExit(f"coherence bench failed: {exc}\n--- serve log (tail) ---\n{tail}") from None
        finally:
            server.terminate()
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                server.kill()
        report = json.loads(report_path.read_text(encoding="utf-8"))
        report.pop("result", None)  # every trial's outcome (MBs); the scores, checks and settings stay
    settings = {k: getattr(args, k) for k in ("model", "adapter", "temperatures", "suite", "groups", "dimensions")}
    return {"settings": settings | {"concurrency": args.concurrency, "seed": args.seed}, "seconds": seconds} | {
        "jevbench": report
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m", help="the base model (default: the embedded smollm2-135m)")
    ap.add_argument("--adapter", default=None, help="RUN/train/adapter; none: the base model")
    ap.add_argument("-t", "--temperatures", default=None, help="temperatures.json from mydecide calibrate")
    ap.add_argument("--suite", default="jevbench-mini")
    ap.add_argument("--groups", default=None, help="only these groups, e.g. REP.type,MEA.complement")
    ap.add_argument("--dimensions", default=None, help="only these dimensions, e.g. MEA,REP")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--name", default="coherence", help="the model's name in the report and the results' file name")
    ap.add_argument("--jevbench", default=None, help="the jevbench executable (default: beside this Python)")
    ap.add_argument("--start-timeout", type=float, default=600.0)
    ap.add_argument("--results", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    result = run(args)
    args.results.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.results / f"{args.name}.json", json.dumps(result, indent=2) + "\n")
    text = table(result["jevbench"], args.name)
    atomic_write_text(
        args.results / f"{args.name}.md",
        text + f"\n{result['seconds']:.0f} s; settings: {json.dumps(result['settings'])}\n",
    )
    print(text, end="")


if __name__ == "__main__":
    main()
