"""Category interrupts: SIGINT / SIGTERM / SIGKILL of prepare, train, evaluate and calibrate at the start, at their
first output and mid-way, then the same command again (train: --resume)."""

from __future__ import annotations

import shutil
import signal
import time
from pathlib import Path
from typing import Any

from assets import Env, copy_tree
from harness import SMOKE, Case, Probe, Proc, Run, lost_files, snapshot
from judge import (
    error_line,
    evaluate_whole,
    file_ok,
    judge_runs,
    prepare_whole,
    temperatures_whole,
    train_whole,
)

SIGNALS = {"SIGINT": signal.SIGINT, "SIGTERM": signal.SIGTERM, "SIGKILL": signal.SIGKILL}


def interrupt_probe(env: Env, cmd: str, sig_name: str, point: str) -> Probe:
    """Start ``cmd`` as a subprocess, send the signal at ``point``, then run it again (train: --resume, and the plain
    command when there is nothing to resume)."""
    spec = INTERRUPTS[cmd]
    case = Case(
        f"int-{cmd}-{sig_name.lower()}-{point}",
        "interrupts",
        f"mydecide {' '.join(spec['args'])}; {sig_name} at {point}; rerun"
        + (" with --resume" if cmd == "train" else ""),
        f"{'exit 130, no traceback' if sig_name == 'SIGINT' else 'no traceback'}; whatever it left is whole; the rerun "
        "succeeds or refuses in one line; the outputs are whole; inputs unchanged",
    )

    def go(case: Case) -> None:
        env.need("models", "data", "run")
        where = env.case_dir(case.id)
        spec["setup"](env, where)
        before = snapshot(where)
        proc = Proc(spec["args"], where)
        if point == "start":
            reached = proc.wait_for("\x00never", 0.4) or True  # 0.4 s in: Python is still importing
        elif point == "first-output":
            reached = proc.wait_for(None, 120)
        elif spec.get("mid_file"):  # train: as soon as its first checkpoint is on disk
            deadline = time.monotonic() + 120
            while not (where / spec["mid_file"]).exists() and proc.popen.poll() is None and time.monotonic() < deadline:
                time.sleep(0.02)
            reached = (where / spec["mid_file"]).exists()
            time.sleep(spec["mid_after"])
        elif spec["mid"] is None:  # no line to wait for (prepare prints at the end): a fixed time in
            reached = not proc.wait_for("\x00never", spec["mid_after"])
        else:
            reached = proc.wait_for(spec["mid"], 120)
            time.sleep(spec["mid_after"])
        sent = proc.send(SIGNALS[sig_name])
        first = proc.finish(60)
        if not sent:
            case.notes.append("it had already ended when the signal was due")
        elif not reached:
            case.notes.append(f"the point '{point}' was not seen before the signal")
        flags: list[str] = []
        if sent and spec["done"] in first.output:
            case.notes.append("the interrupted run had finished its work before the signal landed")
        if sent and sig_name == "SIGINT":
            if first.code == 130 and "Traceback" not in first.output:
                case.notes.append("Ctrl-C: exit 130, no traceback")
            elif first.code == -signal.SIGINT and "Traceback" not in first.output:
                # killed by SIGINT itself: a shell reports that as 130 too, and nothing was printed
                case.notes.append("SIGINT: died of the signal (a shell shows 130), no traceback")
            elif first.code not in (0, 130):
                flags.append("traceback")
                case.notes.append(f"SIGINT: exit {first.code} instead of 130")
        problems: list[str] = []
        left = spec["whole"](where)
        if left is not None and spec["atomic"] and (where / spec["out"]).exists():
            problems.append(f"left by the interrupted run: {left}")
        runs = [("interrupted", first), ("rerun", Proc(spec["rerun"], where).finish(180))]
        if runs[-1][1].code == 2 and cmd == "train":  # nothing to resume: the plain command may start it again
            runs.append(("fresh", Proc(spec["args"], where).finish(180)))
            case.notes.append("--resume refused: " + error_line(runs[1][1])[:120])
        final_ok = runs[-1][1].code == 0
        if final_ok:
            problem = spec["whole"](where)
            if problem:
                problems.append(f"after the rerun: {problem}")
        changed = lost_files(before, snapshot(where), spec["owned"])
        judge_runs(case, runs, changed, problems, good="accepted-ok" if final_ok else "handled", extra_flags=flags)

    return Probe(case, go)


def _interrupt_setup_prepare(env: Env, where: Path) -> None:
    shutil.copy(env.big, where / "big.jsonl")
    (where / "big.yaml").write_text(
        "sources:\n  - {kind: jsonl, path: big.jsonl}\nsplit: {dev_fraction: 0.1, seed: 13}\n"
    )


def _interrupt_setup_model(env: Env, where: Path) -> None:
    copy_tree(env.llama, where / "model")
    copy_tree(env.data, where / "data")
    copy_tree(env.adapter, where / "adapter")
    copy_tree(env.evaldata, where / "evaldata")


TRAIN_ARGS = [
    "train",
    str(SMOKE),
    "--model",
    "model",
    "--data",
    "data",
    "--out",
    "run",
    "optim.max_steps=6",
    "eval_every=2",
    "save_every=2",
    "dev_limit=8",
]
EVAL_ARGS = [
    "evaluate",
    "--model",
    "model",
    "--adapter",
    "adapter",
    "--data",
    "evaldata/test.jsonl",
    "--out",
    "ev",
    "-q",
    "--no-base",
    "--permutations",
    "0",
    "--limit",
    "60",
]
CAL_ARGS = [
    "calibrate",
    "--model",
    "model",
    "--adapter",
    "adapter",
    "--data",
    "evaldata/dev.jsonl",
    "--out",
    "temps.json",
    "-q",
    "--limit",
    "70",
]
INTERRUPTS: dict[str, dict[str, Any]] = {
    "prepare": {
        "args": ["prepare", "big.yaml", "--out", "out"],
        "rerun": ["prepare", "big.yaml", "--out", "out"],
        "setup": _interrupt_setup_prepare,
        "mid": None,  # prepare prints only at the end: 'mid' is 2.5 s after the start
        "mid_after": 2.0,
        "out": "out",
        "atomic": True,
        "done": "wrote ",
        "owned": ["out", ".out.lock", ".out.staging-*"],
        "whole": lambda w: prepare_whole(w / "out"),
    },
    "train": {
        "args": TRAIN_ARGS,
        "rerun": [*TRAIN_ARGS, "--resume"],
        "setup": _interrupt_setup_model,
        "mid": None,
        "mid_file": "run/checkpoints/update-000002",  # 'mid': when the first checkpoint appears
        "mid_after": 0.05,
        "out": "run",
        "atomic": False,
        "done": "[train] done",
        "owned": ["run", ".run.lock"],
        "whole": lambda w: train_whole(w / "run"),
    },
    "evaluate": {
        "args": EVAL_ARGS,
        "rerun": EVAL_ARGS,
        "setup": _interrupt_setup_model,
        "mid": "loaded",
        "mid_after": 0.1,
        "out": "ev",
        "atomic": True,
        "done": "wrote ",
        "owned": ["ev", ".ev.lock", ".ev.staging-*"],
        "whole": lambda w: evaluate_whole(w / "ev", 60),
    },
    "calibrate": {
        "args": CAL_ARGS,
        "rerun": CAL_ARGS,
        "setup": _interrupt_setup_model,
        "mid": "loaded",
        "mid_after": 0.1,
        "out": "temps.json",
        "atomic": True,
        "done": "wrote ",
        "owned": ["temps.json", ".temps.json*"],
        "whole": lambda w: file_ok("temps.json", temperatures_whole)(w, Run(0, "", 0)),
    },
}


def interrupt_probes(env: Env) -> list[Probe]:
    P = []
    for cmd, points in (
        ("prepare", ("start", "mid", "first-output")),
        ("train", ("start", "first-output", "mid")),
        ("evaluate", ("start", "mid")),
        ("calibrate", ("start", "mid")),
    ):
        for sig_name in SIGNALS:
            for point in points:
                P.append(interrupt_probe(env, cmd, sig_name, point))
    return P
