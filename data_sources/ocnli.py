"""OCNLI (Original Chinese NLI, CLUE): does a Chinese premise entail, contradict or leave open a hypothesis.

A 3-way choice between ``entailment``, ``neutral`` and ``contradiction``. The state is the JSON object
``{"premise": sentence1, "hypothesis": sentence2}`` in Chinese (lang ``zh``); the question is asked in English
so that one model shares its instructions across languages. Rows whose label is ``-`` (the annotators reached
no majority) or missing are error rows, so they are counted rather than silently dropped.

Local files in the published layout: OCNLI's ``train.50k.json`` / ``train.3k.json`` / ``dev.json`` (one JSON
object per line with ``sentence1``, ``sentence2``, ``label``, ``genre``, …), or exports of the Hugging Face
dataset ``clue/clue`` (config ``ocnli``: ``sentence1``, ``sentence2``, ``label`` as a class index 0 neutral, 1
entailment, 2 contradiction, or -1 when unlabelled). The split name in ids is the file's stem. With no path
``clue/clue`` ``ocnli`` is loaded (online), ``split`` ``train`` or ``validation``.

Records: task ``ocnli``, id ``ocnli-<split>-<line or row>``; the row's ``genre`` goes to ``meta``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from data_sources._files import Row, capped, error_row, existing, file_stem, iter_hub, iter_rows, load_hub

HUB_NAME, HUB_CONFIG = "clue/clue", "ocnli"
TASK = "ocnli"
INSTRUCTIONS = "Given the premise, is the hypothesis true, false, or undetermined?"
CRITERIA = {
    "entailment": "The premise entails the hypothesis: it must be true",
    "neutral": "The premise neither entails nor contradicts the hypothesis: it may or may not be true",
    "contradiction": "The premise contradicts the hypothesis: it must be false",
}
# Class indices of the Hugging Face export (the ClassLabel of clue/clue, config ocnli, as in CLUE's baselines).
CLASS_NAMES = ("neutral", "entailment", "contradiction")


def label_of(value: Any, names: Sequence[str]) -> str:
    """The NLI label of a ``label`` cell (a name, or a class index into ``names``); ValueError naming it."""
    if isinstance(value, int) and not isinstance(value, bool):
        if value == -1:
            raise ValueError("column 'label' is -1: the row is unlabelled")
        if not 0 <= value < len(names):
            raise ValueError(f"column 'label': class index {value} is outside 0..{len(names) - 1}")
        value = names[value]
    text = str(value).strip() if value is not None else ""
    if text == "-":
        raise ValueError("column 'label' is '-': the annotators reached no majority label")
    if text not in CRITERIA:
        raise ValueError(f"column 'label': {value!r} is not one of {list(CRITERIA)}")
    return text


def _records(rows: Iterable[Row], split: str, names: Sequence[str]) -> Iterator[dict[str, Any]]:
    for where, row, error in rows:
        if error is not None:
            yield error_row(where, error, row)
            continue
        premise, hypothesis = row.get("sentence1"), row.get("sentence2")
        if not isinstance(premise, str) or not premise.strip():
            yield error_row(where, "column 'sentence1' (the premise) is missing or empty", row)
            continue
        if not isinstance(hypothesis, str) or not hypothesis.strip():
            yield error_row(where, "column 'sentence2' (the hypothesis) is missing or empty", row)
            continue
        try:
            label = label_of(row.get("label"), names)
        except ValueError as err:
            yield error_row(where, str(err), row)
            continue
        record: dict[str, Any] = {
            "id": f"{TASK}-{split}-{where.rsplit(':', 1)[1]}",
            "task": TASK,
            "lang": "zh",
            "state": {"premise": premise.strip(), "hypothesis": hypothesis.strip()},
            "question": {"type": "choice", "instructions": INSTRUCTIONS, "criteria": dict(CRITERIA)},
            "answer": label,
            "_where": where,
        }
        if row.get("genre"):
            record["meta"] = {"genre": str(row["genre"])}
        yield record


def convert(
    path: str | None = None, *, limit: int | None = None, seed: int = 13, split: str = "train"
) -> Iterator[dict[str, Any]]:
    """Yield one choice record per sentence pair of ``path`` (or of the Hugging Face split if no path)."""
    if path is None:
        dataset = load_hub(HUB_NAME, split, HUB_CONFIG)
        names = list(dataset.features["label"].names)
        return capped(_records(iter_hub(dataset, HUB_NAME, split), split, names), limit)
    existing(path)
    return capped(_records(iter_rows(path), file_stem(path), CLASS_NAMES), limit)
