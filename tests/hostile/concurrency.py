"""Category concurrency: two (or three) commands into one output directory at once: one proceeds and the other
refuses naming the holder's pid, or both succeed one after the other; the outputs whole."""

from __future__ import annotations

import random
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from assets import Env, copy_tree, jsonl_text, record
from harness import SMOKE, Case, Probe, Proc, Run, lost_files, snapshot
from judge import (
    error_line,
    evaluate_whole,
    file_ok,
    judge_runs,
    merged_whole,
    prepare_whole,
    temperatures_whole,
    train_whole,
)


def concurrency_probe(
    env: Env,
    cid: str,
    what: str,
    setup: Callable[[Env, Path], None],
    commands: list[list[str]],
    whole: Callable[[Path], str | None],
    owned: list[str],
    stagger: float = 0.0,
    lock_expected: bool = True,
) -> Probe:
    case = Case(
        f"conc-{cid}",
        "concurrency",
        what + ": " + " & ".join("mydecide " + " ".join(c[:6]) + (" …" if len(c) > 6 else "") for c in commands),
        "one proceeds and the other refuses in one line naming the holder's pid (or both succeed one after the "
        "other); the outputs whole; inputs unchanged",
    )

    def go(case: Case) -> None:
        env.need("models", "data", "run")
        where = env.case_dir(case.id)
        setup(env, where)
        before = snapshot(where)
        procs = []
        for command in commands:
            procs.append(Proc(command, where))
            if stagger:
                time.sleep(stagger)
        runs = [(f"#{i + 1}", p.finish(240)) for i, p in enumerate(procs)]
        after = snapshot(where)
        problems = []
        extra: list[str] = []
        codes = [r.code for _, r in runs]
        if 0 not in codes:
            case.notes.append(f"none of them proceeded (exits {codes})")
            if all(c == 2 for c in codes):
                extra.append("refused-valid")
        else:
            problems.append(whole(where) or "")
        for label, run in runs:
            if run.code == 2 and lock_expected and "pid" not in error_line(run):
                case.notes.append(f"{label} refused without naming a pid: {error_line(run)[:120]}")
                if "busy" in error_line(run) or "in use" in error_line(run):
                    problems.append(f"{label}: busy refusal without the holder's pid")
        refused = sum(1 for c in codes if c == 2)
        case.notes.append(f"exits {codes}")
        judge_runs(
            case,
            runs,
            lost_files(before, after, owned),
            [p for p in problems if p],
            good="handled" if refused else "accepted-ok",
            extra_flags=extra,
        )

    return Probe(case, go)


def _conc_setup_prepare(env: Env, where: Path) -> None:
    rng = random.Random(11)
    (where / "big.jsonl").write_text(jsonl_text(record(20000 + i, rng) for i in range(4000)))
    (where / "big.yaml").write_text(
        "sources:\n  - {kind: jsonl, path: big.jsonl}\nsplit: {dev_fraction: 0.1, seed: 13}\n"
    )
    (where / "big2.yaml").write_text(
        "sources:\n  - {kind: jsonl, path: big.jsonl}\nsplit: {dev_fraction: 0.3, seed: 7}\n"
    )


def _conc_setup_model(env: Env, where: Path) -> None:
    copy_tree(env.llama, where / "model")
    copy_tree(env.data, where / "data")
    copy_tree(env.run, where / "run")
    copy_tree(env.evaldata, where / "evaldata")
    shutil.copy(env.rows, where / "rows.jsonl")
    (where / "data.yaml").write_text(
        "sources:\n  - {kind: jsonl, path: rows.jsonl}\nsplit: {dev_fraction: 0.3, seed: 5}\n"
    )


def concurrency_probes(env: Env) -> list[Probe]:
    """prepare into one --out: at once, staggered, other recipes, three at once."""
    P: list[Probe] = []
    prep = ["prepare", "big.yaml", "--out", "out"]
    prep_owned = ["out", ".out.lock", ".out.staging-*"]
    for i in range(5):
        P.append(
            concurrency_probe(
                env,
                f"prepare-pair-{i + 1}",
                "two prepare into one --out at once",
                _conc_setup_prepare,
                [prep, prep],
                lambda w: prepare_whole(w / "out"),
                prep_owned,
            )
        )
    for i, delay in enumerate((0.1, 0.3, 1.0, 2.0)):
        P.append(
            concurrency_probe(
                env,
                f"prepare-staggered-{i + 1}",
                f"two prepare into one --out, {delay} s apart",
                _conc_setup_prepare,
                [prep, prep],
                lambda w: prepare_whole(w / "out"),
                prep_owned,
                stagger=delay,
            )
        )
    P.append(
        concurrency_probe(
            env,
            "prepare-other-recipes",
            "two prepare with other recipes into one --out",
            _conc_setup_prepare,
            [prep, ["prepare", "big2.yaml", "--out", "out"]],
            lambda w: prepare_whole(w / "out"),
            prep_owned,
        )
    )
    for i in range(2):
        P.append(
            concurrency_probe(
                env,
                f"prepare-triple-{i + 1}",
                "three prepare into one --out at once",
                _conc_setup_prepare,
                [prep, prep, prep],
                lambda w: prepare_whole(w / "out"),
                prep_owned,
            )
        )
    return P


def concurrency_train_probes(env: Env) -> list[Probe]:
    """train --resume and fresh train into one run; evaluate into one --out."""
    P: list[Probe] = []
    # the run was trained on the assets' model and data (absolute paths, recorded in its recipe): resume with the same
    resume = [
        "train",
        str(SMOKE),
        "--model",
        str(env.llama),
        "--data",
        str(env.data),
        "optim.max_steps=12",
        "--out",
        "run",
        "--resume",
        "--allow-change",
        "optim.max_steps",
    ]
    for i in range(2):
        P.append(
            concurrency_probe(
                env,
                f"train-resume-pair-{i + 1}",
                "two train --resume on one run",
                _conc_setup_model,
                [resume, resume],
                lambda w: train_whole(w / "run"),
                ["run", ".run.lock"],
            )
        )
    fresh = [
        "train",
        str(SMOKE),
        "--model",
        "model",
        "--data",
        "data",
        "--out",
        "run2",
        "optim.max_steps=4",
        "dev_limit=8",
    ]
    P.append(
        concurrency_probe(
            env,
            "train-fresh-pair",
            "two fresh train into one new --out",
            _conc_setup_model,
            [fresh, fresh],
            lambda w: train_whole(w / "run2"),
            ["run2", ".run2.lock"],
        )
    )
    light = ["--no-base", "-q", "--permutations", "0", "--limit", "24"]
    ev = [
        "evaluate",
        "--model",
        "model",
        "--adapter",
        "run/adapter",
        "--data",
        "evaldata/dev.jsonl",
        "--out",
        "ev",
        *light,
    ]
    ev2 = [
        "evaluate",
        "--model",
        "model",
        "--adapter",
        "run/adapter",
        "--data",
        "evaldata/test.jsonl",
        "--out",
        "ev",
        *light,
    ]
    for i in range(1):
        P.append(
            concurrency_probe(
                env,
                f"evaluate-pair-{i + 1}",
                "two evaluate into one --out",
                _conc_setup_model,
                [ev, ev],
                lambda w: evaluate_whole(w / "ev", 24),
                ["ev", ".ev.lock", ".ev.staging-*"],
            )
        )
    P.append(
        concurrency_probe(
            env,
            "evaluate-other-data",
            "two evaluate of other files into one --out",
            _conc_setup_model,
            [ev, ev2],
            lambda w: evaluate_whole(w / "ev", 24),
            ["ev", ".ev.lock", ".ev.staging-*"],
        )
    )
    return P


def concurrency_other_probes(env: Env) -> list[Probe]:
    """calibrate into one file, prepare rewriting the data a train reads, merge into one --out."""
    P: list[Probe] = []
    cal = [
        "calibrate",
        "--model",
        "model",
        "--adapter",
        "run/adapter",
        "--data",
        "evaldata/dev.jsonl",
        "--out",
        "t.json",
        "-q",
        "--limit",
        "32",
    ]
    for i in range(1):
        P.append(
            concurrency_probe(
                env,
                f"calibrate-pair-{i + 1}",
                "two calibrate into one --out file",
                _conc_setup_model,
                [cal, cal],
                lambda w: file_ok("t.json", temperatures_whole)(w, Run(0, "", 0)),
                ["t.json", ".t.json*"],
                lock_expected=False,
            )
        )
    train_reading = [
        "train",
        str(SMOKE),
        "--model",
        "model",
        "--data",
        "data",
        "--out",
        "run3",
        "optim.max_steps=4",
        "eval_every=2",
        "dev_limit=8",
    ]
    rewrite = ["prepare", "data.yaml", "--out", "data"]
    for i, delay in enumerate((6.0,)):
        P.append(
            concurrency_probe(
                env,
                f"prepare-under-train-{i + 1}",
                f"prepare rewrites the data dir {delay:g} s into a train reading it",
                _conc_setup_model,
                [train_reading, rewrite],
                lambda w: train_whole(w / "run3") or prepare_whole(w / "data"),
                ["data", ".data.lock", ".data.staging-*", "run3", ".run3.lock"],
                stagger=delay,
            )
        )
    mg = ["merge", "--adapter", "run/adapter", "--model", "model", "--out", "merged"]
    P.append(
        concurrency_probe(
            env,
            "merge-pair",
            "two merge into one --out",
            _conc_setup_model,
            [mg, mg],
            lambda w: merged_whole(w / "merged"),
            ["merged", ".merged.lock", ".merged.*"],
        )
    )
    return P
