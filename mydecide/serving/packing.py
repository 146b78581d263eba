"""Packed shared-prefix scoring: a state and all of its questions in one sequence, without padding.

``score_prompts`` shares a state by running its prefix once and then every question as a right-padded row that
continues from the prefix's KV cache, so each question row is padded to the longest question of the batch. On a
CPU, where a forward pass costs in proportion to the tokens it processes, that padding eats much of the saving.
Packing lays one state out as a single row::

    [ prefix | question 1 | question 2 | … ]      positions: 0..P-1, then P.. again for every question

with an attention mask under which each question sees the whole prefix and itself (causally), never another
question. Every question token is then computed exactly as if its question were scored alone after the prefix,
and the row holds ``P + ΣS`` real tokens. Rows of different states are left-padded into one batch.

This needs every layer to be plain attention with positions taken from ``position_ids`` and a custom 4-D mask
(Llama, Qwen2/3, SmolLM and similar, with the sdpa or eager kernels). Recurrent layers (Gated DeltaNet in Qwen3.5)
cannot skip over the other questions, so such models keep ``score_prompts``. :func:`packing_agrees` checks a model
against ``score_prompts`` before the server relies on it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from mydecide.scoring.forward import decoder_of, output_head, read_option_logits, score_prompts
from mydecide.scoring.probabilities import to_probabilities

if TYPE_CHECKING:
    import numpy as np
    import torch

    from mydecide.modeling import LoadedModel
    from mydecide.scoring.render import Prompt

PACKABLE_KERNELS = ("sdpa", "eager")
MAX_ROW_TOKENS = 4096  # longer rows (a (L, L) mask per row) go through score_prompts


def supports_packing(lm: Any) -> bool:
    """Whether the model's layers are all full attention driven by ``position_ids`` and a 4-D mask."""
    base = lm.get_base_model() if hasattr(lm, "get_base_model") else lm
    config = base.config
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None and any(t != "full_attention" for t in layer_types):
        return False
    if getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True):
        return False
    return getattr(config, "_attn_implementation", None) in PACKABLE_KERNELS


@dataclass
class PackedBatch:
    """``input_ids``/``position_ids`` (B, L) left-padded rows; ``mask`` (B, 1, L, L) additive; ``rows``/``cols``
    (N,) where each of the N prompts ends (its answer slot); ``option_mask`` (N, K)."""

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    mask: torch.Tensor
    rows: torch.Tensor
    cols: torch.Tensor
    option_mask: torch.Tensor


def pack(groups: Sequence[tuple[tuple[int, ...], Sequence[Prompt]]], pad_id: int, dtype: torch.dtype) -> PackedBatch:
    """Lay out each (prefix, its prompts) group as one row; prompts are read in group order."""
    import torch

    lengths = [len(prefix) + sum(len(p.suffix) for p in prompts) for prefix, prompts in groups]
    width = max(lengths)
    n_rows = len(groups)
    ids = torch.full((n_rows, width), pad_id, dtype=torch.long)
    pos = torch.zeros((n_rows, width), dtype=torch.long)
    allowed = torch.zeros((n_rows, width, width), dtype=torch.bool)
    rows, cols, ks = [], [], []
    for r, ((prefix, prompts), length) in enumerate(zip(groups, lengths, strict=True)):
        start = width - length  # left padding
        p_len = len(prefix)
        ids[r, start : start + p_len] = torch.tensor(prefix, dtype=torch.long)
        pos[r, start : start + p_len] = torch.arange(p_len)
        prefix_slice = slice(start, start + p_len)
        allowed[r, prefix_slice, prefix_slice] = torch.ones(p_len, p_len, dtype=torch.bool).tril()
        at = start + p_len
        for p in prompts:
            s_len = len(p.suffix)
            block = slice(at, at + s_len)
            ids[r, block] = torch.tensor(p.suffix, dtype=torch.long)
            pos[r, block] = torch.arange(p_len, p_len + s_len)
            allowed[r, block, prefix_slice] = True
            allowed[r, block, block] = torch.ones(s_len, s_len, dtype=torch.bool).tril()
            rows.append(r)
            cols.append(at + s_len - 1)
            ks.append(p.k)
            at += s_len
        pad = torch.arange(start)
        allowed[r, pad, pad] = True  # padding attends to itself only, so no softmax row is empty
    mask = torch.zeros((n_rows, 1, width, width), dtype=dtype)
    mask.masked_fill_(~allowed[:, None], torch.finfo(dtype).min)
    option_mask = torch.zeros(len(ks), max(ks), dtype=torch.bool)
    for i, k in enumerate(ks):
        option_mask[i, :k] = True
    return PackedBatch(ids, pos, mask, torch.tensor(rows), torch.tensor(cols), option_mask)


def score_packed(model: LoadedModel, prompts: Sequence[Prompt], *, max_batch_tokens: int = 8192) -> list[np.ndarray]:
    """Option logits (canonical order, float64) for each prompt, like ``score_prompts``, with packed rows.

    Prompts with the same prefix share one row; rows are sorted by length and cut into forward passes of at most
    ``max_batch_tokens`` (padded) tokens.
    """
    import numpy as np
    import torch

    by_prefix: dict[tuple[int, ...], list[int]] = {}
    for i, p in enumerate(prompts):
        by_prefix.setdefault(p.prefix, []).append(i)
    groups = sorted(by_prefix.items(), key=lambda g: len(g[0]) + sum(len(prompts[i].suffix) for i in g[1]))
    out: list[np.ndarray] = [np.empty(0)] * len(prompts)
    too_long = [
        i
        for prefix, members in groups
        if len(prefix) + sum(len(prompts[j].suffix) for j in members) > MAX_ROW_TOKENS
        for i in members
    ]
    if too_long:
        for i, z in zip(too_long, score_prompts(model, [prompts[i] for i in too_long]), strict=True):
            out[i] = z
        skip = set(too_long)
        groups = [g for g in groups if g[1][0] not in skip]

    decoder = decoder_of(model.lm)
    weight, bias, softcap = output_head(model.lm)
    label_ids = torch.tensor(model.renderer.label_ids, device=model.device)
    dtype = weight.dtype
    pad_id = model.tokenizer.pad_token_id
    chunk: list[tuple[tuple[int, ...], list[int]]] = []

    def flush() -> None:
        batch = pack([(prefix, [prompts[i] for i in members]) for prefix, members in chunk], pad_id, dtype)
        device = model.device
        hidden = decoder(
            input_ids=batch.input_ids.to(device),
            position_ids=batch.position_ids.to(device),
            attention_mask=batch.mask.to(device),
            use_cache=False,
        ).last_hidden_state  # (B, L, H)
        last = hidden[batch.rows.to(device), batch.cols.to(device)]  # (N, H)
        logits = read_option_logits(last, weight, label_ids, batch.option_mask.to(device), bias, softcap)
        rows = logits.double().cpu().numpy()  # (N, K)
        order = [i for _, members in chunk for i in members]
        for row, i in enumerate(order):
            p = prompts[i]
            canonical = np.empty(p.k)
            canonical[list(p.order)] = rows[row, : p.k]
            out[i] = canonical

    with torch.inference_mode():
        for prefix, members in groups:
            length = len(prefix) + sum(len(prompts[i].suffix) for i in members)
            if chunk and length * (len(chunk) + 1) > max_batch_tokens:  # sorted: this row is the longest yet
                flush()
                chunk = []
            chunk.append((prefix, members))
        if chunk:
            flush()
    return out


def packing_agrees(model: LoadedModel, prompts: Sequence[Prompt], tolerance: float = 1e-4) -> bool:
    """Whether packed scoring reproduces ``score_prompts`` on these prompts (softmax probabilities)."""
    import numpy as np

    reference = score_prompts(model, prompts, shared_prefix=False)
    packed = score_packed(model, prompts)
    return all(
        float(np.abs(to_probabilities("choice", a) - to_probabilities("choice", b)).max()) <= tolerance
        for a, b in zip(reference, packed, strict=True)
    )
