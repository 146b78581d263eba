"""Category prepare-inputs, part 2: the source's path (missing, a directory, locked, a link loop, /dev/zero, a
FIFO), its bytes (binary, gz cut short, UTF-16, BOM, CRLF) and CSV sources."""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from assets import Env, jsonl_text, sentence, unlock
from harness import Case, Expect, Probe, Proc, lost_files, snapshot
from judge import (
    judge_runs,
    kept_all,
    warned,
)
from prepare_inputs import (
    BASE,
    N_GOOD,
    accept,
    good_rows,
    prepare_probe,
    recipe_source,
    refuse,
    reject,
)


def source_probes(env: Env) -> list[Probe]:
    """The source path and the file's bytes."""
    P: list[Probe] = []

    def add(cid: str, what: str, expect: Expect, **kw: Any) -> None:
        P.append(prepare_probe(env, cid, what, expect, **kw))

    # ---- the source path
    add(
        "src-missing",
        "source path does not exist",
        refuse("nothere.jsonl"),
        recipe=recipe_source("{kind: jsonl, path: nothere.jsonl}"),
    )
    add(
        "src-empty-dir",
        "source path is an empty directory",
        refuse("emptydir"),
        recipe=recipe_source("{kind: jsonl, path: emptydir}"),
        setup=lambda d: (d / "emptydir").mkdir(),
    )
    add(
        "src-dir-stray",
        "source directory holds a .txt beside the part file",
        refuse("notes.txt"),
        recipe=recipe_source("{kind: jsonl, path: parts}"),
        files={"parts/part-0.jsonl": jsonl_text(good_rows()), "parts/notes.txt": "my notes\n"},
    )
    add(
        "src-dir-parts",
        "source directory of two JSONL part files (valid)",
        accept(kept_all(2 * N_GOOD), "all rows kept"),
        recipe=recipe_source("{kind: jsonl, path: parts}"),
        files={
            "parts/part-0.jsonl": jsonl_text(good_rows()),
            "parts/part-1.jsonl": jsonl_text(good_rows(start=50, seed=2)),
        },
    )
    add(
        "src-chmod-000",
        "source file chmod 000",
        refuse("locked.jsonl"),
        recipe=recipe_source("{kind: jsonl, path: locked.jsonl}"),
        files={"locked.jsonl": jsonl_text(good_rows())},
        setup=lambda d: os.chmod(d / "locked.jsonl", 0),
    )
    add(
        "src-dir-chmod-000",
        "source directory chmod 000",
        refuse("lockeddir"),
        recipe=recipe_source("{kind: jsonl, path: lockeddir}"),
        files={"lockeddir/part-0.jsonl": jsonl_text(good_rows())},
        setup=lambda d: os.chmod(d / "lockeddir", 0),
    )
    add(
        "src-binary",
        "source is 4 kB of random bytes",
        Expect("refused, or every line rejected and a refusal / warning that nothing is left", accept=warned("row")),
        recipe=recipe_source("{kind: jsonl, path: blob.jsonl}"),
        files={"blob.jsonl": bytes(random.Random(4).randrange(256) for _ in range(4096))},
    )
    add(
        "src-empty-file",
        "source is an empty file",
        refuse("empty.jsonl"),
        recipe=recipe_source("{kind: jsonl, path: empty.jsonl}"),
        files={"empty.jsonl": b""},
    )
    add(
        "src-symlink-loop",
        "source is a symlink loop",
        refuse("loop.jsonl"),
        recipe=recipe_source("{kind: jsonl, path: loop.jsonl}"),
        setup=lambda d: (os.symlink("loop2.jsonl", d / "loop.jsonl"), os.symlink("loop.jsonl", d / "loop2.jsonl")),
    )
    add(
        "src-dangling-link",
        "source is a dangling symlink",
        refuse("gone.jsonl"),
        recipe=recipe_source("{kind: jsonl, path: gone.jsonl}"),
        setup=lambda d: os.symlink("nowhere.jsonl", d / "gone.jsonl"),
    )
    add(
        "src-dev-zero",
        "source is /dev/zero (subprocess, 3 GB address-space limit)",
        refuse("/dev/zero"),
        recipe=recipe_source("{kind: jsonl, path: /dev/zero}"),
        subprocess_=True,
        timeout=40,
    )
    add(
        "src-fifo",
        "source is a FIFO whose writer sends the rows, as <(zcat rows.jsonl.gz) does (subprocess)",
        accept(kept_all(N_GOOD), "all rows kept, read as they are written"),
        recipe=recipe_source("{kind: jsonl, path: pipe.jsonl}"),
        setup=_fifo_with_writer,
        subprocess_=True,
        timeout=30,
    )
    P.append(_fifo_nobody_writes(env))
    add(
        "src-gz-truncated",
        "source .jsonl.gz cut in half",
        Expect(
            "refused naming the file (or a warning naming it)", accept=warned("rows.jsonl.gz"), names=("rows.jsonl.gz",)
        ),
        recipe=recipe_source("{kind: jsonl, path: rows.jsonl.gz}"),
        setup=_truncated_gz,
    )
    add(
        "src-utf16",
        "source written in UTF-16 (with BOM)",
        refuse(
            "u16.jsonl",
            "UTF-16",
            text="refused naming the file and its encoding (issue 64; was: every line rejected as invalid UTF-8)",
        ),
        recipe=recipe_source("{kind: jsonl, path: u16.jsonl}"),
        files={"u16.jsonl": jsonl_text(good_rows()).encode("utf-16")},
    )
    add(
        "src-bom",
        "source starts with a UTF-8 BOM (the mark is skipped; line 1 was rejected before issue 64)",
        accept(kept_all(N_GOOD), "all rows kept"),
        rows=b"\xef\xbb\xbf" + jsonl_text(good_rows()).encode(),
    )
    add(
        "src-crlf",
        "source with CRLF line ends (valid)",
        accept(kept_all(N_GOOD), "all rows kept"),
        rows=jsonl_text(good_rows()).replace("\n", "\r\n").encode(),
    )
    add(
        "src-blank-lines",
        "blank and whitespace-only lines between rows (valid, skipped)",
        accept(kept_all(N_GOOD), "all rows kept"),
        rows=jsonl_text(good_rows()).replace("\n", "\n\n   \n\t\n").encode(),
    )
    add(
        "src-no-final-newline",
        "last row without a newline (valid)",
        accept(kept_all(N_GOOD), "all rows kept"),
        rows=jsonl_text(good_rows()).rstrip("\n").encode(),
    )
    add(
        "src-all-invalid",
        "every line is garbage",
        Expect("refused (nothing valid), or a warning that nothing is left", accept=warned("row")),
        rows=b"garbage\n" * 12,
    )
    return P


def csv_probes(env: Env) -> list[Probe]:
    """CSV sources: a missing column, an answer outside the criteria."""
    P: list[Probe] = []

    def add(cid: str, what: str, expect: Expect, **kw: Any) -> None:
        P.append(prepare_probe(env, cid, what, expect, **kw))

    add(
        "csv-missing-column",
        "csv source whose state_column is not in the file",
        refuse("body"),
        recipe=recipe_source(
            "{kind: csv, path: t.csv, options: {type: choice, instructions: 'Which team?', "
            "state_column: body, answer_column: team, criteria: [billing, support]}}"
        ),
        files={"t.csv": "id,text,team\nt1,hello there,billing\nt2,another one,support\n"},
    )
    add(
        "csv-bad-answer",
        "csv row whose answer is not in the criteria",
        reject(4, "option", file="t.csv"),
        recipe=recipe_source(
            "{kind: csv, path: t.csv, options: {type: choice, instructions: 'Which team?', "
            "state_column: text, answer_column: team, id_column: id, criteria: [billing, support]}}"
        ),
        files={
            "t.csv": "id,text,team\nt1,the invoice was charged twice,billing\nt2,how do I reset my password,"
            "support\nt3,the checkout page is down,engineering\n"
            + "".join(
                f"t{i},{sentence(random.Random(i))} number {i},{'billing' if i % 2 else 'support'}\n"
                for i in range(4, 24)
            )
        },
    )
    add(
        "csv-duplicate-column",
        "csv header naming the column text twice (the last one would win; issue 64)",
        refuse("text"),
        recipe=recipe_source(
            "{kind: csv, path: t.csv, options: {type: choice, instructions: 'Which team?', "
            "state_column: text, answer_column: team, criteria: [billing, support]}}"
        ),
        files={"t.csv": "text,team,text\nhello there,billing,other\nanother one,support,more\n"},
    )
    # ---- bytes that are not UTF-8 text (issue 64: the errors said "invalid UTF-8 (byte 0x8b …)" or "column 'text'
    # not found; it has ['\ufefftext', …]", never the cause)
    csv_recipe = recipe_source(
        "{kind: csv, path: t.csv, options: {type: choice, instructions: 'Which team?', "
        "state_column: text, answer_column: team, criteria: [billing, support]}}"
    )
    add(
        "csv-bom-header",
        "csv saved as Excel's 'CSV UTF-8': a byte-order mark before the first column name 'text'",
        accept(kept_all(20), "all rows kept (the mark is no part of the column name)"),
        recipe=csv_recipe,
        files={"t.csv": b"\xef\xbb\xbf" + _csv_text().encode()},
    )
    for cid, what, data, names in [
        (
            "csv-latin1-header",
            "csv in Latin-1 whose header has an accented column name",
            _csv_text("équipe"),
            ("t.csv:1", "UTF-8", "Latin-1"),
        ),
        (
            "csv-latin1-rows",
            "csv in Latin-1: every row has an accented word",
            _csv_text(word="café"),
            ("t.csv", "not UTF-8", "Latin-1"),
        ),
    ]:
        add(cid, what, refuse(*names), recipe=csv_recipe, files={"t.csv": data.encode("latin-1")})
    add(
        "csv-utf16",
        "csv saved as UTF-16 (Windows 'Unicode text')",
        refuse("t.csv", "UTF-16"),
        recipe=csv_recipe,
        files={"t.csv": _csv_text().encode("utf-16")},
    )
    for cid, what, packer, names in [
        ("src-gzip-named-jsonl", "source rows.jsonl that is gzip data", "gzip", ("rows.jsonl", "gzip", ".gz")),
        ("src-bz2-named-jsonl", "source rows.jsonl that is bzip2 data", "bz2", ("rows.jsonl", "bzip2", ".bz2")),
        ("src-xz-named-jsonl", "source rows.jsonl that is xz data", "lzma", ("rows.jsonl", "xz", "decompress")),
        ("src-zip-named-csv", "source t.csv that is a zip archive holding the CSV", "zip", ("t.csv", "zip")),
    ]:
        add(
            cid,
            what,
            refuse(*names),
            recipe=csv_recipe if packer == "zip" else BASE,
            rows=None if packer == "zip" else _packed(packer, jsonl_text(good_rows()).encode()),
            files={"t.csv": _packed("zip", _csv_text().encode())} if packer == "zip" else None,
        )
    parquet = recipe_source(
        "{kind: parquet, path: c.parquet, options: {type: noul, instructions: 'Is it urgent?', "
        "state_column: text, answer_column: label}}"
    )
    for cid, cell, word in [
        ("parquet-nan-cell", float("nan"), "NaN"),
        ("parquet-bytes-cell", b"caf\xc3\xa9", "bytes"),
        ("parquet-map-cell", {"msg": "hi"}, "map"),
        ("parquet-list-cell", ["a", "b"], "list"),
    ]:
        add(
            cid,
            f"parquet state cells all {cell!r} (were turned into their Python repr and deduplicated; issue 64)",
            refuse("c.parquet", word),
            recipe=parquet,
            setup=_parquet_with(cell),
        )
    add(
        "parquet-damaged",
        "parquet file whose data pages are overwritten (issue 64)",
        refuse("c.parquet"),
        recipe=parquet,
        setup=_damaged_parquet,
    )
    return P


def _parquet_rows(where: Path, cell: Any = None) -> None:
    """c.parquet: 40 rows of text and a yes/no label; with ``cell``, every text cell is that (a column has one
    type: a NaN, bytes, map or list cell cannot sit among strings)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    texts = [f"{sentence(random.Random(i))} number {i}" for i in range(40)] if cell is None else [cell] * 40
    pq.write_table(pa.table({"text": texts, "label": [i % 2 == 0 for i in range(40)]}), where / "c.parquet")


def _parquet_with(cell: Any) -> Callable[[Path], None]:
    return lambda where: _parquet_rows(where, cell)


def _damaged_parquet(where: Path) -> None:
    _parquet_rows(where)
    data = bytearray((where / "c.parquet").read_bytes())
    data[8 : len(data) // 2] = b"\xff" * (len(data) // 2 - 8)
    (where / "c.parquet").write_bytes(bytes(data))


def _truncated_gz(where: Path) -> None:
    import gzip

    data = gzip.compress(jsonl_text(good_rows(200)).encode())
    (where / "rows.jsonl.gz").write_bytes(data[: len(data) // 2])


def _fifo_with_writer(where: Path) -> None:
    """pipe.jsonl, and a thread that writes the good rows into it once prepare opens it (given up after 30 s)."""
    pipe = where / "pipe.jsonl"
    os.mkfifo(pipe)

    def write() -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:  # non-blocking: ENXIO until a reader has it open
                fd = os.open(pipe, os.O_WRONLY | os.O_NONBLOCK)
            except OSError:
                time.sleep(0.05)
                continue
            os.set_blocking(fd, True)
            with os.fdopen(fd, "wb") as handle:
                handle.write(jsonl_text(good_rows()).encode())
            return

    threading.Thread(target=write, daemon=True).start()


def _fifo_nobody_writes(env: Env) -> Probe:
    """A FIFO nobody writes to: read as any Unix reader reads one, so prepare waits; the wait is said at once on
    stderr, and Ctrl-C ends it (exit 130, no output written). A wait past 20 s without the notice is a hang."""
    args = ["prepare", "recipe.yaml", "--out", "out"]
    case = Case(
        "prep-src-fifo-nobody-writes",
        "prepare-inputs",
        "mydecide " + " ".join(args) + "   # source is a FIFO nobody writes to; Ctrl-C once the wait is said",
        "says it waits for the pipe's writer, naming pipe.jsonl; Ctrl-C ends it (exit 130), nothing written",
    )

    def go(case: Case) -> None:
        where = env.case_dir(case.id)
        (where / "recipe.yaml").write_text(recipe_source("{kind: jsonl, path: pipe.jsonl}"))
        os.mkfifo(where / "pipe.jsonl")
        before = snapshot(where)
        proc = Proc(args, where)
        said = proc.wait_for("pipe.jsonl is a named pipe: waiting for its writer", 20)
        proc.send(signal.SIGINT)
        run = proc.finish(20)
        after = snapshot(where)
        problems = [] if said else ["no line saying it waits for the pipe's writer within 20 s"]
        if run.code != 130 and not run.timed_out:
            problems.append(f"exit {run.code} after Ctrl-C, not 130")
        if (where / "out").exists():
            problems.append("out/ was written")
        judge_runs(
            case,
            [("interrupted", run)],
            lost_files(before, after, [".out.lock", ".out.staging-*"]),
            problems,
            good="handled",
            extra_flags=[] if said else ["hang"],
        )
        unlock(where)

    return Probe(case, go)


def _csv_text(team_column: str = "team", word: str = "ticket") -> str:
    """20 CSV rows of text and a team (billing / support), header ``text,<team_column>``."""
    rows = [f"{word} {i}: {sentence(random.Random(i))},{'billing' if i % 2 else 'support'}\n" for i in range(20)]
    return f"text,{team_column}\n" + "".join(rows)


def _packed(how: str, data: bytes) -> bytes:
    import bz2
    import gzip
    import io
    import lzma
    import zipfile

    if how == "zip":
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w") as archive:
            archive.writestr("t.csv", data)
        return buffer.getvalue()
    return {"gzip": gzip.compress, "bz2": bz2.compress, "lzma": lzma.compress}[how](data)
