"""Category prepare-inputs, part 1: how a prepare case runs, what it may expect, and the recipe's own cases (the
file, its keys, limits, split fractions, caps, overrides). prepare_sources.py and prepare_rows.py hold the rest."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

from assets import Env, jsonl_text, record, unlock
from harness import CLI_TIMEOUT, Case, Expect, Probe, Run, cli, lost_files, new_files, run_proc, snapshot
from judge import (
    judge_cli,
    kept_all,
    rejected_line,
    warned,
)

BASE = "sources:\n  - {kind: jsonl, path: rows.jsonl}\nsplit: {dev_fraction: 0.2, seed: 13}\n"
N_GOOD = 10
BAD = N_GOOD + 1  # the line number of the bad row appended after the good ones


def good_rows(n: int = N_GOOD, start: int = 0, seed: int = 1) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    return [record(start + i, rng) for i in range(n)]


def with_bad(*lines: Any) -> bytes:
    """The good rows, then ``lines`` (dicts are dumped, str / bytes written as they are)."""
    out = jsonl_text(good_rows()).encode()
    for line in lines:
        out += line if isinstance(line, bytes) else (line if isinstance(line, str) else json.dumps(line)).encode()
        out += b"\n"
    return out


def bad_record(**changes: Any) -> dict[str, Any]:
    row = record(999, random.Random(999), kind="choice")
    for key, value in changes.items():
        if value is DROP:
            row.pop(key, None)
        else:
            row[key] = value
    return row


DROP = object()


def refuse(*names: str, text: str = "") -> Expect:
    return Expect(text or f"refused with one line naming {', '.join(names) or 'the problem'}", names=names)


def reject(line: int = BAD, *words: str, file: str = "rows.jsonl", also_refuse: bool = False) -> Expect:
    return Expect(
        f"{file}:{line} in rejects.jsonl{' (' + ', '.join(words) + ')' if words else ''}, the other rows kept",
        refuse=also_refuse,
        accept=rejected_line(line, *words, file=file),
    )


def accept(
    check: Callable[[Path, Run], str | None], text: str, *, refuse_ok: bool = False, names: tuple[str, ...] = ()
) -> Expect:
    return Expect(text, refuse=refuse_ok, accept=check, bad_input=False, names=names)


def prepare_probe(
    env: Env,
    cid: str,
    what: str,
    expect: Expect,
    *,
    recipe: str | None = BASE,
    rows: bytes | None = None,
    files: dict[str, bytes | str] | None = None,
    setup: Callable[[Path], None] | None = None,
    extra: tuple[str, ...] = (),
    recipe_name: str = "recipe.yaml",
    subprocess_: bool = False,
    timeout: float = CLI_TIMEOUT,
) -> Probe:
    args = ["prepare", recipe_name, "--out", "out", *extra]
    case = Case(f"prep-{cid}", "prepare-inputs", "mydecide " + " ".join(args) + f"   # {what}", expect.text)

    def go(case: Case) -> None:
        where = env.case_dir(case.id)
        if recipe is not None:
            (where / recipe_name).write_text(recipe)
        (where / "rows.jsonl").write_bytes(rows if rows is not None else jsonl_text(good_rows()).encode())
        for name, content in (files or {}).items():
            path = where / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(content.encode() if isinstance(content, str) else content)
        if setup is not None:
            setup(where)
        before = snapshot(where)
        if subprocess_:
            run = run_proc(args, where, timeout=timeout, memory_gb=3)
        else:
            run = cli(args, where, timeout=timeout)
        owned = ["out", ".out.lock", ".out.staging-*"]
        after = snapshot(where)
        judge_cli(case, run, expect, where, lost_files(before, after, owned))
        debris = new_files(before, after, ["out"])
        if debris:
            case.notes.append("left behind: " + ", ".join(debris[:5]))
        unlock(where)

    return Probe(case, go)


def recipe_source(line: str, rest: str = "split: {dev_fraction: 0.2, seed: 13}\n") -> str:
    return f"sources:\n  - {line}\n{rest}"


def recipe_probes(env: Env) -> list[Probe]:
    """The recipe file, unknown keys, source limits, split fractions and caps."""
    P: list[Probe] = []

    def add(cid: str, what: str, expect: Expect, **kw: Any) -> None:
        P.append(prepare_probe(env, cid, what, expect, **kw))

    ok10 = kept_all(N_GOOD)
    # ---- the recipe itself
    add("recipe-missing", "recipe file does not exist", refuse("recipe.yaml"), recipe=None)
    add(
        "recipe-dir",
        "recipe is a directory",
        refuse("recipe.yaml"),
        recipe=None,
        setup=lambda d: (d / "recipe.yaml").mkdir(),
    )
    add("recipe-empty", "recipe file is empty", refuse("recipe.yaml", "empty"), recipe="")
    add(
        "recipe-not-yaml",
        "recipe is not YAML (unbalanced brackets)",
        refuse("recipe.yaml"),
        recipe="sources: [ {kind: jsonl\n",
    )
    add("recipe-list", "recipe is a YAML list", refuse("recipe.yaml"), recipe="- kind: jsonl\n- path: rows.jsonl\n")
    add("recipe-scalar", "recipe is a YAML string", refuse("recipe.yaml"), recipe="just some words\n")
    add(
        "recipe-binary",
        "recipe is random bytes",
        refuse("recipe.yaml"),
        recipe=None,
        files={"recipe.yaml": bytes(random.Random(3).randrange(256) for _ in range(512))},
    )
    add(
        "recipe-dup-key",
        "recipe repeats the key 'split' (YAML keeps the last silently)",
        refuse("split"),
        recipe=BASE + "split: {dev_fraction: 0.5}\n",
    )
    add("recipe-unknown-top", "unknown top-level key 'sourcez'", refuse("sourcez"), recipe=BASE + "sourcez: []\n")
    add(
        "recipe-unknown-nested",
        "misspelt split.dev_fractoin",
        refuse("dev_fractoin"),
        recipe="sources:\n  - {kind: jsonl, path: rows.jsonl}\nsplit: {dev_fractoin: 0.2}\n",
    )
    add(
        "recipe-unknown-source-key",
        "unknown key 'paht' in a source",
        refuse("paht"),
        recipe=recipe_source("{kind: jsonl, paht: rows.jsonl}"),
    )
    add(
        "recipe-unknown-option",
        "unknown converter option",
        refuse("bogus_option"),
        recipe=recipe_source("{kind: jsonl, path: rows.jsonl, options: {bogus_option: 1}}"),
    )
    add(
        "limit-true",
        "source limit: true",
        refuse("limit"),
        recipe=recipe_source("{kind: jsonl, path: rows.jsonl, limit: true}"),
    )
    add(
        "limit-negative",
        "source limit: -1",
        refuse("limit"),
        recipe=recipe_source("{kind: jsonl, path: rows.jsonl, limit: -1}"),
    )
    add(
        "limit-float",
        "source limit: 2.5",
        refuse("limit"),
        recipe=recipe_source("{kind: jsonl, path: rows.jsonl, limit: 2.5}"),
    )
    add(
        "limit-string",
        "source limit: 'ten'",
        refuse("limit"),
        recipe=recipe_source("{kind: jsonl, path: rows.jsonl, limit: ten}"),
    )
    add(
        "limit-zero",
        "source limit: 0 (reads no row)",
        Expect("refused: no records (or a warning)", accept=warned("row")),
        recipe=recipe_source("{kind: jsonl, path: rows.jsonl, limit: 0}"),
    )
    add(
        "limit-huge",
        "source limit: 10**30 (tolerable: everything is read)",
        accept(ok10, "all rows kept (or refused naming limit)", refuse_ok=True, names=("limit",)),
        recipe=recipe_source("{kind: jsonl, path: rows.jsonl, limit: 1000000000000000000000000000000}"),
    )
    add(
        "dev-fraction-1.5",
        "split.dev_fraction: 1.5",
        refuse("dev_fraction"),
        recipe="sources:\n  - {kind: jsonl, path: rows.jsonl}\nsplit: {dev_fraction: 1.5}\n",
    )
    add(
        "dev-fraction-1",
        "split.dev_fraction: 1.0",
        refuse("dev_fraction"),
        recipe="sources:\n  - {kind: jsonl, path: rows.jsonl}\nsplit: {dev_fraction: 1.0}\n",
    )
    add(
        "dev-fraction-neg",
        "split.dev_fraction: -0.1",
        refuse("dev_fraction"),
        recipe="sources:\n  - {kind: jsonl, path: rows.jsonl}\nsplit: {dev_fraction: -0.1}\n",
    )
    add(
        "dev-fraction-text",
        "split.dev_fraction: abc",
        refuse("dev_fraction"),
        recipe="sources:\n  - {kind: jsonl, path: rows.jsonl}\nsplit: {dev_fraction: abc}\n",
    )
    add(
        "dev-test-over-1",
        "dev_fraction 0.6 + test_fraction 0.6 > 1",
        refuse("fraction"),
        recipe="sources:\n  - {kind: jsonl, path: rows.jsonl}\nsplit: {dev_fraction: 0.6, test_fraction: 0.6}\n",
    )
    add(
        "dev-fraction-0",
        "split.dev_fraction: 0 (no dev split; train needs one)",
        Expect("refused, or prepared with a warning that dev is empty", accept=warned("dev")),
        recipe="sources:\n  - {kind: jsonl, path: rows.jsonl}\nsplit: {dev_fraction: 0}\n",
    )
    add(
        "cap-0",
        "cap_per_task: 0 (every row capped away)",
        Expect("refused, or a warning that nothing is left", accept=warned("cap")),
        recipe=BASE + "cap_per_task: 0\n",
    )
    add("cap-negative", "cap_per_task: -5", refuse("cap_per_task"), recipe=BASE + "cap_per_task: -5\n")
    add("cap-true", "cap_per_task: true", refuse("cap_per_task"), recipe=BASE + "cap_per_task: true\n")
    add(
        "cap-map-unknown-task",
        "cap_per_task names a task that is not in the data",
        Expect("refused or warned (a misspelt task)", accept=warned("rout")),
        recipe=BASE + "cap_per_task: {rout: 3}\n",
    )
    return P


def recipe_key_probes(env: Env) -> list[Probe]:
    """Sources, held-out tasks, engine, output and dedup keys, overrides, decontamination lists, a YAML bomb."""
    P: list[Probe] = []

    def add(cid: str, what: str, expect: Expect, **kw: Any) -> None:
        P.append(prepare_probe(env, cid, what, expect, **kw))

    add("sources-empty", "sources: []", refuse("sources"), recipe="sources: []\n")
    add("sources-missing", "no sources key", refuse("sources"), recipe="split: {dev_fraction: 0.2}\n")
    add("source-no-kind", "a source without kind", refuse("kind"), recipe=recipe_source("{path: rows.jsonl}"))
    add(
        "source-kind-unknown",
        "kind: nosuch",
        refuse("nosuch"),
        recipe=recipe_source("{kind: nosuch, path: rows.jsonl}"),
    )
    add("source-jsonl-no-path", "kind: jsonl without a path", refuse("path"), recipe=recipe_source("{kind: jsonl}"))
    add(
        "heldout-all",
        "every task held out (nothing left to train on)",
        Expect("refused, or a warning that train is empty", accept=warned("train")),
        recipe="sources:\n  - {kind: jsonl, path: rows.jsonl}\nsplit: {heldout_tasks: [outage, route]}\n",
    )
    add(
        "heldout-unknown",
        "heldout_tasks names a task not in the data (typo)",
        Expect("refused or warned naming the task", accept=warned("outag")),
        recipe="sources:\n  - {kind: jsonl, path: rows.jsonl}\nsplit: {heldout_tasks: [outag]}\n",
    )
    add("engine-unknown", "--engine nosuch", refuse("engine"), extra=("--engine", "nosuch"))
    add("output-format", "output.format: csv", refuse("format"), recipe=BASE + "output: {format: csv}\n")
    add(
        "rows-per-file-0",
        "output.rows_per_file: 0",
        refuse("rows_per_file"),
        recipe=BASE + "output: {rows_per_file: 0}\n",
    )
    add(
        "near-threshold-0",
        "dedup.near.threshold: 0",
        refuse("threshold"),
        recipe=BASE + "dedup: {near: {threshold: 0}}\n",
    )
    add("override-unknown", "override splt.dev_fraction=0.1", refuse("splt"), extra=("splt.dev_fraction=0.1",))
    add(
        "override-bad-value",
        "override split.dev_fraction=abc",
        refuse("dev_fraction"),
        extra=("split.dev_fraction=abc",),
    )
    add(
        "override-no-equals",
        "override 'split.dev_fraction' without a value",
        refuse("split.dev_fraction"),
        extra=("split.dev_fraction",),
    )
    add(
        "override-long",
        "override split.dev_fraction=111…1 (300 characters: once taken for a file name, 'File name too long')",
        refuse("split.dev_fraction"),
        extra=("split.dev_fraction=" + "1" * 300,),
    )
    add(
        "override-into-value",
        "override cap_per_task.outage=3 over the recipe's cap_per_task: 7 (it replaced the cap of every task)",
        refuse("cap_per_task", "whole"),
        recipe=BASE + "cap_per_task: 7\n",
        extra=("cap_per_task.outage=3",),
    )
    for cid, key, looks, names in [  # issue 64: "did you mean split?" did not say why split was unknown
        ("key-zero-width", "split\u200b", "split", ("split\\u200b", "U+200B", "invisible")),
        ("key-cyrillic", "\u0455ources", "sources", ("\\u0455ources", "U+0455", "look-alike", "sources")),
    ]:
        add(
            cid,
            f"recipe key {ascii(key)[1:-1]}, which reads as {looks} on screen",
            refuse(*names),
            recipe=BASE.replace(looks, key, 1),
        )
    add(
        "decontam-missing",
        "decontaminate_against a missing file",
        refuse("lockbox.jsonl"),
        recipe=BASE + "decontaminate_against: [lockbox.jsonl]\n",
    )
    add(
        "decontam-dir",
        "decontaminate_against an empty directory",
        refuse("evaldir"),
        recipe=BASE + "decontaminate_against: [evaldir]\n",
        setup=lambda d: (d / "evaldir").mkdir(),
    )
    for cid, seed in [("seed-negative", "-1"), ("seed-over-32-bits", "4294967296")]:  # numpy / datasketch raised
        add(
            cid,
            f"dedup.near.seed: {seed} (issue 64)",
            refuse("seed"),
            recipe=f"{BASE}dedup: {{near: {{seed: {seed}}}}}\n",
        )
    add(
        "int-5000-digits",
        "split.seed: a 5,000-digit integer (issue 64)",
        refuse("recipe.yaml"),
        recipe="sources:\n  - {kind: jsonl, path: rows.jsonl}\nsplit: {seed: " + "9" * 5000 + "}\n",
    )
    add(
        "yaml-nesting-bomb",
        "100,000 nested '[' (a recursion bomb; issue 64)",
        refuse("recipe.yaml"),
        recipe="sources: " + "[" * 100_000 + "\n",
    )
    bomb = "".join(
        f"      {k}: &{k} [{', '.join([('*' + p) if p else 'x'] * 9)}]\n"
        for k, p in zip("abcdefg", ["", "a", "b", "c", "d", "e", "f"], strict=False)
    )
    add(
        "yaml-alias-bomb",
        "YAML alias bomb (billion laughs: 9**7 leaves) in options and split.heldout_tasks",
        refuse(),
        recipe="sources:\n  - kind: jsonl\n    path: rows.jsonl\n    options:\n"
        + bomb
        + "split: {heldout_tasks: *g}\n",
    )
    return P
