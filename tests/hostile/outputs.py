"""Category outputs: --out of prepare / calibrate / evaluate / merge / train pointed at inputs, the data / adapter /
model directories, '.', '..' and user files; every file but the command's own must stay byte-for-byte the same."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

from assets import Env, copy_tree, unlock
from harness import SMOKE, Case, Expect, Probe, cli, lost_files, new_files, snapshot
from judge import (
    evaluate_whole,
    file_ok,
    judge_cli,
    merged_whole,
    prepare_whole,
    temperatures_whole,
)
from prepare_inputs import accept, refuse


def workspace(env: Env, case_dir: Path) -> Path:
    """case_dir/w: a user's working directory with data, a model, a run, temperatures, an evaluation, their own
    notes, a symlink to the notes, a read-only directory and a file; case_dir itself (w's '..') holds a user file."""
    env.need("models", "data", "run")
    w = case_dir / "w"
    w.mkdir()
    (case_dir / "sibling-notes.txt").write_text("the user's file beside the working directory\n")
    shutil.copy(env.rows, w / "rows.jsonl")
    (w / "data.yaml").write_text(
        "sources:\n  - {kind: jsonl, path: rows.jsonl}\nsplit: {dev_fraction: 0.2, seed: 13}\nout: data\n"
    )
    (w / "src").mkdir()
    shutil.copy(env.rows, w / "src" / "rows.jsonl")
    (w / "src.yaml").write_text(
        "sources:\n  - {kind: jsonl, path: src/rows.jsonl}\nsplit: {dev_fraction: 0.2, seed: 13}\n"
    )
    copy_tree(env.data, w / "data")
    copy_tree(env.llama, w / "model")
    copy_tree(env.run, w / "run")
    shutil.copy(env.temps, w / "temps.json")
    copy_tree(env.ev, w / "ev")
    (w / "notes").mkdir()
    (w / "notes" / "notes.txt").write_text("my own notes, not written by mydecide\n")
    (w / "notes" / "photo.bin").write_bytes(os.urandom(2048))
    os.symlink("notes", w / "link_to_notes")
    (w / "ro").mkdir()
    (w / "ro" / "readme.txt").write_text("a read-only directory\n")
    os.chmod(w / "ro", 0o555)
    (w / "file.txt").write_text("a plain file of the user\n")
    return w


def output_probe(
    env: Env,
    cid: str,
    args: list[str],
    expect: Expect,
    owned: tuple[str, ...] = (),
    what: str = "",
    plant: Callable[[Path], None] | None = None,
) -> Probe:
    """Run ``args`` in the workspace ``w`` (after ``plant(w)`` adds the case's own files); every file under the case
    directory must stay unchanged but ``owned`` (relative to the case directory)."""
    case = Case(
        f"out-{cid}",
        "outputs",
        "(in w/) mydecide " + " ".join(map(str, args)) + (f"   # {what}" if what else ""),
        expect.text,
    )

    def go(case: Case) -> None:
        where = env.case_dir(case.id)
        w = workspace(env, where)
        if plant is not None:
            plant(w)
        before = snapshot(where)
        run = cli(args, w, timeout=180)
        after = snapshot(where)
        lock_or_stage = [f"{p}" for p in after if p.endswith(".lock") or ".staging-" in p or p.endswith(".tmp")]
        changed = lost_files(before, after, [*owned, *lock_or_stage])
        judge_cli(case, run, expect, w, changed)
        debris = new_files(before, after, owned)
        if debris:
            case.notes.append("left behind: " + ", ".join(debris[:5]))
        unlock(where)

    return Probe(case, go)


def output_probes(env: Env) -> list[Probe]:
    P: list[Probe] = []
    M = ["--model", "model"]
    A = ["--adapter", "run/adapter"]

    def add(
        cid: str,
        args: list[str],
        expect: Expect,
        owned: tuple[str, ...] = (),
        what: str = "",
        plant: Callable[[Path], None] | None = None,
    ) -> None:
        P.append(output_probe(env, cid, args, expect, owned, what, plant))

    def user_file(name: str) -> Callable[[Path], None]:
        def put(w: Path) -> None:
            (w / name).parent.mkdir(parents=True, exist_ok=True)
            (w / name).write_text("the user's own file\n")

        return put

    # prepare
    for cid, out, names in [
        ("prepare-own-input", "rows.jsonl", ("rows.jsonl",)),
        ("prepare-dot", ".", ()),
        ("prepare-dotdot", "..", ()),
        ("prepare-file", "file.txt", ("file.txt",)),
        ("prepare-data-file", "data/train.jsonl", ("train.jsonl",)),
        ("prepare-notes", "notes", ("notes",)),
        ("prepare-symlink-notes", "link_to_notes", ("notes",)),
        ("prepare-model", "model", ("model",)),
        ("prepare-run", "run", ("run",)),
        ("prepare-adapter", "run/adapter", ("adapter",)),
        ("prepare-readonly", "ro/out", ("ro",)),
    ]:
        add(cid, ["prepare", "data.yaml", "--out", out], refuse(*names))
    add(
        "prepare-src-dir",
        ["prepare", "src.yaml", "--out", "src"],
        refuse("src"),
        what="--out is the directory holding its input",
    )
    add(
        "prepare-over-data",
        ["prepare", "data.yaml", "--out", "data"],
        accept(lambda w, r: prepare_whole(w / "data"), "replaces its own earlier output, whole"),
        owned=("w/data",),
    )
    for cid, name, named in [  # issue 64: prepare's "this folder is mine" check goes all the way down
        ("prepare-user-test-dir", "data/test/mine.txt", "test"),
        ("prepare-user-train-notes", "data/train/NOTES.md", "train"),
        ("prepare-user-hidden-tmp", "data/.draft.tmp", ".draft.tmp"),
    ]:
        add(
            cid,
            ["prepare", "data.yaml", "--out", "data"],
            refuse(named),
            what=f"w/{name} planted",
            plant=user_file(name),
        )
    # calibrate
    cal = ["calibrate", *M, *A, "--data", "data/dev.jsonl", "-q", "--out"]
    for cid, out, names in [
        ("calibrate-own-input", "data/dev.jsonl", ("dev.jsonl",)),
        ("calibrate-data-dir", "data", ("data",)),
        ("calibrate-in-data-dir", "data/temperatures.json", ("data",)),
        ("calibrate-adapter-file", "run/adapter/adapter_config.json", ("adapter",)),
        ("calibrate-in-adapter", "run/adapter/temps.json", ("adapter",)),
        ("calibrate-model-config", "model/config.json", ("config.json",)),
        ("calibrate-user-file", "notes/notes.txt", ("notes.txt",)),
        ("calibrate-notes-dir", "notes", ("notes",)),
        ("calibrate-dot", ".", ()),
        ("calibrate-readonly", "ro/t.json", ("ro",)),
    ]:
        add(cid, [*cal, out], refuse(*names))
    add(
        "calibrate-symlink-out",
        [*cal, "link.json"],
        refuse("link.json"),
        what="link.json -> file.txt",
        plant=lambda w: os.symlink("file.txt", w / "link.json"),
    )
    add(
        "calibrate-over-own",
        [*cal, "temps.json"],
        accept(file_ok("temps.json", temperatures_whole), "replaces its own earlier temperatures.json"),
        owned=("w/temps.json",),
    )
    # evaluate
    ev = ["evaluate", *M, *A, "--data", "data/dev.jsonl", "--no-base", "--permutations", "0", "-q", "--out"]
    for cid, out, names in [
        ("evaluate-data-dir", "data", ("data",)),
        ("evaluate-input-file", "data/dev.jsonl", ("dev.jsonl",)),
        ("evaluate-adapter", "run/adapter", ("adapter",)),
        ("evaluate-run", "run", ("run",)),
        ("evaluate-model", "model", ("model",)),
        ("evaluate-dot", ".", ()),
        ("evaluate-dotdot", "..", ()),
        ("evaluate-notes", "notes", ("notes",)),
        ("evaluate-symlink-notes", "link_to_notes", ("notes",)),
        ("evaluate-file", "file.txt", ("file.txt",)),
        ("evaluate-readonly", "ro/ev", ("ro",)),
    ]:
        add(cid, [*ev, out], refuse(*names))
    add(
        "evaluate-over-own",
        [*ev, "ev"],
        accept(lambda w, r: evaluate_whole(w / "ev"), "replaces its own earlier evaluation, whole"),
        owned=("w/ev",),
    )
    # merge
    mg = ["merge", *A, *M, "--out"]
    for cid, out, names in [
        ("merge-adapter", "run/adapter", ("adapter",)),
        ("merge-run", "run", ("run",)),
        ("merge-model", "model", ("model",)),
        ("merge-data", "data", ("data",)),
        ("merge-dot", ".", ()),
        ("merge-dotdot", "..", ()),
        ("merge-notes", "notes", ("notes",)),
        ("merge-symlink-notes", "link_to_notes", ("notes",)),
        ("merge-file", "file.txt", ("file.txt",)),
        ("merge-readonly", "ro/m", ("ro",)),
    ]:
        add(cid, [*mg, out], refuse(*names))
    add(
        "merge-overwrite-notes",
        [*mg, "notes", "--overwrite"],
        refuse("notes"),
        what="--overwrite onto a user's directory",
    )
    add(
        "merge-new",
        [*mg, "merged"],
        accept(lambda w, r: merged_whole(w / "merged"), "a new merged model directory"),
        owned=("w/merged",),
    )
    add(
        "export-vllm-other-adapter",
        ["export-vllm", *A, "--out", "other_adapter", "--overwrite"],
        refuse("other_adapter"),
        what="--out is a copy of another adapter (issue 64)",
        plant=lambda w: shutil.copytree(w / "run" / "adapter", w / "other_adapter"),
    )
    # train
    tr = ["train", SMOKE, *M, "--data", "data", "optim.max_steps=2", "--out"]
    for cid, out, names in [
        ("train-data", "data", ("data",)),
        ("train-model", "model", ("model",)),
        ("train-adapter", "run/adapter", ("adapter",)),
        ("train-existing-run", "run", ("run",)),
        ("train-notes", "notes", ("notes",)),
        ("train-symlink-notes", "link_to_notes", ("notes",)),
        ("train-dot", ".", ()),
        ("train-dotdot", "..", ()),
        ("train-file", "file.txt", ("file.txt",)),
        ("train-readonly", "ro/run", ("ro",)),
    ]:
        add(cid, [*tr, out], refuse(*names))
    # issue 64: the lock beside --out was opened O_RDWR | O_CREAT, which follows a link: the file it points to was
    # truncated to "mydecide prepare, pid N"
    for cid, args, out in [
        ("lock-link-prepare", ["prepare", "data.yaml", "--out", "fresh"], "fresh"),
        ("lock-link-train", [*tr, "fresh"], "fresh"),
        ("lock-link-evaluate", [*ev, "fresh"], "fresh"),
        ("lock-link-merge", [*mg, "fresh"], "fresh"),
    ]:
        add(
            cid,
            args,
            refuse(f".{out}.lock", "link"),
            what=f"w/.{out}.lock is a symlink to notes/notes.txt",
            plant=lambda w, name=out: os.symlink("notes/notes.txt", w / f".{name}.lock"),
        )
    return P
