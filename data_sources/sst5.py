"""SST-5 (Stanford Sentiment Treebank): how positive is a movie-review sentence, on 5 ordered levels (score).

Levels, lowest first: very negative, negative, neutral, positive, very positive (the treebank's classes 0..4).

Local files in the published layouts: the treebank's PTB tree files ``train.txt`` / ``dev.txt`` / ``test.txt``
(one labelled tree per line, e.g. ``(3 (2 It) (4 (4 works) (2 .)))``: the root's label is the sentence's
class, the leaves joined by spaces are its text), or files with ``text`` and ``label`` (0..4, or the level
name) columns such as the JSON Lines files of the Hugging Face dataset ``SetFit/sst5`` (CSV / Parquet too).
The split name in ids is the file's stem. With no path ``SetFit/sst5`` is loaded (online), ``split``
``train``, ``validation`` or ``test``.

Records: task ``sst5``, id ``sst5-<split>-<line or row>``, lang ``en``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from data_sources._files import (
    Row,
    base_suffix,
    capped,
    error_row,
    existing,
    file_stem,
    iter_hub,
    iter_rows,
    load_hub,
    open_text,
)

HUB_NAME = "SetFit/sst5"
TASK = "sst5"
LEVELS = ["very negative", "negative", "neutral", "positive", "very positive"]
INSTRUCTIONS = "How positive is the sentiment of this movie review sentence?"
PTB_ESCAPES = {"-LRB-": "(", "-RRB-": ")", "-LSB-": "[", "-RSB-": "]", "-LCB-": "{", "-RCB-": "}"}
_ROOT = re.compile(r"^\(([0-4]) ")
_LEAF = re.compile(r"\(\d ([^()\s]+)\)")


def parse_tree(line: str) -> tuple[int, str]:
    """The root class and the text of one PTB tree line; ValueError when the line is not such a tree."""
    line = line.strip()
    root = _ROOT.match(line)
    leaves = _LEAF.findall(line)
    if root is None or not leaves or line.count("(") != line.count(")"):
        raise ValueError("line is not a labelled PTB tree '(label ...)' with labels 0..4")
    return int(root.group(1)), " ".join(PTB_ESCAPES.get(leaf, leaf) for leaf in leaves)


def iter_trees(path: str | Path) -> Iterator[Row]:
    """Rows ``{"text", "label"}`` of a PTB tree file, or an error per line that is not a tree."""
    name = Path(path).name
    with open_text(path) as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            where = f"{name}:{number}"
            try:
                label, text = parse_tree(line)
            except ValueError as err:
                yield where, line.rstrip("\r\n"), str(err)
                continue
            yield where, {"text": text, "label": label}, None


def level_of(value: Any) -> int:
    """The level index of a ``label`` cell (0..4 or a level name); ValueError naming the column."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < len(LEVELS):
        return value
    text = str(value).strip().lower() if value is not None else ""
    if text.isdigit() and 0 <= int(text) < len(LEVELS):
        return int(text)
    if text in LEVELS:
        return LEVELS.index(text)
    raise ValueError(f"column 'label': {value!r} is not a class 0..4 or one of {LEVELS}")


def _records(rows: Iterable[Row], split: str) -> Iterator[dict[str, Any]]:
    for where, row, error in rows:
        if error is not None:
            yield error_row(where, error, row)
            continue
        text = row.get("text")
        if not isinstance(text, str) or not text.strip():
            yield error_row(where, "column 'text' is missing or empty", row)
            continue
        try:
            level = level_of(row.get("label", row.get("label_text")))
        except ValueError as err:
            yield error_row(where, str(err), row)
            continue
        yield {
            "id": f"{TASK}-{split}-{where.rsplit(':', 1)[1]}",
            "task": TASK,
            "lang": "en",
            "state": text.strip(),
            "question": {"type": "score", "instructions": INSTRUCTIONS, "criteria": list(LEVELS)},
            "answer": level,
            "_where": where,
        }


def convert(
    path: str | None = None, *, limit: int | None = None, seed: int = 13, split: str = "train"
) -> Iterator[dict[str, Any]]:
    """Yield one score record per sentence of ``path`` (or of the Hugging Face split if ``path`` is None)."""
    if path is None:
        rows = iter_hub(load_hub(HUB_NAME, split), HUB_NAME, split)
        return capped(_records(rows, split), limit)
    existing(path)
    rows = iter_trees(path) if base_suffix(path) == ".txt" else iter_rows(path)
    return capped(_records(rows, file_stem(path)), limit)
