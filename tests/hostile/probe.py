"""A hostile-and-clumsy-user probe of the whole `mydecide` command line and server (≥ 250 cases).

What it does
    Builds a tiny tokenizer and two tiny Llama models (tests/conftest.py's builders, loaded from their path), trains
    ONE tiny LoRA adapter (recipes/train/smoke.yaml, 10 updates) and calibrates it once, then throws bad, clumsy and
    malicious input at every command, and classes each case by what actually happened, never by hand:

        prepare-inputs   malformed data recipes, sources and rows
        outputs          --out of prepare / calibrate / evaluate / merge / train pointed at inputs and user files
        interrupts       SIGINT / SIGTERM / SIGKILL of a running command, then the same command again
        concurrency      two (or three) commands into one output directory at once
        resume-adapters  train --resume on wrong directories, damaged adapters, another base, calibrating on train
        serve            hostile HTTP requests to `mydecide serve` on loopback, and bad `serve` limits

    Outcome classes (computed in judge.py: `judge_cli` / `judge_http` / `judge_runs`):
        handled        a refusal: exit 2 with exactly one `error:` line (`[mydecide] warning:` lines allowed, nothing
                       after the error line), naming what the case says it must name, no Traceback, and every user
                       file byte-for-byte unchanged (tree sha256 before and after; the command's own outputs
                       excluded per case). Server: a 4xx whose body is {"error": ...} and at most 2 kB.
        accepted-ok    valid or tolerable input processed: exit 0 / 2xx, and the case's check of the output passes
        traceback      a Traceback in the output, or an exit status other than 0 / 2 / 130 (killed by our own
                       SIGTERM / SIGKILL excepted); a Traceback in the server log during a request
        data-lost      a user file changed or deleted that the command does not own
        5xx            a 5xx answer, or the server closing a connection without any answer
        hang           no end within the case's timeout (60 s CLI, 10 s per request, slow-drip: 40 s)
        silent         exit 0 / 2xx on input that should have been refused, rejected or warned about
        multi-line     refused (exit 2 / 4xx) but with no `error:` line, several, lines after it, an error line over
                       1,000 characters, or (server) an error body over 2 kB
      and three classes the brief's list has no room for:
        vague          refused with one clean line that does not name the key / file / path concerned
        refused-valid  refused cleanly where the documented behaviour is to go on (valid input, or a bad row
                       that belongs in rejects.jsonl)
        broken-output  valid input, exit 0, but the outputs are not whole (a manifest sha256 that does not match,
                       an adapter that does not load, duplicated update numbers in metrics.jsonl, …)
    A case can meet several classes (all are kept in `flags`); its outcome is the worst, in the order above from
    `hang`. `probe-error` means the probe itself failed on that case (a bug here, not in mydecide).

How to run (from the repository root, offline, loopback only, everything under one temporary directory):
        make probe                                                  # everything, about 22 min on 2 cores
        .venv/bin/python tests/hostile/probe.py --only serve        # one category (comma-separated for several)
        .venv/bin/python tests/hostile/probe.py --list              # the categories and every case id
        .venv/bin/python tests/hostile/probe.py --out /tmp/p.json   # results elsewhere
        .venv/bin/python tests/hostile/probe.py --keep              # keep the temporary directory to look at
    Results go to tests/hostile/results.json, the committed reference table (every case: id, category, what was
    done, expected, outcome, flags, exit code or HTTP status, response size, seconds, first 300 characters of
    output, notes). `pytest` collects nothing here: no module in tests/hostile/ is named test_*.

    Run as root, permission cases (chmod 000, read-only directories) would mean nothing: the script then re-executes
    itself under `setpriv --bounding-set=-dac_override,-dac_read_search` (root without the capabilities that
    bypass file permissions).

In-process commands run through typer's CliRunner (fast); signals, concurrency and the server use subprocesses
(`python -m mydecide.cli`). Only processes this script started are ever signalled, by pid.

The modules: harness.py (the case record, running commands, file snapshots), judge.py (the classes and the output
checks), assets.py (the temporary directory and its shared assets), wire.py (raw HTTP); then one module per category,
with three for prepare-inputs (prepare_inputs, prepare_sources, prepare_rows), three for resume-adapters (resume,
adapters, model_inputs) and three for serve (serve, serve_fields, serve_connections). This file runs them.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

from adapters import adapter_probes, calibration_probes
from assets import Env, unlock
from concurrency import concurrency_other_probes, concurrency_probes, concurrency_train_probes
from harness import CATEGORIES, CLASSES, ROOT, Case, Probe
from interrupts import interrupt_probes
from judge import nonempty_lines
from model_inputs import model_input_probes
from outputs import output_probes
from prepare_inputs import recipe_key_probes, recipe_probes
from prepare_rows import row_probes, row_shape_probes
from prepare_sources import csv_probes, source_probes
from resume import resume_probes
from serve import header_probes, request_probes
from serve_connections import connection_probes, serving
from serve_fields import field_probes, json_probes

DEFAULT_OUT = Path(__file__).resolve().parent / "results.json"


def prepare_input_probes(env: Env) -> list[Probe]:
    return [
        *recipe_probes(env),
        *recipe_key_probes(env),
        *source_probes(env),
        *csv_probes(env),
        *row_probes(env),
        *row_shape_probes(env),
    ]


def all_concurrency_probes(env: Env) -> list[Probe]:
    return concurrency_probes(env) + concurrency_train_probes(env) + concurrency_other_probes(env)


def resume_adapter_probes(env: Env) -> list[Probe]:
    return resume_probes(env) + adapter_probes(env) + calibration_probes(env) + model_input_probes(env)


def serve_probes(env: Env) -> list[Probe]:
    return request_probes(env) + header_probes(env) + json_probes(env) + field_probes(env) + connection_probes(env)


BUILDERS: dict[str, tuple[Callable[[Env], list[Probe]], Callable[[Env], contextlib.AbstractContextManager] | None]] = {
    "prepare-inputs": (prepare_input_probes, None),
    "outputs": (output_probes, None),
    "interrupts": (interrupt_probes, None),
    "concurrency": (all_concurrency_probes, None),
    "resume-adapters": (resume_adapter_probes, None),
    "serve": (serve_probes, serving),
}


def run_category(env: Env, name: str, probes: list[Probe]) -> None:
    _builder, context = BUILDERS[name]
    print(f"\n== {name}: {len(probes)} cases — {CATEGORIES[name]}", flush=True)
    started = time.monotonic()
    with context(env) if context else contextlib.nullcontext():
        for probe in probes:
            case = probe.case
            t0 = time.monotonic()
            try:
                probe.run(case)
            except Exception as err:
                case.finish(["probe-error"], "probe-error")
                case.notes.append(f"{type(err).__name__}: {err}")
                case.output = traceback.format_exc()[-300:]
            if not case.seconds:
                case.seconds = round(time.monotonic() - t0, 2)
            mark = " " if case.outcome in ("handled", "accepted-ok") else "!"
            print(
                f"  {mark} {case.outcome:<14} {case.id:<40} {time.monotonic() - t0:6.1f}s"
                + (f"  {case.notes[0][:90]}" if case.notes and mark == "!" else ""),
                flush=True,
            )
    print(f"   ({time.monotonic() - started:.0f}s)", flush=True)


def table(cases: list[Case]) -> str:
    present = [c for c in CLASSES if c != "probe-error" or any(x.outcome == c for x in cases)]
    head = ["category", *present, "total"]
    rows = []
    for category in CATEGORIES:
        mine = [c for c in cases if c.category == category]
        if mine:
            rows.append([category, *[str(sum(c.outcome == k for c in mine)) for k in present], str(len(mine))])
    rows.append(["total", *[str(sum(c.outcome == k for c in cases)) for k in present], str(len(cases))])
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]

    def line(r):
        return (
            "| "
            + " | ".join(x.ljust(w) if i == 0 else x.rjust(w) for i, (x, w) in enumerate(zip(r, widths, strict=False)))
            + " |"
        )

    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(head), sep, *map(line, rows)])


def drop_privileges_if_root() -> None:
    """As root, chmod 000 and read-only directories mean nothing: re-run without the capabilities that bypass them."""
    if os.geteuid() != 0 or os.environ.get("MYDECIDE_PROBE_UNPRIVILEGED"):
        return
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        print("[setup] running as root without setpriv: the permission cases do not test anything", flush=True)
        return
    os.environ["MYDECIDE_PROBE_UNPRIVILEGED"] = "1"
    os.execv(setpriv, [setpriv, "--bounding-set=-dac_override,-dac_read_search", "--", sys.executable, *sys.argv])


def main() -> int:
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        # started with `&` by a shell without job control: SIGINT is ignored here and, through exec, in every command
        # the probe starts, so no interrupt case would test anything; a handled signal is reset to the default there
        signal.signal(signal.SIGINT, signal.default_int_handler)
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--only", help="comma-separated categories (or case-id prefixes) to run: " + ", ".join(CATEGORIES)
    )
    parser.add_argument(
        "--out", default=str(DEFAULT_OUT), help=f"results JSON (default {DEFAULT_OUT.relative_to(ROOT)})"
    )
    parser.add_argument("--list", action="store_true", help="list the categories and their case ids, and exit")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    options = parser.parse_args()

    wanted = [w.strip() for w in (options.only or "").split(",") if w.strip()]
    unknown = [
        w
        for w in wanted
        if w not in CATEGORIES and not any(w.startswith(p) for p in ("prep-", "out-", "int-", "conc-", "res-", "srv-"))
    ]
    if unknown:
        parser.error(f"--only: unknown {unknown}; the categories are {', '.join(CATEGORIES)} (or a case-id prefix)")

    if options.list:
        env = Env(Path("/nonexistent"))
        total = 0
        for name, (builder, _) in BUILDERS.items():
            probes = builder(env)
            total += len(probes)
            print(f"{name} ({len(probes)}): {CATEGORIES[name]}")
            for probe in probes:
                print(f"  {probe.case.id:<42} {probe.case.did[:110]}")
        print(f"total {total}")
        return 0

    drop_privileges_if_root()
    root = Path(tempfile.mkdtemp(prefix="mydecide-probe-"))
    for name, folder in (
        ("MYDECIDE_CACHE", "cache/mydecide"),
        ("HF_HOME", "cache/hf"),
        ("XDG_CACHE_HOME", "cache/xdg"),
    ):
        (root / folder).mkdir(parents=True)
        os.environ[name] = str(root / folder)
    os.environ.update(
        {
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "HF_DATASETS_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false",
            "CUDA_VISIBLE_DEVICES": "",
            "MPLBACKEND": "Agg",
            "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
        }
    )
    os.chdir(root)
    env = Env(root)
    print(f"[setup] working under {root}", flush=True)
    started = time.monotonic()
    cases: list[Case] = []
    try:
        for name, (builder, _) in BUILDERS.items():
            probes = builder(env)
            if wanted and name not in wanted:
                probes = [p for p in probes if any(p.case.id.startswith(w) for w in wanted)]
            if not probes:
                continue
            cases.extend(p.case for p in probes)
            try:
                run_category(env, name, probes)
            except Exception as err:
                for probe in probes:
                    if probe.case.outcome == "not-run":
                        probe.case.finish(["probe-error"], "probe-error")
                        probe.case.notes.append(f"category setup failed: {type(err).__name__}: {err}"[:500])
                print(f"   category {name} failed: {err!r}", flush=True)
                traceback.print_exc()
    finally:
        os.chdir(ROOT)
        if options.keep:
            print(f"[setup] kept {root}")
        else:
            unlock(root)
            shutil.rmtree(root, ignore_errors=True)
    elapsed = time.monotonic() - started

    print("\n" + table(cases))
    flagged = [c for c in cases if c.outcome not in ("handled", "accepted-ok")]
    if flagged:
        print(f"\n{len(flagged)} case(s) not handled / accepted-ok:")
        for c in flagged:
            print(f"\n[{c.outcome}] {c.id}  (exit/status {c.code}; flags {', '.join(c.flags)})\n    did: {c.did[:240]}")
            print(f"    expected: {c.expected}")
            for note in c.notes[:4]:
                print(f"    note: {note[:300]}")
            first = " / ".join(nonempty_lines(c.output)[:3])[:300]
            if first:
                print(f"    output: {first}")
    print(f"\n{len(cases)} cases in {elapsed / 60:.1f} min")

    out = Path(options.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    results = {
        "format": "mydecide.probe_hostile/1",
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "seconds": round(elapsed, 1),
        "git_commit": _git_commit(),
        "unprivileged": bool(os.environ.get("MYDECIDE_PROBE_UNPRIVILEGED")) or os.geteuid() != 0,
        "setup": env.setup_log,
        "classes": CLASSES,
        "summary": {
            cat: {k: sum(c.outcome == k for c in cases if c.category == cat) for k in CLASSES}
            for cat in CATEGORIES
            if any(c.category == cat for c in cases)
        },
        "total": {k: sum(c.outcome == k for c in cases) for k in CLASSES} | {"cases": len(cases)},
        "cases": [asdict(c) for c in cases],
    }
    out.write_text(json.dumps(results, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {out}")
    return 0


def _git_commit() -> str | None:
    try:
        return (
            subprocess.run(
                ["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10
            ).stdout.strip()
            or None
        )
    except OSError:
        return None


if __name__ == "__main__":
    sys.exit(main())
