"""Span questions without a model: the state part a span question is asked over, its words, gold spans, the word ×
label grid and merging a grid of probabilities back into spans (docs/spans.md).

A span question asks where in one part of the state something is. The part is text; its **words** (units) are the
maximal runs of non-whitespace, each with Python string offsets (Unicode code points), so offsets are exact on any
text. Scripts written without spaces (Han, kana, Hangul, Thai, Lao, Khmer, Myanmar, …) and CJK punctuation are cut
further: each of their grapheme clusters is a unit of its own, so a name or a number inside such text can be
located (``请联系王小明，电话13812345678`` → 请 联 系 王 小 明 ， 电 话 13812345678).
The question is decided as a word × label grid of yes / no reads; a word is gold for a label when it overlaps a
gold span of that label, and adjacent words said yes (p ≥ 0.5) for the same label merge into one span.

Pure Python (no torch): the record schema (``records.py``), evaluation and serving all use it. A rule broken by a
record or a request raises ``ValueError`` whose message is the rule; the callers add where.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import regex

from mydecide.errors import UserError

DEFAULT_PART = "answer"
"""The part a span question without ``over`` is asked over when the state is an object of named parts."""
MAX_SPAN_LABELS = 32
SPAN_THRESHOLD = 0.5
_WORD = re.compile(r"\S+")
_NO_SPACE = regex.compile(
    r"[\p{scx=Han}\p{scx=Hiragana}\p{scx=Katakana}\p{scx=Bopomofo}\p{scx=Hangul}\p{scx=Yi}\p{scx=Thai}"
    r"\p{scx=Lao}\p{scx=Khmer}\p{scx=Myanmar}\p{scx=Tibetan}\p{Block=CJK_Symbols_and_Punctuation}"
    r"\uFF01-\uFF0F\uFF1A-\uFF20\uFF3B-\uFF40\uFF5B-\uFF65]"
)
"""A character of a script written without spaces between words, or CJK (fullwidth) punctuation: a unit alone."""
_CLUSTER = regex.compile(r"\X")
EDGE_PUNCTUATION = ".,;:!?\"'`。、，．；：！？・…"
"""Trimmed from both ends of a merged span (words keep their punctuation: ``Anna,`` ``Friday.``)."""
BRACKETS = {
    "(": ")",
    "[": "]",
    "{": "}",
    "<": ">",
    "（": "）",
    "「": "」",
    "『": "』",
    "【": "】",
    "《": "》",
    "〈": "〉",
}


@dataclass(frozen=True, order=True)
class Span:
    """A located piece of text: ``part[start:end]`` (code points, end exclusive) is an instance of ``label``."""

    start: int
    end: int
    label: str

    def to_json(self, part: str) -> dict[str, Any]:
        return {"label": self.label, "start": self.start, "end": self.end, "text": part[self.start : self.end]}


def words(text: str) -> list[tuple[int, int]]:
    """(start, end) of every unit of ``text``, in order: maximal runs of non-whitespace, where a grapheme cluster of a
    script written without spaces (or CJK punctuation) is a unit of its own and the runs between such clusters are
    units too. Text without such characters is cut at whitespace only."""
    out: list[tuple[int, int]] = []
    for match in _WORD.finditer(text):
        start, end = match.span()
        run = match.group()
        if not _NO_SPACE.search(run):
            out.append((start, end))
            continue
        begun: int | None = None  # where the current run of other clusters began
        for cluster in _CLUSTER.finditer(run):
            a, b = start + cluster.start(), start + cluster.end()
            if _NO_SPACE.match(cluster.group()):
                if begun is not None:
                    out.append((begun, a))
                    begun = None
                out.append((a, b))
            elif begun is None:
                begun = a
        if begun is not None:
            out.append((begun, end))
    return out


def state_part(state: Any, over: str | None) -> str:
    """The text a span question with ``over`` is asked over: a plain-text state is itself (``over`` absent), an
    object state its part ``over`` (default ``"answer"``)."""
    if isinstance(state, str):
        if over is not None:
            raise UserError(f"over names the part {over!r}, but the state is plain text (it has no named parts)")
        return state
    if not isinstance(state, dict):
        raise UserError("a span question needs a state that is text or an object of named text parts")
    name = DEFAULT_PART if over is None else over
    known = sorted(k for k, v in state.items() if isinstance(v, str))
    if name not in state:
        default = " (the default part when over is absent)" if over is None else ""
        raise UserError(f"over part {name!r}{default} is not in the state; its text parts are {known}")
    if not isinstance(state[name], str):
        raise UserError(f"over part {name!r} is not text; the state's text parts are {known}")
    return str(state[name])


def parse_gold_spans(answer: Any, part: str, labels: Sequence[str]) -> tuple[Span, ...]:
    """Validate a span answer (a list of ``{"label", "start", "end"[, "text"]}``) against its part and labels."""
    if not isinstance(answer, list):
        raise UserError('span answer must be a list of {"label", "start", "end"} objects (empty: nothing to find)')
    spans = []
    for n, item in enumerate(answer):
        where = f"span answer[{n}]"
        if not isinstance(item, dict):
            raise UserError(f'{where} must be an object {{"label", "start", "end"}}')
        unknown = set(item) - {"label", "start", "end", "text"}
        missing = {"label", "start", "end"} - set(item)
        if unknown or missing:
            raise UserError(f"{where} has unknown key(s) {sorted(unknown)} / lacks {sorted(missing)}")
        label, start, end = item["label"], item["start"], item["end"]
        if label not in labels:
            raise UserError(f"{where}: label {label!r} is not one of the labels {list(labels)}")
        if any(isinstance(v, bool) or not isinstance(v, int) for v in (start, end)):
            raise UserError(f"{where}: start and end must be integers (character offsets)")
        if not 0 <= start < end <= len(part):
            raise UserError(
                f"{where}: offsets {start}..{end} are outside the text (need 0 <= start < end <= {len(part)})"
            )
        if not part[start:end].strip():
            raise UserError(
                f"{where}: offsets {start}..{end} hold only whitespace ({part[start:end]!r}), no word to mark"
            )
        if "text" in item and item["text"] != part[start:end]:
            raise UserError(f"{where}: text {item['text']!r} is not the text at {start}..{end} ({part[start:end]!r})")
        spans.append(Span(start, end, label))
    spans.sort()
    last_end: dict[str, Span] = {}
    for span in spans:
        before = last_end.get(span.label)
        if before is not None and span.start < before.end:
            raise UserError(
                f"span answer: gold spans {before.start}..{before.end} and {span.start}..{span.end} of label "
                f"{span.label!r} overlap (spans of one label may not)"
            )
        if before is None or span.end > before.end:
            last_end[span.label] = span
    return tuple(spans)


def span_gold(
    record: dict[str, Any], state: Any, question: Any, error: type[Exception] = ValueError
) -> tuple[Span, ...]:
    """A span record's gold spans: its ``answer`` (or ``expected``), a list of spans in the question's part; no soft
    target. A broken rule raises ``error`` (``records.RecordError``) with the rule."""
    try:
        if record.get("target") is not None:
            raise UserError("span questions take an answer (a list of spans); a soft target is not supported")
        if record.get("answer") is not None and record.get("expected") is not None:
            raise UserError("give either answer or its alias expected, not both")
        answer = record["answer"] if record.get("answer") is not None else record.get("expected")
        if answer is None:
            raise UserError("record has no gold label: give answer (or expected), a list of spans")
        return parse_gold_spans(answer, state_part(state, question.over), question.options)
    except ValueError as err:
        raise error(str(err)) from None


def grid_target(state: Any, question: Any, spans: Sequence[Span]) -> tuple[float, ...]:
    """The word × label grid of a span question, row-major (word, then label): 1.0 where the word overlaps a gold
    span of the label."""
    labels = question.options
    offsets = words(state_part(state, question.over))
    column = {label: j for j, label in enumerate(labels)}
    grid = [0.0] * (len(offsets) * len(labels))
    for span in spans:
        for i, (start, end) in enumerate(offsets):
            if start < span.end and span.start < end:
                grid[i * len(labels) + column[span.label]] = 1.0
    return tuple(grid)


def trim_edges(part: str, start: int, end: int) -> tuple[int, int]:
    """``start, end`` without the punctuation at the span's edges (:data:`EDGE_PUNCTUATION`, a bracket pair around the
    whole span, a bracket the span does not close or open: ``<bo@ek.se>,`` → ``bo@ek.se``, ``(555) 123`` stays);
    unchanged if nothing would be left."""
    a, b = start, end
    while a < b:
        c = part[b - 1]
        if (
            b - a > 2
            and BRACKETS.get(part[a]) == c
            and part.count(part[a], a + 1, b - 1) == part.count(c, a + 1, b - 1)
        ):
            a, b = a + 1, b - 1  # a bracket pair around the whole span: <bo@ek.se>
            continue
        opening = next((o for o, e in BRACKETS.items() if e == c), None)
        if c in EDGE_PUNCTUATION or (opening and part.count(opening, a, b) < part.count(c, a, b)):
            b -= 1
        elif part[a] in EDGE_PUNCTUATION or (
            part[a] in BRACKETS and part.count(part[a], a, b) > part.count(BRACKETS[part[a]], a, b)
        ):
            a += 1
        else:
            break
    return (a, b) if a < b else (start, end)


@dataclass(frozen=True)
class SpanDecisions:
    """How a grid of word probabilities becomes answered spans: the threshold of each label (``thresholds``; any
    other label: ``default``), and the map of a span's mean word probability to its reported probability,
    sigmoid(``slope`` · logit(p) + ``intercept``). ``exclusive``: one label per word (where several labels pass
    their thresholds, the word goes to the most probable one), fitted on dev where its gold spans never share a word
    across labels. Fitted on dev by ``mydecide calibrate`` (``calibration/spans.py``); the defaults (0.5 for every
    label, the mean itself, labels independent) are what an uncalibrated model answers with."""

    default: float = SPAN_THRESHOLD
    thresholds: tuple[tuple[str, float], ...] = ()
    slope: float = 1.0
    intercept: float = 0.0
    exclusive: bool = False

    def threshold(self, label: str) -> float:
        return dict(self.thresholds).get(label, self.default)

    def probability(self, mean: float) -> float:
        """The reported probability of a span whose words' mean probability is ``mean``."""
        if self.slope == 1.0 and self.intercept == 0.0:
            return float(mean)
        p = min(max(float(mean), 1e-6), 1 - 1e-6)
        z = self.slope * math.log(p / (1 - p)) + self.intercept
        return 1.0 / (1.0 + math.exp(-z)) if z >= 0 else math.exp(z) / (1.0 + math.exp(z))


def merge_spans(
    part: str, probabilities: Sequence[float], labels: Sequence[str], decisions: SpanDecisions | None = None
) -> list[dict[str, Any]]:
    """Spans from a flat word × label grid of P(yes): adjacent words at or above their label's threshold (0.5, or
    ``decisions``; with ``decisions.exclusive`` a word counts only for its most probable passing label) merge (start
    of the first word, end of the last, then :func:`trim_edges`: a word keeps its punctuation, a span does not); a
    span's probability is the mean of its words' (through ``decisions``' map). Sorted by (start, label)."""
    decisions = decisions or SpanDecisions()
    offsets = words(part)
    if len(probabilities) != len(offsets) * len(labels):
        raise ValueError(f"{len(probabilities)} grid values for {len(offsets)} words × {len(labels)} labels")
    k, cut = len(labels), [decisions.threshold(label) for label in labels]
    passes = [[probabilities[i * k + j] >= cut[j] for j in range(k)] for i in range(len(offsets))]
    if decisions.exclusive:  # each word keeps only its most probable passing label (the first listed on a tie)
        for i, row in enumerate(passes):
            if sum(row) > 1:
                best = max((j for j in range(k) if row[j]), key=lambda j: (probabilities[i * k + j], -j))
                passes[i] = [j == best for j in range(k)]
    found = []
    for j, label in enumerate(labels):
        run: list[int] = []
        for i in range(len(offsets) + 1):
            if i < len(offsets) and passes[i][j]:
                run.append(i)
                continue
            if run:
                p = sum(probabilities[w * len(labels) + j] for w in run) / len(run)
                span = Span(*trim_edges(part, offsets[run[0]][0], offsets[run[-1]][1]), label)
                found.append({**span.to_json(part), "probability": decisions.probability(p)})
                run = []
    return sorted(found, key=lambda s: (s["start"], s["label"]))


def spans_of_grid(part: str, grid: Sequence[float], labels: Sequence[str]) -> tuple[Span, ...]:
    """The spans a 0 / 1 (or probability) grid marks, as :class:`Span` (gold grids map back to word-aligned spans)."""
    return tuple(Span(s["start"], s["end"], s["label"]) for s in merge_spans(part, grid, labels))
