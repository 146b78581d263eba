"""Category prepare-inputs, part 2: the source's path (missing, a directory, locked, a link loop, /dev/zero, a
FIFO), its bytes (binary, gz cut short, UTF-16, BOM, CRLF) and CSV sources."""

from __future__ import annotations

import os
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

from assets import Env, jsonl_text, sentence
from harness import Expect, Probe
from judge import (
    any_of,
    kept_all,
    rejected_line,
    warned,
)
from prepare_inputs import (
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
        "source is a FIFO nobody writes to (subprocess)",
        refuse("pipe.jsonl"),
        recipe=recipe_source("{kind: jsonl, path: pipe.jsonl}"),
        setup=lambda d: os.mkfifo(d / "pipe.jsonl"),
        subprocess_=True,
        timeout=30,
    )
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
        Expect("refused naming the encoding, or every line rejected", accept=any_of(rejected_line(1), warned("utf"))),
        recipe=recipe_source("{kind: jsonl, path: u16.jsonl}"),
        files={"u16.jsonl": jsonl_text(good_rows()).encode("utf-16")},
    )
    add(
        "src-bom",
        "source starts with a UTF-8 BOM (tolerable: accept, or reject line 1 naming it)",
        accept(any_of(kept_all(N_GOOD), rejected_line(1)), "all rows kept, or line 1 rejected", refuse_ok=True),
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
