"""Span questions on a decoder, the model side: the forward passes over the sequences of
:mod:`mydecide.scoring.span_layout` and the yes − no reads at every word.

:func:`span_read_logits` reads a padded batch of sequences (gradients flow: training uses it), and
:func:`packed_block_reads` the blocks of ``layout: shared`` in a batch's packed rows; :func:`score_span_questions`
scores questions on a loaded model and returns each one's flat (W·L,) grid of log-odds (word-major), the span
analogue of a set question's (L,) logits; :func:`score_with_blocks` scores span blocks in the packed rows of their
states' other questions.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
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
from mydecide.scoring.render import Prompt
from mydecide.scoring.span_layout import SpanSequence, span_layout

if TYPE_CHECKING:
    import numpy as np
    import torch

    from mydecide.modeling import LoadedModel


def span_read_logits(
    lm: Any,
    sequences: Sequence[SpanSequence],
    label_ids: torch.Tensor,
    pad_id: int,
    device: Any = None,
) -> torch.Tensor:
    """The log-odds at every read of ``sequences`` (in order; a head sequence gives one per label at each read,
    word-major), one right-padded forward pass.

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
    return sequence_reads(lm, out.last_hidden_state, sequences, label_ids)


def sequence_reads(
    lm: Any,
    hidden: torch.Tensor,
    sequences: Sequence[SpanSequence],
    label_ids: torch.Tensor,
    rows: Sequence[int] | None = None,
    shifts: Sequence[int] | None = None,
) -> torch.Tensor:
    """The log-odds at every read of ``sequences`` (as :func:`span_read_logits`) from the (R, T, H) last hidden
    states of a forward pass already run: sequence n's position t is ``hidden[rows[n], t + shifts[n]]`` (default:
    row n, no shift; a packed row holds a block at another column than the block's position in its sequence)."""
    import torch

    device = hidden.device
    rows = list(range(len(sequences))) if rows is None else rows
    shifts = [0] * len(sequences) if shifts is None else shifts
    at, cols, index = [], [], []  # per read: its row in ``hidden``, its column there, its sequence
    for n, (seq, row, shift) in enumerate(zip(sequences, rows, shifts, strict=True)):
        at += [row] * len(seq.reads)
        cols += [read + shift for read in seq.reads]
        index += [n] * len(seq.reads)
    word_states = hidden[torch.tensor(at, device=device), torch.tensor(cols, device=device)]  # (M, H)
    index_t = torch.tensor(index, device=device)
    if sequences[0].label < 0:  # the span head: every word against every label line of its sequence
        from mydecide.scoring.span_head import span_head_of

        head = span_head_of(lm)
        if head is None:
            raise UserError(
                "prompt.span.read is 'head', but the model has no span head: it comes with an adapter (or a merged "
                "model) trained with it; an untrained model reads span questions with prompt.span.read=letters"
            )
        n = max(len(s.label_reads) for s in sequences)
        padded = [s.label_reads + s.label_reads[-1:] * (n - len(s.label_reads)) for s in sequences]
        shown = torch.tensor([[j < len(s.label_reads) for j in range(n)] for s in sequences], device=device)
        line_rows = torch.tensor([row for row, lines in zip(rows, padded, strict=True) for _ in lines], device=device)
        line_cols = [p + shift for lines, shift in zip(padded, shifts, strict=True) for p in lines]
        labels = hidden[line_rows, torch.tensor(line_cols, device=device)].reshape(len(sequences), n, -1)  # (N, L, H)
        return head(word_states, labels, index_t)[shown[index_t]]  # (M · L,) word-major per sequence
    weight, bias, softcap = output_head(lm)
    shown = torch.ones(len(at), 2, dtype=torch.bool, device=device)
    logits = read_option_logits(word_states, weight, label_ids[:2], shown, bias, softcap)  # (M, 2): A = yes, B = no
    return logits[:, 0] - logits[:, 1]


def packed_block_reads(
    lm: Any,
    batch: PackedBatch,
    sequences: Sequence[SpanSequence],
    first: int,
    label_ids: torch.Tensor,
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
    return logits, sequence_reads(lm, hidden, sequences, label_ids, rows, shifts)


def read_sequences(
    model: LoadedModel, sequences: Sequence[SpanSequence], batch_tokens: int = 8192
) -> list[list[float]]:
    """Each sequence's reads (yes − no), scored in batches of similar length of about ``batch_tokens`` padded tokens."""
    import torch

    label_ids = torch.tensor(model.renderer.label_ids, device=model.device)
    pad_id = model.tokenizer.pad_token_id
    index = sorted(range(len(sequences)), key=lambda i: len(sequences[i].ids))
    out: list[list[float]] = [[] for _ in sequences]
    start = 0
    with torch.inference_mode():
        while start < len(index):
            stop = start + 1
            while stop < len(index) and (stop - start + 1) * len(sequences[index[stop]].ids) <= batch_tokens:
                stop += 1
            chunk = [sequences[i] for i in index[start:stop]]
            values = span_read_logits(model.lm, chunk, label_ids, pad_id).double().cpu()
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
                values = sequence_reads(model.lm, hidden, seqs, label_ids, where, shifts).double().cpu()
                at_value = 0
                for k, seq in zip(read, seqs, strict=True):
                    reads[order[k] - n] = values[at_value : at_value + seq.n_values].tolist()
                    at_value += seq.n_values
            if progress:
                progress(len(asked))
    return logits, reads
