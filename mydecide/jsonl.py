"""JSON Lines, read and written one way everywhere: the one strict JSON rule (no repeated key, no NaN / Infinity,
no integer too long to convert, UTF-8 text only) and the one reader that prepare's converters, evaluation,
calibration and training share.

A line comes out of :func:`iter_jsonl` as ``(where, object, error)``: ``where`` is ``"<file name>:<line>"``
(1-based), ``error`` is None or why the line is not JSON (the raw line is then the object, printable). The
server's request bodies go through :func:`unique_keys` too, so no path accepts a line another path refuses.

Lines are read at most :data:`MAX_LINE_CHARS` at a time, whatever reads them (:class:`BoundedText`): a longer line
is a row reject in :func:`iter_jsonl` and an error naming the file and line for every other reader, and a file
with no end of line in sight (``/dev/zero``) is given up after :data:`MAX_SKIP_CHARS`, so no file can make a reader
hold an endless line in memory.
"""

from __future__ import annotations

import bz2
import gzip
import io
import json
import math
import sys
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mydecide.errors import UserError
from mydecide.io import atomic_write_text

MAX_DEPTH = 64  # nested objects and lists in a row (a record nested deeper is refused, never recursed into)
COMPRESSIONS = (".gz", ".bz2")
MAX_LINE_CHARS = 16 * 2**20  # characters of one line a reader holds; a longer line is rejected, not read whole
MAX_SKIP_CHARS = 256 * 2**20  # characters of one line skipped, at most, looking for its end; then the file is refused
SKIP_CHUNK_CHARS = 2**20  # characters read at a time while a too-long line is skipped
RAW_HEAD_CHARS = 200  # of a too-long line, kept as its raw content in rejects.jsonl

Line = tuple[str, Any, str | None]  # (where, object or raw line, error)


class StrictJSONError(UserError):
    """Text that ``json.loads`` would accept but that is not standard JSON, or is ambiguous."""


class DuplicateKeyError(StrictJSONError):
    """A JSON object repeats a key (``str(err)`` is ``duplicate key 'name'``)."""

    def __init__(self, key: str):
        self.key = key
        super().__init__(f"duplicate key {key!r}")


def unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``object_pairs_hook`` for ``json.loads``: it keeps the last of two equal keys, so an option or a question
    would vanish silently; refuse instead."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise DuplicateKeyError(key)
        out[key] = value
    return out


def no_constant(name: str) -> Any:
    """``parse_constant`` for ``json.loads``: NaN and Infinity are not JSON numbers."""
    raise StrictJSONError(f"{name} is not a JSON number")


def integer(digits: str) -> int:
    """``parse_int`` for ``json.loads``: an integer longer than Python converts (``sys.get_int_max_str_digits()``,
    4300 digits by default) is a :class:`StrictJSONError` like any other unreadable value, not a bare ValueError
    that would stop a whole file."""
    try:
        return int(digits)
    except ValueError:
        length = len(digits.lstrip("-"))
        raise StrictJSONError(
            f"an integer of {length} digits; at most {sys.get_int_max_str_digits()} are read"
        ) from None


def loads_strict(text: str) -> Any:
    """``json.loads`` that refuses a repeated key, NaN / Infinity and an integer too long to convert
    (:class:`StrictJSONError`)."""
    return json.loads(text, object_pairs_hook=unique_keys, parse_constant=no_constant, parse_int=integer)


def text_problem(text: str) -> str | None:
    """Why ``text`` cannot be written as UTF-8, or None: bytes read with ``errors="surrogateescape"`` that were not
    UTF-8, or a lone surrogate from a ``\\ud800`` escape."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        bad = text[err.start]
        if "\udc80" <= bad <= "\udcff":
            return f"invalid UTF-8 (byte 0x{ord(bad) - 0xDC00:02x} at character {err.start + 1})"
        return f"a lone surrogate (U+{ord(bad):04X} at character {err.start + 1}) is not text"
    return None


def printable(text: str) -> str:
    """``text`` with bytes that were not UTF-8 and lone surrogates shown as U+FFFD (for rejects.jsonl)."""
    return text.encode("utf-8", "surrogateescape").decode("utf-8", "replace") if text_problem(text) else text


def parse_json_line(line: str) -> tuple[Any, str | None]:
    """One line of JSON Lines (read with ``errors="surrogateescape"``) → ``(object, None)``, or ``(raw line, reason)``
    for bytes that are not UTF-8, invalid or non-standard JSON, a repeated key, or nesting too deep to read."""
    line = line.rstrip("\r\n")
    problem = None if line.isascii() else text_problem(line)
    if problem is not None and "UTF-8" in problem:
        return printable(line), problem
    try:
        return loads_strict(line), None
    except json.JSONDecodeError as err:
        return printable(line), f"invalid JSON ({err.msg} at column {err.colno})"
    except StrictJSONError as err:
        return printable(line), f"invalid JSON ({err})"
    except RecursionError:
        return printable(line[:1000]) + "…", "invalid JSON (nested too deep to read)"


def value_problem(obj: dict[str, Any]) -> str | None:
    """What a parsed row cannot carry through JSON and a tokenizer, as ``key: problem``, or None: nesting deeper than
    ``MAX_DEPTH``, a string that is not Unicode text (a lone surrogate, or bytes that were not UTF-8), NaN or
    Infinity (not JSON numbers). The walk uses a stack, so a row nested thousands deep is refused, not a
    RecursionError."""
    stack: list[tuple[Any, int, str]] = [(value, 1, str(key)) for key, value in obj.items()]
    stack += [(key, 1, str(key)) for key in obj]
    while stack:
        value, depth, top = stack.pop()
        if isinstance(value, str):
            if not value.isascii() and text_problem(value):
                return f"{top}: {text_problem(value)}"
        elif isinstance(value, float):
            if not math.isfinite(value):
                return f"{top}: {value} is not a JSON number"
        elif isinstance(value, (dict, list)):
            if depth >= MAX_DEPTH:
                return f"{top}: nested more than {MAX_DEPTH} levels deep"
            stack += [(v, depth + 1, top) for v in (value.values() if isinstance(value, dict) else value)]
            if isinstance(value, dict):
                stack += [(k, depth + 1, top) for k in value]
    return None


# ----------------------------------------------------------------------------------------------------- reading


def open_text(path: str | Path) -> BoundedText:
    """Open a (possibly .gz / .bz2 compressed) UTF-8 text file; FileNotFoundError names the path.

    Bytes that are not UTF-8 come through as lone surrogates (``errors="surrogateescape"``), so the row holding
    them is rejected (:func:`text_problem`), not the whole file; a corrupt or truncated compressed file is a
    ValueError naming it. A UTF-8 byte-order mark is skipped; a file that is compressed under another name, or
    UTF-16 / UTF-32 text, is a UserError saying so (:func:`not_text`). Its lines are bounded (:class:`BoundedText`).
    """
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"{p}: no such file or directory")
    if p.is_dir():
        raise UserError(f"{p}: is a directory, expected a file")
    if p.is_fifo():  # read as any Unix reader does, once, as it is written; said, since nothing moves until then
        print(f"[mydecide] {p} is a named pipe: waiting for its writer (Ctrl-C stops)", file=sys.stderr, flush=True)
    if p.suffix in COMPRESSIONS:
        packed = gzip.open(p, "rb") if p.suffix == ".gz" else bz2.open(p, "rb")  # noqa: SIM115 (the caller closes)
        raw: io.BufferedReader[Any] = io.BufferedReader(_Decompressed(packed, p))
    else:
        raw = open(p, "rb")  # noqa: SIM115 (the caller closes)
    try:
        skip_utf8_bom(raw, p)
    except BaseException:
        raw.close()
        raise
    return BoundedText(raw, p)


# first bytes of data that is not text → (what it is, the suffix that reads it compressed, or None)
NOT_TEXT = (
    (b"\x1f\x8b", "gzip data", ".gz"),
    (b"\xfd7zXZ\x00", "xz data", None),
    (b"\x28\xb5\x2f\xfd", "zstd data", None),
    (b"PK\x03\x04", "a zip archive", None),
)
BOMS = (  # UTF-32's first: its little-endian mark starts with UTF-16's
    (b"\xff\xfe\x00\x00", "UTF-32"),
    (b"\x00\x00\xfe\xff", "UTF-32"),
    (b"\xff\xfe", "UTF-16"),
    (b"\xfe\xff", "UTF-16"),
)
UTF8_BOM = b"\xef\xbb\xbf"


def skip_utf8_bom(raw: io.BufferedReader[Any], path: Path) -> None:
    """Read past a UTF-8 byte-order mark (Excel's "CSV UTF-8" starts with one, and the first column would be
    ``\\ufefftext``); refuse, naming what it is, a file whose first bytes say it is compressed or UTF-16 / UTF-32
    text, so that no reader takes it for lines of UTF-8 that all fail."""
    head = raw.peek(10)[:10]
    if head.startswith(UTF8_BOM):
        raw.read(len(UTF8_BOM))
        return
    problem = not_text(head, path)
    if problem is not None:
        raise UserError(f"{path}: {problem}")


def not_text(head: bytes, path: Path) -> str | None:
    """Why a file starting with ``head`` is not UTF-8 text, and what to do, or None."""
    compressed = path.suffix in COMPRESSIONS
    bzip2 = len(head) >= 10 and head[:3] == b"BZh" and head[3:4].isdigit() and head[4:10] == b"1AY&SY"
    for magic, what, suffix in [*NOT_TEXT, *([(head[:3], "bzip2 data", ".bz2")] if bzip2 else [])]:
        if head.startswith(magic):
            if suffix is not None and not compressed:
                return f"looks like {what}, not text: name it {path.name}{suffix} (read compressed) or decompress it"
            return f"looks like {what}, not text{' (compressed twice?)' if compressed else ''}: decompress it first"
    for mark, encoding in BOMS:
        if head.startswith(mark):
            return f"is {encoding} text (it starts with a {encoding} byte-order mark); save it as UTF-8"
    if len(head) >= 4 and (
        (0 not in (head[0], head[2]) and head[1] == head[3] == 0)
        or (head[0] == head[2] == 0 and 0 not in (head[1], head[3]))
    ):
        return "looks like UTF-16 text (every other byte is zero); save it as UTF-8"
    return None


def not_utf8_hint(reason: str) -> str:
    """After "all N rows were rejected, the first: … invalid UTF-8 …": the likely cause, a file in another
    encoding."""
    if "invalid UTF-8" not in reason:
        return ""
    return "; the file is not UTF-8: convert it from its encoding (Latin-1? Windows-1252?), e.g. with iconv"


@dataclass(frozen=True)
class LongLine:
    """A line longer than :data:`MAX_LINE_CHARS`, skipped: its length (without the end of line) and its start."""

    length: int
    head: str

    def reason(self) -> str:
        return f"line of {self.length} characters; at most {MAX_LINE_CHARS} are read (mydecide.jsonl.MAX_LINE_CHARS)"


class BoundedText(io.TextIOWrapper):
    """A UTF-8 text file (``newline=""``: line ends kept as they are) that never holds more than
    :data:`MAX_LINE_CHARS` characters of a line. Iterating it, as the CSV and text converters do, raises ValueError
    naming ``file:line`` on a longer line; :meth:`next_line` gives a :class:`LongLine` instead, so that JSON Lines
    can reject that one row and go on. ``lines`` counts the lines read so far."""

    def __init__(self, raw: Any, path: Path):
        super().__init__(raw, encoding="utf-8", errors="surrogateescape", newline="")
        self.path = path
        self.lines = 0

    def __next__(self) -> str:  # type: ignore[override]  # (typeshed: as TextIOWrapper itself)
        line = self.next_line()
        if isinstance(line, LongLine):
            raise UserError(f"{self.path}:{self.lines}: {line.reason()}")
        if not line:
            raise StopIteration
        return line

    def next_line(self) -> str | LongLine:
        """The next line with its end of line ("" at the end of the file), or the :class:`LongLine` it was: read
        :data:`SKIP_CHUNK_CHARS` at a time to its end, never held whole. A line still without an end after
        :data:`MAX_SKIP_CHARS` is a ValueError naming the file: there may be no end at all (``/dev/zero``)."""
        line = self.readline(MAX_LINE_CHARS + 1)
        if not line:
            return ""
        self.lines += 1
        if len(line) <= MAX_LINE_CHARS or line.endswith(("\n", "\r")):
            return line
        head, length = line[:RAW_HEAD_CHARS], len(line)
        del line
        while length <= MAX_SKIP_CHARS:
            chunk = self.readline(SKIP_CHUNK_CHARS)
            text = chunk.rstrip("\r\n")
            length += len(text)
            if not chunk or text != chunk:  # the end of the file, or of the line
                return LongLine(length, head)
        raise UserError(
            f"{self.path}:{self.lines}: no end of line in the first {MAX_SKIP_CHARS} characters of this line "
            "(mydecide.jsonl.MAX_SKIP_CHARS); the file is given up: is it a text file?"
        )


class _Decompressed(io.RawIOBase):
    """A gzip / bz2 stream whose read errors name the file (one clear error, not an EOFError traceback)."""

    def __init__(self, packed: Any, path: Path):
        self.packed, self.path = packed, path

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        try:
            return int(self.packed.readinto(buffer))
        except (EOFError, OSError, zlib.error) as err:
            raise UserError(f"{self.path}: corrupt or truncated {self.path.suffix} file ({err})") from None

    def close(self) -> None:
        self.packed.close()
        super().close()


def iter_jsonl(path: str | Path) -> Iterator[Line]:
    """``(where, object, error)`` for each non-blank line of a (possibly compressed) JSON Lines file; a line that
    is not strict JSON, or longer than :data:`MAX_LINE_CHARS`, gives ``(where, printable raw line, reason)``."""
    name = Path(path).name
    with open_text(path) as handle:
        while line := handle.next_line():
            where = f"{name}:{handle.lines}"
            if isinstance(line, LongLine):
                yield where, printable(line.head) + "…", line.reason()
            elif line.strip():
                obj, error = parse_json_line(line)
                yield where, obj, error


# ----------------------------------------------------------------------------------------------------- writing


def write_jsonl(path: str | Path, rows: Iterable[dict[str, Any]]) -> int:
    """Write rows atomically (temp file + rename) and return how many were written."""
    lines = [json_line(row) for row in rows]
    atomic_write_text(path, "".join(line + "\n" for line in lines))
    return len(lines)


def json_line(row: Any) -> str:
    """``row`` as one line of standard JSON in UTF-8. A rejected row's raw content may hold what valid records
    cannot (a lone surrogate, NaN, nesting too deep to print): it is escaped or elided, never written as is."""
    try:
        line = json.dumps(row, ensure_ascii=False, allow_nan=False)
    except (ValueError, RecursionError):
        return json.dumps(_plain(row), ensure_ascii=True)
    return line if line.isascii() or text_problem(line) is None else json.dumps(row, ensure_ascii=True)


def _plain(value: Any, depth: int = 0) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, (dict, list)):
        if depth >= MAX_DEPTH:
            return f"… nested more than {MAX_DEPTH} levels deep"
        if isinstance(value, dict):
            return {str(k): _plain(v, depth + 1) for k, v in value.items()}
        return [_plain(v, depth + 1) for v in value]
    return value
