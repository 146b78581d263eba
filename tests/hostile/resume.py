"""Category resume-adapters, part 1: train --resume on wrong directories, changed settings, a damaged run.
adapters.py holds the damaged adapters, another base, and calibrating on training data."""

from __future__ import annotations

import json
import random
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from assets import Env, copy_tree, jsonl_text, record, unlock
from harness import SMOKE, Case, Expect, Probe, Run, cli, lost_files, run_proc, snapshot
from judge import (
    any_of,
    judge_cli,
    train_whole,
    warned,
)
from prepare_inputs import accept, refuse

REQUEST = {
    "state": "The checkout page fails for every customer.",
    "questions": {
        "down": {"type": "noul", "instructions": "Is a production system down?"},
        "team": {"type": "choice", "instructions": "Which team?", "criteria": ["billing", "engineering", "support"]},
    },
}


def predict_ok(where: Path, run: Run) -> str | None:
    text = run.output
    decoder = json.JSONDecoder()
    body: Any = None
    for at in (i for i, ch in enumerate(text) if ch == "{"):  # the response, wherever the progress lines end
        try:
            body = decoder.raw_decode(text, at)[0]
            break
        except ValueError:
            continue
    try:
        answers = body["answers"]
        assert 0 <= answers["down"]["noul"] <= 1
        assert abs(sum(answers["team"]["probabilities"].values()) - 1) < 1e-3
    except Exception as err:
        return f"no well-formed response: {type(err).__name__}"
    return None


def resume_probe(
    env: Env,
    cid: str,
    what: str,
    setup: Callable[[Env, Path], None],
    args: list[str],
    expect: Expect,
    owned: tuple[str, ...] = (),
    timeout: float = 120,
    subprocess_: bool = False,
) -> Probe:
    """``owned`` (the run directory) may change only when the command proceeds; a refusal must leave it as it was."""
    case = Case(
        f"res-{cid}", "resume-adapters", "mydecide " + " ".join(str(a) for a in args) + f"   # {what}", expect.text
    )

    def go(case: Case) -> None:
        env.need("models", "data", "run")
        where = env.case_dir(case.id)
        setup(env, where)
        before = snapshot(where)
        run = run_proc(args, where, timeout) if subprocess_ else cli(args, where, timeout)
        after = snapshot(where)
        extra = [p for p in after if p.endswith(".lock")]
        judge_cli(case, run, expect, where, lost_files(before, after, [*(owned if run.code == 0 else ()), *extra]))
        unlock(where)

    return Probe(case, go)


def res_setup(env: Env, where: Path) -> None:
    copy_tree(env.llama, where / "model")
    copy_tree(env.llama_b, where / "model_b")
    copy_tree(env.data, where / "data")
    copy_tree(env.run, where / "run")
    copy_tree(env.evaldata, where / "evaldata")
    shutil.copy(env.temps, where / "temps.json")
    (where / "request.json").write_text(json.dumps(REQUEST))
    (where / "empty").mkdir()
    (where / "notes").mkdir()
    (where / "notes" / "notes.txt").write_text("mine\n")
    rng = random.Random(21)
    other = where / "otherdata"
    other.mkdir()
    for name, n in (("train", 20), ("dev", 8)):
        (other / f"{name}.jsonl").write_text(
            jsonl_text(record(40000 + i + (0 if name == "train" else 100), rng) for i in range(n))
        )


def res_with(change: Callable[[Path], Any]) -> Callable[[Env, Path], None]:
    def setup(env: Env, where: Path) -> None:
        res_setup(env, where)
        change(where)

    return setup


def truncate(path: Path, keep: float = 0.5) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


def set_json(path: Path, **changes: Any) -> None:
    obj = json.loads(path.read_text())
    obj.update(changes)
    path.write_text(json.dumps(obj))


def resume_probes(env: Env) -> list[Probe]:
    """train --resume on wrong directories, with changed settings, on a damaged run."""
    # the copied run was trained on the assets' model and data (absolute paths in its recipe.yaml): the same here
    T = ["train", SMOKE, "--model", env.llama, "--data", env.data, "optim.max_steps=10"]
    P: list[Probe] = []

    def add(*a: Any, **kw: Any) -> None:
        P.append(resume_probe(env, *a, **kw))

    add(
        "resume-empty-dir",
        "--resume on an empty directory",
        res_setup,
        [*T, "--out", "empty", "--resume"],
        refuse("empty"),
    )
    add(
        "resume-missing-dir",
        "--resume on a mistyped run directory",
        res_setup,
        [*T, "--out", "rnu", "--resume"],
        refuse("rnu"),
    )
    add(
        "resume-data-dir",
        "--resume on the data directory",
        res_setup,
        [*T, "--out", "data", "--resume"],
        refuse("data"),
    )
    add(
        "resume-notes-dir",
        "--resume on a user's directory",
        res_setup,
        [*T, "--out", "notes", "--resume"],
        refuse("notes"),
    )
    add(
        "resume-adapter-dir",
        "--resume on run/adapter",
        res_setup,
        [*T, "--out", "run/adapter", "--resume"],
        refuse("adapter"),
    )
    add(
        "resume-changed-lr",
        "--resume with optim.lr changed",
        res_setup,
        [*T, "--out", "run", "--resume", "optim.lr=1e-3"],
        refuse("optim.lr"),
    )
    add(
        "resume-changed-data",
        "--resume with another --data",
        res_setup,
        ["train", SMOKE, "--model", env.llama, "--data", "otherdata", "optim.max_steps=10", "--out", "run", "--resume"],
        refuse("data"),
    )
    add(
        "resume-other-model",
        "--resume with another --model",
        res_setup,
        ["train", SMOKE, "--model", "model_b", "--data", env.data, "optim.max_steps=10", "--out", "run", "--resume"],
        refuse("model"),
    )
    more = ["--allow-change", "optim.max_steps", "optim.max_steps=12"]  # two more updates: a resume that has work to do
    damaged = Expect(
        "refused naming recipe.yaml, or resumed from the checkpoint's own recipe with a warning naming it",
        names=("recipe.yaml",),
        accept=any_of(lambda w, r: warned("recipe.yaml")(w, r) or train_whole(w / "run")),
    )
    add(
        "resume-no-recipe",
        "--resume (2 more updates) after deleting recipe.yaml",
        res_with(lambda w: (w / "run" / "recipe.yaml").unlink()),
        [*T, "--out", "run", "--resume", *more],
        damaged,
        owned=("run",),
    )
    add(
        "resume-broken-recipe",
        "--resume (2 more updates) with a broken recipe.yaml",
        res_with(lambda w: (w / "run" / "recipe.yaml").write_text("optim: [\n")),
        [*T, "--out", "run", "--resume", *more],
        damaged,
        owned=("run",),
    )
    add(
        "resume-recipe-list",
        "--resume (2 more updates) with recipe.yaml that is a YAML list",
        res_with(lambda w: (w / "run" / "recipe.yaml").write_text("- a\n- b\n")),
        [*T, "--out", "run", "--resume", *more],
        damaged,
        owned=("run",),
    )
    add(
        "resume-more-steps",
        "--resume with 2 more updates (control)",
        res_setup,
        [*T, "--out", "run", "--resume", *more],
        accept(lambda w, r: train_whole(w / "run"), "2 more updates; the run whole, metrics without repeats"),
        owned=("run",),
    )
    add(
        "resume-no-checkpoints",
        "--resume with checkpoints/ emptied",
        res_with(lambda w: [shutil.rmtree(p) for p in (w / "run" / "checkpoints").iterdir()]),
        [*T, "--out", "run", "--resume"],
        refuse("checkpoint"),
    )
    add(
        "resume-allow-change-lr",
        "--allow-change optim.lr (not a key that may change)",
        res_setup,
        [*T, "--out", "run", "--resume", "optim.lr=1e-3", "--allow-change", "optim.lr"],
        refuse("optim.lr"),
    )
    add(
        "resume-allow-change-typo",
        "--allow-change with an unknown key",
        res_setup,
        [*T, "--out", "run", "--resume", "--allow-change", "optim.max_stpes"],
        refuse("max_stpes"),
    )
    add(
        "resume-done-run",
        "--resume a run that already finished (nothing to do)",
        res_setup,
        [*T, "--out", "run", "--resume"],
        accept(
            lambda w, r: train_whole(w / "run"),
            "nothing to do, or a one-line refusal; the run stays whole",
            refuse_ok=True,
        ),
        owned=("run",),
    )
    add(
        "resume-truncated-newest",
        "--resume when the newest checkpoint is cut in half (the older one is readable)",
        res_with(
            lambda w: [truncate(p) for p in sorted((w / "run" / "checkpoints").iterdir())[-1].iterdir() if p.is_file()]
        ),
        [*T, "--out", "run", "--resume"],
        accept(
            lambda w, r: train_whole(w / "run"),
            "resumes from the older readable checkpoint (saying so)",
            refuse_ok=True,
        ),
        owned=("run",),
    )
    return P
