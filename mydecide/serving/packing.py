"""Packed shared-prefix scoring: a state and all of its questions in one sequence, without padding.

``score_prompts`` shares a state by running its prefix once and then every question as a right-padded row that
continues from the prefix's KV cache, so each question row is padded to the longest question of the batch. On a
CPU, where a forward pass costs in proportion to the tokens it processes, that padding eats much of the saving.
Packing lays one state out as a single row::

    [ prefix | question 1 | question 2 | … ]      positions: 0..P-1, then P.. again for every question

with an attention mask under which each question sees the whole prefix and itself (causally), never another
question. Every question token is then computed exactly as if its question were scored alone after the prefix,
and the row holds ``P + ΣS`` real tokens. A question read option by option (or level by level) lays its shared
text out once and its reads after it, each seeing the state and that text only (``packed.pack``), so a request's
state and every question's text are each computed once. Rows of different states are left-padded into one batch.

This needs every layer to be plain attention with positions taken from ``position_ids`` and a custom 4-D mask
(Llama, Qwen2/3, SmolLM and similar, with the sdpa or eager kernels). Recurrent layers (Gated DeltaNet in Qwen3.5)
cannot skip over the other questions, so such models keep ``score_prompts``. :func:`packing_agrees` checks a model
against ``score_prompts`` before the server relies on it. The layout and the forward call are the ones training
uses (``scoring/packed.py``: ``pack``, ``packed_last_hidden``), so served and trained packing cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from mydecide.scoring import packed
from mydecide.scoring.forward import decoder_of, output_head, read_option_logits, score_prompts
from mydecide.scoring.packed import packed_last_hidden, packing_mode
from mydecide.scoring.probabilities import to_probabilities

if TYPE_CHECKING:
    import numpy as np

    from mydecide.modeling import LoadedModel
    from mydecide.scoring.render import Prompt

MAX_ROW_TOKENS = 4096  # longer rows (a (L, L) mask per row) go through score_prompts


def supports_packing(lm: Any) -> bool:
    """Whether the model's layers are all full attention driven by ``position_ids`` and a 4-D mask (the server packs
    attention-only models; a Qwen3.5 hybrid keeps ``score_prompts``)."""
    return packing_mode(lm) == "attention"


def score_packed(model: LoadedModel, prompts: Sequence[Prompt], *, max_batch_tokens: int = 8192) -> list[np.ndarray]:
    """Option logits (canonical order, float64) for each prompt, like ``score_prompts``, with packed rows.

    Prompts on the same state share one row (its root once, each question's stem once: ``packed.pack``); rows are
    sorted by length and cut into forward passes of at most ``max_batch_tokens`` (padded) tokens.
    """
    import numpy as np
    import torch

    by_root: dict[tuple[int, ...], list[int]] = {}
    for i, p in enumerate(prompts):
        by_root.setdefault(p.root, []).append(i)
    sized = [(packed.tree_tokens([prompts[i] for i in members]), members) for members in by_root.values()]
    sized.sort(key=lambda g: g[0])
    out: list[np.ndarray] = [np.empty(0)] * len(prompts)
    too_long = [i for length, members in sized if length > MAX_ROW_TOKENS for i in members]
    if too_long:
        for i, z in zip(too_long, score_prompts(model, [prompts[i] for i in too_long]), strict=True):
            out[i] = z
        sized = [g for g in sized if g[0] <= MAX_ROW_TOKENS]

    decoder = decoder_of(model.lm)
    weight, bias, softcap = output_head(model.lm)
    label_ids = torch.tensor(model.renderer.label_ids, device=model.device)
    pad_id = model.tokenizer.pad_token_id
    chunk: list[list[int]] = []

    def flush() -> None:
        order = [i for members in chunk for i in members]  # one packed row per state, read in this order
        batch = packed.pack([prompts[i] for i in order], pad_id).to(model.device)
        last = packed_last_hidden(decoder, batch)  # (N, H)
        logits = read_option_logits(last, weight, label_ids, batch.option_mask, bias, softcap)
        rows = logits.double().cpu().numpy()  # (N, K)
        for row, i in enumerate(order):
            p = prompts[i]
            canonical = np.empty(p.k)
            canonical[list(p.order)] = rows[row, : p.k]
            out[i] = canonical

    with torch.inference_mode():
        for length, members in sized:
            if chunk and length * (len(chunk) + 1) > max_batch_tokens:  # sorted: this row is the longest yet
                flush()
                chunk = []
            chunk.append(members)
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
