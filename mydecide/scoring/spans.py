"""Span questions on a decoder: sequences over windows of the text, a yes / no read at the last token of every word.

A span question (docs/spans.md) is decided as a word × label grid, read one of two ways (``prompt.span.read``):

- ``letters``: for each label the model reads one sequence: the chat template's head, the state's other parts
  (context), the question, the label and its description, then the text, so every word's position has seen what is
  asked. At the last token of each word the output head's rows of the answer letters ``A`` (yes) and ``B`` (no) are
  read; yes − no is the word's log-odds. No new parameters.
- ``head``: one sequence lists every label on its own line before the text, and the trained span head
  (``scoring.span_head``) scores each word's last token against each label's line, pooled over the line's tokens
  (name and description; ``label_read: last``: its last token): a third of the sequences for three labels, and no
  answer letters shared with the other question types.

Either way the log-odds of ``prompt.span.prior`` (when one is set) is added to every read. The head's sequence has
two layouts (``prompt.span.layout``): ``own``, above, or ``shared``: the prefix every other question of the state
shares (template head + state), then one block of question, label lines and a copy of the text, read there, so that
packed rows score it as one more question of its state (:func:`score_with_blocks`).

Each word is tokenised with the whitespace before it (``Renderer.encode_pieces``), so its tokens and its last token
are known exactly and character offsets need no mapping back from tokens. A long text is cut into windows of at most
``window_tokens`` text tokens at word boundaries, consecutive windows sharing about ``overlap_tokens``; every word is
read in exactly one window, the one where it is farthest from a cut edge (:func:`owners`: for a causal decoder that
is the window start, since a read never sees what follows it).

:func:`span_layout` builds the sequences of one question, :func:`span_read_logits` reads a padded batch of them
(gradients flow: training uses it), :func:`score_span_questions` scores questions on a loaded model and returns each
one's flat (W·L,) grid of log-odds (word-major), the span analogue of a set question's (L,) logits.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from mydecide.errors import UserError
from mydecide.records import Question
from mydecide.scoring.forward import (
    canonical_rows,
    decoder_of,
    output_head,
    packed_passes,
    read_option_logits,
    score_prompts,
)
from mydecide.scoring.packed import PackedBatch, pack, packed_hidden
from mydecide.scoring.render import Prompt, Renderer, render_state
from mydecide.spans import DEFAULT_PART, state_part, trim_edges, words

if TYPE_CHECKING:
    import numpy as np
    import torch

    from mydecide.scoring.model import LoadedModel


@dataclass(frozen=True)
class SpanSequence:
    """One label's sequence over one window: ``ids`` ends with the window's text; ``reads`` are the positions (in
    ``ids``) of the last token of the words this window owns, ``words`` their word indices.

    A span head's sequence (``label`` −1) lists every label: ``label_lines`` are the token ranges [start, stop) the
    head pools each label's read over (its whole line, or its last token with ``label_read: last``), in the order the
    lines are shown."""

    ids: tuple[int, ...]
    reads: tuple[int, ...]
    words: tuple[int, ...]
    label: int  # −1: every label (the span head's sequences)
    label_lines: tuple[tuple[int, int], ...] = ()
    line_labels: tuple[int, ...] = ()  # the question's label index of each line (empty: the question's order)
    word_starts: tuple[int, ...] = ()  # each read word's first token (``word_read: mean``); empty: its last token
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
        return len(self.reads) * max(1, len(self.label_lines))


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
    With ``both_edges`` (``echo``: the read has seen the whole window) the end costs context too.
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


ECHO_TEXT = "\n\nThe same text again:\n"
"""Between the two copies of a window with ``prompt.span.echo``."""
WINDOW_TEXT = "\n\nPart of the text:\n"
"""``layout: shared``: before a window's own first copy, in a block whose state prefix does not hold the whole text."""


def span_head(renderer: Renderer) -> str:
    """The chat template's text before the user's message (the renderer's head without the answer formats and its
    "State:" line: a span question says its own format)."""
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


def label_order(renderer: Renderer, question: Question) -> list[int]:
    """The order a span question's labels are shown and read in: by name (``label_order: sorted``), so the order a
    client lists them in changes nothing, or the question's own (``given``)."""
    if renderer.config.span.label_order == "given":
        return list(range(question.k))
    return sorted(range(question.k), key=lambda j: question.options[j])


def head_prompt(
    state: Any, question: Question, order: Sequence[int] | None = None, shared: bool = False
) -> tuple[str, list[str], str]:
    """The span head's user text before the text, in pieces: context and question, one line per label in ``order``
    (each after a newline; the head reads the label over it), how it is answered. ``shared``: the question's block
    after the state's prefix (which shows the whole state, so no context), opening as other questions do."""
    lines = ["", ""] if shared else context_lines(state, question)
    lines += [f"Question: {question.instructions}", "Labels:"]
    labels = [
        f"{question.options[j]}" + (f" — {question.descriptions[j]}" if question.descriptions[j] else "")
        for j in (range(question.k) if order is None else order)
    ]
    outro = "\nFor every word of the text below: which of these labels is it part of?\n\nText:\n"
    return "\n".join(lines), labels, outro


def head_prefix(
    renderer: Renderer, head: list[int], state: Any, question: Question, order: Sequence[int]
) -> tuple[list[int], tuple[tuple[int, int], ...]]:
    """The span head's sequence before the text (after the template's ``head`` ids), with the labels in ``order``,
    and the token range of each label's read: its line's tokens (``label_read: line``, the newline before it left
    out) or its last token (``last``). A long context keeps its last ``max_state_tokens`` + 200 tokens."""
    intro, labels, outro = head_prompt(state, question, order)
    return label_block(renderer, intro, labels, outro, head, renderer.config.max_state_tokens + 200)


def label_block(
    renderer: Renderer, intro: str, labels: Sequence[str], outro: str, before: Sequence[int], keep: int | None = None
) -> tuple[list[int], tuple[tuple[int, int], ...]]:
    """``before`` + the ids of ``intro`` (its last ``keep`` tokens), the label lines and ``outro``, and each label
    line's read range in them: its line's tokens (``label_read: line``, the newline before it left out) or its last
    token (``last``)."""
    if renderer.config.span.label_read == "last":  # as trained before lines were pooled: newline and line one piece
        pieces = renderer.encode_pieces([intro, *("\n" + line for line in labels), outro])
        lines: list[tuple[list[int], list[int]]] = [([], piece) for piece in pieces[1:-1]]
    else:  # the newline on its own, so the line's tokens are exactly its name and description
        pieces = renderer.encode_pieces([intro, *(p for line in labels for p in ("\n", line)), outro])
        lines = [(pieces[1 + 2 * j], pieces[2 + 2 * j]) for j in range(len(labels))]
    ids = list(before) + pieces[0][-keep if keep else 0 :]
    reads = []
    for newline, line in lines:
        ids += newline
        start = len(ids)
        ids += line
        reads.append((start, len(ids)) if renderer.config.span.label_read == "line" else (len(ids) - 1, len(ids)))
    return ids + pieces[-1], tuple(reads)


def shared_layout(renderer: Renderer) -> bool:
    """Whether span questions are read in a block after the state's shared prefix (``layout: shared``, head read)."""
    return renderer.config.span.read == "head" and renderer.config.span.layout == "shared"


def word_tokens(
    renderer: Renderer, part: str, offsets: Sequence[tuple[int, int]], core: bool = False
) -> tuple[list[list[int]], list[int]]:
    """Each word's token ids, the whitespace before it included (its last ``window_tokens`` when longer), and how
    many of them follow its read: 0 (the read is at its last token), or with ``core`` (``word_read: core``) the
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
    tokens, tails = word_tokens(renderer, part, offsets, core=span.read == "head" and span.word_read == "core")
    lengths = [len(t) for t in tokens]
    cuts = windows(lengths, size, overlap)
    shared = shared_layout(renderer)
    owner = owners(lengths, cuts, size, both_edges=span.echo or shared)
    order = label_order(renderer, question)
    mean_words = span.read == "head" and span.word_read == "mean"
    sequences = []

    def read_window(w: int, label: int, before: list[int], label_lines: tuple[tuple[int, int], ...], root: int) -> None:
        """The sequence ``before`` + window ``w``'s text, read at the words the window owns (if it owns any)."""
        (a, b), ids, reads, starts, owned = cuts[w], list(before), [], [], []
        for i in range(a, b):
            ids += tokens[i]
            if owner[i] == w:
                reads.append(len(ids) - 1 - tails[i])
                starts.append(len(ids) - len(tokens[i]))
                owned.append(i)
        if owned:
            lines = tuple(order) if label < 0 else ()
            sequence = SpanSequence(tuple(ids), tuple(reads), tuple(owned), label, label_lines, lines, root=root)
            sequences.append(replace(sequence, word_starts=tuple(starts)) if mean_words else sequence)

    if shared:
        root, truncated = renderer.encode_state(state)
        intro, labels, outro = head_prompt(state, question, order, shared=True)
        first = renderer.encode_pieces([WINDOW_TEXT])[0] if truncated else []
        for w, (a, b) in enumerate(cuts):
            before = list(root)
            if truncated:  # the prefix holds only part of the text: the window's own first copy
                before += first + [t for i in range(a, b) for t in tokens[i]]
            block, label_lines = label_block(renderer, intro, labels, outro, before)
            read_window(w, -1, block, label_lines, len(root))
        return SpanLayout(tuple(sequences), len(offsets), question.k)

    head = list(renderer.tokenizer(span_head(renderer), add_special_tokens=False)["input_ids"])
    echo = renderer.encode_pieces([ECHO_TEXT])[0] if span.echo else None
    prefixes: list[tuple[int, list[int], tuple[tuple[int, int], ...]]] = []  # (label, −1 for all; ids; lines)
    if span.read == "head":
        prefixes.append((-1, *head_prefix(renderer, head, state, question, order)))
    else:
        for label in order:
            prefix = renderer.encode_pieces([span_prompt(state, question, label)])[0]
            prefixes.append((label, head + prefix[-(renderer.config.max_state_tokens + 200) :], ()))
    for label, prefix, label_lines in prefixes:
        for w, (a, b) in enumerate(cuts):
            before = list(prefix)
            if echo is not None:  # the window once in full, then again with the reads: every read has seen it all
                before += [t for i in range(a, b) for t in tokens[i]] + echo
            read_window(w, label, before, label_lines, 0)
    return SpanLayout(tuple(sequences), len(offsets), question.k)


def pooled(hidden: torch.Tensor, rows: Sequence[int], ranges: Sequence[tuple[int, int]]) -> torch.Tensor:
    """(len(rows), H): the mean of ``hidden[row, start:stop]`` for each row and [start, stop) range, summed in
    float32 (a one-token range is that token's state, unchanged); gradients flow."""
    import torch

    device = hidden.device
    if all(stop - start == 1 for start, stop in ranges):
        return hidden[torch.tensor(list(rows), device=device), torch.tensor([b - 1 for _, b in ranges], device=device)]
    slot = [i for i, (a, b) in enumerate(ranges) for _ in range(a, b)]
    at_rows = torch.tensor([r for r, (a, b) in zip(rows, ranges, strict=True) for _ in range(a, b)], device=device)
    at_cols = torch.tensor([t for a, b in ranges for t in range(a, b)], device=device)
    sums = torch.zeros(len(ranges), hidden.shape[-1], dtype=torch.float32, device=device)
    sums = sums.index_add(0, torch.tensor(slot, device=device), hidden[at_rows, at_cols].float())
    counts = torch.tensor([b - a for a, b in ranges], dtype=torch.float32, device=device)
    return sums / counts.unsqueeze(1)


def span_read_logits(
    lm: Any,
    sequences: Sequence[SpanSequence],
    label_ids: torch.Tensor,
    pad_id: int,
    device: Any = None,
    offset: float = 0.0,
) -> torch.Tensor:
    """The log-odds at every read of ``sequences`` (in order; a head sequence gives one per label at each read,
    word-major), plus ``offset`` (``SpanWindows.offset``, the prior's log-odds), one right-padded forward pass.

    Right padding keeps every real token's position, and a causal decoder's output at a real token never depends on
    the padding after it; gradients flow when enabled.
    """
    import torch

    device = device if device is not None else label_ids.device
    width = max(len(s.ids) for s in sequences)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for r, seq in enumerate(sequences):
        ids[r, : len(seq.ids)] = torch.tensor(seq.ids, dtype=torch.long)
        mask[r, : len(seq.ids)] = 1
    out = decoder_of(lm)(input_ids=ids.to(device), attention_mask=mask.to(device), use_cache=False)
    return sequence_reads(lm, out.last_hidden_state, sequences, label_ids, offset=offset)


def sequence_reads(
    lm: Any,
    hidden: torch.Tensor,
    sequences: Sequence[SpanSequence],
    label_ids: torch.Tensor,
    rows: Sequence[int] | None = None,
    shifts: Sequence[int] | None = None,
    offset: float = 0.0,
) -> torch.Tensor:
    """The log-odds at every read of ``sequences`` (as :func:`span_read_logits`) from the (R, T, H) last hidden
    states of a forward pass already run: sequence n's position t is ``hidden[rows[n], t + shifts[n]]`` (default:
    row n, no shift; a packed row holds a block at another column than the block's position in its sequence)."""
    import torch

    device = hidden.device
    rows = list(range(len(sequences))) if rows is None else rows
    shifts = [0] * len(sequences) if shifts is None else shifts
    at, words, index = [], [], []  # per read: its row in ``hidden``, its token range there, its sequence
    for n, (seq, row, shift) in enumerate(zip(sequences, rows, shifts, strict=True)):
        at += [row] * len(seq.reads)
        index += [n] * len(seq.reads)
        starts = seq.word_starts or seq.reads
        words += [(start + shift, end + 1 + shift) for start, end in zip(starts, seq.reads, strict=True)]
    word_states = pooled(hidden, at, words)  # (M, H): each word's last token, or its tokens' mean
    index_t = torch.tensor(index, device=device)
    if sequences[0].label < 0:  # the span head: every word against every label line of its sequence
        from mydecide.scoring.span_head import span_head_of

        head = span_head_of(lm)
        if head is None:
            raise UserError(
                "prompt.span.read is 'head', but the model has no span head: it comes with an adapter (or a merged "
                "model) trained with it; an untrained model reads span questions with prompt.span.read=letters"
            )
        n = max(len(s.label_lines) for s in sequences)
        padded = [s.label_lines + s.label_lines[-1:] * (n - len(s.label_lines)) for s in sequences]
        shown = torch.tensor([[j < len(s.label_lines) for j in range(n)] for s in sequences], device=device)
        line_rows = [row for row, lines in zip(rows, padded, strict=True) for _ in lines]
        ranges = [(a + shift, b + shift) for lines, shift in zip(padded, shifts, strict=True) for a, b in lines]
        labels = pooled(hidden, line_rows, ranges).reshape(len(sequences), n, -1)  # (N, L, H)
        return head(word_states, labels, index_t)[shown[index_t]] + offset  # (M · L,) word-major per sequence
    weight, bias, softcap = output_head(lm)
    shown = torch.ones(len(at), 2, dtype=torch.bool, device=device)
    logits = read_option_logits(word_states, weight, label_ids[:2], shown, bias, softcap)  # (M, 2): A = yes, B = no
    return logits[:, 0] - logits[:, 1] + offset


def packed_block_reads(
    lm: Any,
    batch: PackedBatch,
    sequences: Sequence[SpanSequence],
    first: int,
    label_ids: torch.Tensor,
    offset: float = 0.0,
) -> tuple[torch.Tensor | None, torch.Tensor]:
    """One forward call over packed rows whose prompts ``first`` … are span blocks (``layout: shared`` sequences, in
    order): the (first, K) option logits of the prompts before them (None when there are none) and the blocks'
    reads, as :func:`span_read_logits` gives them (training's forward; gradients flow when enabled)."""
    assert batch.starts is not None
    hidden = packed_hidden(decoder_of(lm), batch)  # (B, T, H)
    logits = None
    if first:
        weight, bias, softcap = output_head(lm)
        last = hidden[batch.rows[:first], batch.cols[:first]]  # (first, H) each prompt's answer slot
        logits = read_option_logits(last, weight, label_ids, batch.option_mask[:first], bias, softcap)
    rows = batch.rows[first:].tolist()
    shifts = [start - s.root for start, s in zip(batch.starts[first:].tolist(), sequences, strict=True)]
    return logits, sequence_reads(lm, hidden, sequences, label_ids, rows, shifts, offset)


def read_sequences(
    model: LoadedModel, sequences: Sequence[SpanSequence], batch_tokens: int = 8192
) -> list[list[float]]:
    """Each sequence's reads (yes − no), scored in batches of similar length of about ``batch_tokens`` padded tokens."""
    import torch

    label_ids = torch.tensor(model.renderer.label_ids, device=model.device)
    offset, pad_id = model.renderer.config.span.offset, model.tokenizer.pad_token_id
    index = sorted(range(len(sequences)), key=lambda i: len(sequences[i].ids))
    out: list[list[float]] = [[] for _ in sequences]
    start = 0
    with torch.inference_mode():
        while start < len(index):
            stop = start + 1
            while stop < len(index) and (stop - start + 1) * len(sequences[index[stop]].ids) <= batch_tokens:
                stop += 1
            chunk = [sequences[i] for i in index[start:stop]]
            values = span_read_logits(model.lm, chunk, label_ids, pad_id, offset=offset).double().cpu()
            at = 0
            for i, seq in zip(index[start:stop], chunk, strict=True):
                out[i] = values[at : at + seq.n_values].tolist()
                at += seq.n_values
            start = stop
    return out


def score_span_questions(
    model: LoadedModel, items: Sequence[tuple[Any, Question]], batch_tokens: int = 8192
) -> list[np.ndarray]:
    """(W·L,) yes − no grid of each span (state, question), word-major; sigmoid gives P(word is part of label)."""
    layouts = [span_layout(model.renderer, state, question) for state, question in items]
    sequences = [seq for layout in layouts for seq in layout.sequences]
    reads = read_sequences(model, sequences, batch_tokens) if sequences else []
    out, at = [], 0
    for layout in layouts:
        n = len(layout.sequences)
        out.append(layout.grid(reads[at : at + n]))
        at += n
    return out


def score_with_blocks(
    model: LoadedModel,
    prompts: Sequence[Prompt],
    blocks: Sequence[SpanSequence],
    *,
    max_batch_tokens: int = 8192,
    progress: Callable[[int], None] | None = None,
) -> tuple[list[np.ndarray], list[list[float]]]:
    """The option logits of ``prompts`` (as ``forward.score_packed``) and the reads of span ``blocks`` (sequences of
    ``layout: shared``), in one set of packed rows: a block is one more question of its state, a child of the
    state's root (``packed.pack``), so the state is computed once for all of its questions, span ones included. A
    block sees the root and itself at the positions it has alone, so its reads equal the sequence read alone. A state
    whose row would be too long is read without packing (``score_prompts``, :func:`read_sequences`)."""
    import numpy as np
    import torch

    n = len(prompts)
    tree = [*prompts, *(Prompt(s.ids[: s.root], s.ids[s.root :], (0, 1)) for s in blocks)]
    passes, too_long = packed_passes(tree, max_batch_tokens)
    logits: list[np.ndarray] = [np.empty(0)] * n
    reads: list[list[float]] = [[] for _ in blocks]
    alone = [i for i in too_long if i < n]
    for i, z in zip(alone, score_prompts(model, [prompts[i] for i in alone]) if alone else [], strict=True):
        logits[i] = z
    alone = [i - n for i in too_long if i >= n]
    for j, block_reads in zip(alone, read_sequences(model, [blocks[j] for j in alone]) if alone else [], strict=True):
        reads[j] = block_reads
    decoder = decoder_of(model.lm)
    weight, bias, softcap = output_head(model.lm)
    label_ids = torch.tensor(model.renderer.label_ids, device=model.device)
    offset = model.renderer.config.span.offset
    with torch.inference_mode():
        for order in passes:
            batch = pack([tree[i] for i in order], model.tokenizer.pad_token_id).to(model.device)
            assert batch.starts is not None
            hidden = packed_hidden(decoder, batch)  # (B, T, H)
            asked = [k for k, i in enumerate(order) if i < n]
            if asked:
                at = torch.tensor(asked, device=model.device)
                last = hidden[batch.rows[at], batch.cols[at]]  # (N, H) each prompt's answer slot
                rows = read_option_logits(last, weight, label_ids, batch.option_mask[at], bias, softcap)
                shown = [prompts[order[k]] for k in asked]
                for k, row in zip(asked, canonical_rows(shown, rows.double().cpu().numpy()), strict=True):
                    logits[order[k]] = row
            read = [k for k, i in enumerate(order) if i >= n]
            if read:
                seqs = [blocks[order[k] - n] for k in read]
                where = [int(batch.rows[k]) for k in read]
                shifts = [int(batch.starts[k]) - seq.root for k, seq in zip(read, seqs, strict=True)]
                values = sequence_reads(model.lm, hidden, seqs, label_ids, where, shifts, offset).double().cpu()
                at_value = 0
                for k, seq in zip(read, seqs, strict=True):
                    reads[order[k] - n] = values[at_value : at_value + seq.n_values].tolist()
                    at_value += seq.n_values
            if progress:
                progress(len(asked))
    return logits, reads
