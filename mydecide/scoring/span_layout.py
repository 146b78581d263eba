"""Span questions on a decoder, the text side: a question's text cut into windows, and the token sequences that read
every word of it (:func:`span_layout`); :mod:`mydecide.scoring.span_reads` runs them.

A span question (docs/spans.md) is decided as a word × label grid, read one of two ways (``prompt.span.read``):

- ``letters``: for each label the model reads one sequence: the chat template's head, the state's other parts
  (context), the question, the label and its description, then the text, so every word's position has seen what is
  asked. At the last token of each word the output head's rows of the answer letters ``A`` (yes) and ``B`` (no) are
  read; yes − no is the word's log-odds. No new parameters.
- ``head``: one sequence lists every label on its own line, sorted by name, before the text, and the trained span
  head (``scoring.span_head``) scores each word against each label at the last token of the label's line: a third of
  the sequences for three labels, and no answer letters shared with the other question types. A word is read at the
  last token of what a span keeps of it (the punctuation a span would trim from its end comes after the read).

The head's sequence has two layouts (``prompt.span.layout``): ``own``, above, or ``shared``: the prefix every other
question of the state shares (template head + state), then one block of question, label lines and a copy of the
text, read there, so that packed rows score it as one more question of its state (``span_reads.score_with_blocks``).

Each word is tokenised with the whitespace before it (``Renderer.encode_pieces``), so its tokens and its last token
are known exactly and character offsets need no mapping back from tokens. A long text is cut into windows of at most
``window_tokens`` text tokens at word boundaries, consecutive windows sharing about ``overlap_tokens``; every word is
read in exactly one window, the one where it is farthest from a cut edge (:func:`owners`: for a causal decoder that
is the window start, since a read never sees what follows it).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from mydecide.records import Question
from mydecide.scoring.render import Renderer, render_state
from mydecide.spans import DEFAULT_PART, state_part, trim_edges, words

if TYPE_CHECKING:
    import numpy as np


@dataclass(frozen=True)
class SpanSequence:
    """One label's sequence over one window: ``ids`` ends with the window's text; ``reads`` are the positions (in
    ``ids``) of the token each word this window owns is read at, ``words`` their word indices.

    A span head's sequence (``label`` −1) lists every label: ``label_reads`` are the positions of each label line's
    last token, where the head reads the label, in the order the lines are shown."""

    ids: tuple[int, ...]
    reads: tuple[int, ...]
    words: tuple[int, ...]
    label: int  # −1: every label (the span head's sequences)
    label_reads: tuple[int, ...] = ()
    line_labels: tuple[int, ...] = ()  # the question's label index of each line (empty: the question's order)
    # ``layout: shared``: how many of ``ids`` are the state's shared prefix (template head + state, ``Prompt.root``),
    # which a packed row computes once for every question of the state; the rest is the question's block. 0: a
    # sequence of its own
    root: int = 0

    def cells(self, n_labels: int) -> list[int]:
        """The flat grid index of each of this sequence's values, in the order they are read (word-major)."""
        if self.label < 0:
            return [w * n_labels + j for w in self.words for j in (self.line_labels or range(n_labels))]
        return [w * n_labels + self.label for w in self.words]

    @property
    def n_values(self) -> int:
        return len(self.reads) * max(1, len(self.label_reads))


@dataclass(frozen=True)
class SpanLayout:
    """Every sequence of one span question; ``grid`` assembles their reads into the flat (W·L,) word-major grid."""

    sequences: tuple[SpanSequence, ...]
    n_words: int
    n_labels: int

    def grid(self, reads: Sequence[Sequence[float]]) -> np.ndarray:
        """(W·L,) yes − no values from each sequence's reads (in the order of ``sequences``)."""
        import numpy as np

        out = np.full(self.n_words * self.n_labels, np.nan)
        for seq, values in zip(self.sequences, reads, strict=True):
            out[seq.cells(self.n_labels)] = values
        if np.isnan(out).any():
            raise ValueError("some word × label cells were not read")
        return out


def windows(lengths: Sequence[int], size: int, overlap: int) -> list[tuple[int, int]]:
    """Word ranges [a, b) of the windows: at most ``size`` tokens each (a longer word alone counts ``size``), each
    window starting where the previous one's last ≤ ``overlap`` tokens of whole words begin."""
    out: list[tuple[int, int]] = []
    a, n = 0, len(lengths)
    while a < n:
        b, total = a, 0
        while b < n and (b == a or total + min(lengths[b], size) <= size):
            total += min(lengths[b], size)
            b += 1
        out.append((a, b))
        if b >= n:
            break
        start, tail = b, 0
        while start - 1 > a and tail + lengths[start - 1] <= overlap:
            start -= 1
            tail += lengths[start]
        a = start
    return out


def owners(lengths: Sequence[int], cuts: Sequence[tuple[int, int]], size: int, both_edges: bool = False) -> list[int]:
    """For every word, the window it is read in: where its last token is farthest from a cut edge of the window (the
    text's own start and end are no edges); ties go to the earlier window.

    A causal decoder's read at a word sees only the tokens before it, so a window's end never changes a read: the
    edge that costs context is the start, and the overlap is there to give the next window's first words context.
    With ``both_edges`` (``layout: shared``: the read has seen the whole window) the end costs context too.
    """
    best: list[tuple[float, int]] = [(-1.0, -1)] * len(lengths)
    for w, (a, b) in enumerate(cuts):
        ends = list(itertools.accumulate(min(lengths[i], size) for i in range(a, b)))
        for i, end in zip(range(a, b), ends, strict=True):
            left = end - 1 if a > 0 else math.inf
            right = ends[-1] - end if both_edges and b < len(lengths) else math.inf
            if min(left, right) > best[i][0]:
                best[i] = (min(left, right), w)
    return [w for _, w in best]


WINDOW_TEXT = "\n\nPart of the text:\n"
"""``layout: shared``: before a window's own first copy, in a block whose state prefix does not hold the whole text."""


def span_head(renderer: Renderer) -> str:
    """The chat template's text before the user's message (the renderer's head without its "State:" line: a span
    question says its own format)."""
    return renderer.template_head


def context_lines(state: Any, question: Question) -> list[str]:
    """The state's parts other than the one a span question is asked over, shown before the question."""
    if not isinstance(state, dict):
        return []
    part = DEFAULT_PART if question.over is None else question.over
    context = {k: v for k, v in state.items() if k != part}
    return ["Context:", render_state(context), ""] if context else []


def span_prompt(state: Any, question: Question, label: int) -> str:
    """The user text before a span question's text: context parts, the question, one label, how it is answered."""
    name, description = question.options[label], question.descriptions[label]
    lines = context_lines(state, question)
    lines += [
        f"Question: {question.instructions}",
        f"Label: {name}" + (f" — {description}" if description else ""),
        f"For every word of the text below: is it part of a {name}? A. yes, B. no",
        "",
        "Text:",
        "",
    ]
    return "\n".join(lines)


def label_order(question: Question) -> list[int]:
    """The order a span question's labels are shown and read in: by name, so the order a client lists them in
    changes nothing."""
    return sorted(range(question.k), key=lambda j: question.options[j])


def head_prompt(
    state: Any, question: Question, order: Sequence[int] | None = None, shared: bool = False
) -> tuple[str, list[str], str]:
    """The span head's user text before the text, in pieces: context and question, one line per label in ``order``
    (each after a newline; the head reads the label at its last token), how it is answered. ``shared``: the
    question's block after the state's prefix (which shows the whole state, so no context), opening as other
    questions do."""
    lines = ["", ""] if shared else context_lines(state, question)
    lines += [f"Question: {question.instructions}", "Labels:"]
    labels = [
        f"{question.options[j]}" + (f" — {question.descriptions[j]}" if question.descriptions[j] else "")
        for j in (range(question.k) if order is None else order)
    ]
    outro = "\nFor every word of the text below: which of these labels is it part of?\n\nText:\n"
    return "\n".join(lines), labels, outro


def label_block(
    renderer: Renderer, intro: str, labels: Sequence[str], outro: str, before: Sequence[int], keep: int | None = None
) -> tuple[list[int], tuple[int, ...]]:
    """``before`` + the ids of ``intro`` (its last ``keep`` tokens), the label lines (each encoded with the newline
    before it) and ``outro``, and the position of each label line's last token in them."""
    pieces = renderer.encode_pieces([intro, *("\n" + line for line in labels), outro])
    ids = list(before) + pieces[0][-keep if keep else 0 :]
    reads = []
    for line in pieces[1:-1]:
        ids += line
        reads.append(len(ids) - 1)
    return ids + pieces[-1], tuple(reads)


def shared_layout(renderer: Renderer) -> bool:
    """Whether span questions are read in a block after the state's shared prefix (``layout: shared``, head read)."""
    return renderer.config.span.read == "head" and renderer.config.span.layout == "shared"


def word_tokens(
    renderer: Renderer, part: str, offsets: Sequence[tuple[int, int]], core: bool = False
) -> tuple[list[list[int]], list[int]]:
    """Each word's token ids, the whitespace before it included (its last ``window_tokens`` when longer), and how
    many of them follow its read: 0 (the read is at its last token), or with ``core`` (the span head's read) the
    tokens of the punctuation a span would trim from the word's end (:func:`~mydecide.spans.trim_edges`), encoded as
    a piece of its own after the rest of the word, so the read is at the last token of what a span keeps."""
    starts = [offsets[i - 1][1] if i else 0 for i in range(len(offsets))]
    cuts = [trim_edges(part, a, b)[1] if core else b for a, b in offsets]
    # (whitespace + what a span keeps, the trimmed punctuation after it); the first is never empty
    pairs = [(part[s:c], part[c:b]) for s, c, (_, b) in zip(starts, cuts, offsets, strict=True)]
    encoded = iter(renderer.encode_pieces([p for pair in pairs for p in pair if p]) if pairs else [])
    tokens, tails = [], []
    for _, trimmed in pairs:
        kept_part, after = next(encoded), next(encoded) if trimmed else []
        kept = (kept_part + after)[-renderer.config.span.window_tokens :]
        tokens.append(kept)
        tails.append(min(len(after), len(kept) - 1))
    return tokens, tails


def span_layout(renderer: Renderer, state: Any, question: Question) -> SpanLayout:
    """The sequences of one span question: one per label and window (``read: letters``), or one per window with
    every label (``read: head``); every word × label cell read once.

    ``layout: shared`` (head read): each window's sequence is the state's prefix (``Renderer.encode_state``, the
    root every question of the state shares) and then one block: the question, the label lines, then the window's
    text, read there. Where the prefix does not hold the whole text (a state cut by ``max_state_tokens``) the block
    first shows the window itself (``WINDOW_TEXT``), so every read has seen all labels and the whole window."""
    if question.type != "span":
        raise ValueError(f"a {question.type} question has no span layout")
    part = state_part(state, question.over)
    offsets = words(part)
    span = renderer.config.span
    size, overlap = span.window_tokens, span.overlap_tokens
    tokens, tails = word_tokens(renderer, part, offsets, core=span.read == "head")
    lengths = [len(t) for t in tokens]
    cuts = windows(lengths, size, overlap)
    shared = shared_layout(renderer)
    owner = owners(lengths, cuts, size, both_edges=shared)
    order = label_order(question)
    sequences = []

    def read_window(w: int, label: int, before: list[int], label_reads: tuple[int, ...], root: int) -> None:
        """The sequence ``before`` + window ``w``'s text, read at the words the window owns (if it owns any)."""
        (a, b), ids, reads, owned = cuts[w], list(before), [], []
        for i in range(a, b):
            ids += tokens[i]
            if owner[i] == w:
                reads.append(len(ids) - 1 - tails[i])
                owned.append(i)
        if owned:
            lines = tuple(order) if label < 0 else ()
            sequences.append(SpanSequence(tuple(ids), tuple(reads), tuple(owned), label, label_reads, lines, root))

    if shared:
        root, truncated = renderer.encode_state(state)
        intro, labels, outro = head_prompt(state, question, order, shared=True)
        first = renderer.encode_pieces([WINDOW_TEXT])[0] if truncated else []
        for w, (a, b) in enumerate(cuts):
            before = list(root)
            if truncated:  # the prefix holds only part of the text: the window's own first copy
                before += first + [t for i in range(a, b) for t in tokens[i]]
            block, label_reads = label_block(renderer, intro, labels, outro, before)
            read_window(w, -1, block, label_reads, len(root))
        return SpanLayout(tuple(sequences), len(offsets), question.k)

    head = list(renderer.tokenizer(span_head(renderer), add_special_tokens=False)["input_ids"])
    keep = renderer.config.max_state_tokens + 200  # a long context keeps its last tokens
    if span.read == "head":
        intro, labels, outro = head_prompt(state, question, order)
        block, label_reads = label_block(renderer, intro, labels, outro, head, keep)
        for w in range(len(cuts)):
            read_window(w, -1, block, label_reads, 0)
    else:
        for label in order:
            prefix = renderer.encode_pieces([span_prompt(state, question, label)])[0]
            for w in range(len(cuts)):
                read_window(w, label, head + prefix[-keep:], (), 0)
    return SpanLayout(tuple(sequences), len(offsets), question.k)
