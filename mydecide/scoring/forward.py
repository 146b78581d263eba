"""The forward pass: prompts → one batched decoder run (the shared prefix computed once) → option logits.

Every scoring path ends here: training's forward (``forward_option_logits``, gradients on), and evaluation,
calibration, predict, serve and merge's parity check (``score_prompts`` and ``score_packed``, inference). Only the
answer labels' rows of the output embedding are multiplied, so no full-vocabulary logits are ever formed.

Two inference paths, the same logits (within 1e-5 in fp32):

* ``score_prompts`` shares a prefix by running it once with a KV cache and every question as a right-padded row
  that continues from it. Prompts group by their whole prefix, so a per-option question's state is computed once per
  question, and every question row is padded to the batch's longest.
* ``score_packed`` lays each state out as one row (``packed.pack``): the state, then each question's shared text
  once, then every read, under an attention mask by which each read sees only its own prompt, at the positions it
  has alone. A state and each question's text are computed once, without padding inside a row. It needs every
  layer to be full attention driven by ``position_ids`` and a 4-D mask (Llama, Qwen2/3, SmolLM with the sdpa or
  eager kernels): :func:`packs` checks that, and a probe against ``score_prompts``, once per loaded model. Recurrent
  layers (Qwen3.5's Gated DeltaNet) cannot skip over other reads, so such a model keeps ``score_prompts``; training
  packs it its own way (``packed.Segments``). The layout and the forward call are the ones training uses, so
  scored and trained packing cannot drift apart.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from mydecide.scoring.packed import HeadCache, pack, packed_last_hidden, packing_mode, tree_tokens
from mydecide.scoring.probabilities import softmax
from mydecide.scoring.render import Prompt

if TYPE_CHECKING:
    import numpy as np
    import torch

    from mydecide.scoring.model import LoadedModel


@dataclass
class Batch:
    """Tensors for one forward pass. Either ``input_ids`` (whole prompts, left-padded) or the shared-prefix form.

    Shared-prefix form: ``prefix_ids`` (G, P) left-padded, one row per distinct state; ``suffix_ids`` (B, S)
    right-padded, one row per question; ``group`` (B,) maps a question to its prefix row; ``last`` (B,) is the index
    of each question's last real suffix token. ``option_mask`` (B, K) marks the options shown in each row.
    """

    option_mask: torch.Tensor
    input_ids: torch.Tensor | None = None
    attention_mask: torch.Tensor | None = None
    prefix_ids: torch.Tensor | None = None
    prefix_mask: torch.Tensor | None = None
    suffix_ids: torch.Tensor | None = None
    suffix_mask: torch.Tensor | None = None
    group: torch.Tensor | None = None
    last: torch.Tensor | None = None
    n_tokens: int = 0  # real (non-pad) tokens processed
    n_padded: int = 0  # tokens processed including padding

    def to(self, device: Any) -> Batch:
        import torch

        fields = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in self.__dict__.items()}
        return Batch(**fields)  # type: ignore[arg-type]


def collate(prompts: Sequence[Prompt], pad_id: int, shared_prefix: bool = True) -> Batch:
    """Build a :class:`Batch`. With ``shared_prefix``, questions with the same prefix share one prefix row."""
    import torch

    k_max = max(p.k for p in prompts)
    option_mask = torch.zeros(len(prompts), k_max, dtype=torch.bool)
    for i, p in enumerate(prompts):
        option_mask[i, : p.k] = True

    groups: dict[tuple[int, ...], int] = {}
    for p in prompts:
        groups.setdefault(p.prefix, len(groups))
    if not shared_prefix or len(groups) == len(prompts):
        seqs = [p.prefix + p.suffix for p in prompts]
        ids, mask = _pad(seqs, pad_id, left=True)
        return Batch(
            option_mask, input_ids=ids, attention_mask=mask, n_tokens=sum(map(len, seqs)), n_padded=ids.numel()
        )
    prefixes = list(groups)
    prefix_ids, prefix_mask = _pad(prefixes, pad_id, left=True)
    suffix_ids, suffix_mask = _pad([p.suffix for p in prompts], pad_id, left=False)
    group = torch.tensor([groups[p.prefix] for p in prompts])
    last = torch.tensor([len(p.suffix) - 1 for p in prompts])
    n_tokens = sum(map(len, prefixes)) + sum(len(p.suffix) for p in prompts)
    return Batch(
        option_mask,
        prefix_ids=prefix_ids,
        prefix_mask=prefix_mask,
        suffix_ids=suffix_ids,
        suffix_mask=suffix_mask,
        group=group,
        last=last,
        n_tokens=n_tokens,
        n_padded=prefix_ids.numel() + suffix_ids.numel(),
    )


def _pad(seqs: Sequence[Sequence[int]], pad_id: int, left: bool) -> tuple[torch.Tensor, torch.Tensor]:
    import torch

    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        if left:
            ids[i, width - len(s) :] = torch.tensor(s, dtype=torch.long)
            mask[i, width - len(s) :] = 1
        else:
            ids[i, : len(s)] = torch.tensor(s, dtype=torch.long)
            mask[i, : len(s)] = 1
    return ids, mask


def last_hidden(decoder: Any, batch: Batch) -> torch.Tensor:
    """(B, H) final hidden state at each question's answer slot; runs the decoder once or twice (shared prefix)."""
    import torch

    if hasattr(batch, "last_hidden"):  # a packed shared-state batch (scoring/packed.py) runs itself
        return batch.last_hidden(decoder)  # type: ignore[no-any-return]
    if batch.input_ids is not None:
        out = decoder(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False)
        return out.last_hidden_state[:, -1]
    assert batch.prefix_ids is not None and batch.suffix_ids is not None
    assert batch.group is not None and batch.last is not None and batch.suffix_mask is not None
    assert batch.prefix_mask is not None
    from transformers import DynamicCache

    cache = DynamicCache(config=decoder.config)
    decoder(input_ids=batch.prefix_ids, attention_mask=batch.prefix_mask, past_key_values=cache, use_cache=True)
    cache.reorder_cache(batch.group)  # type: ignore[arg-type]  # (G, …) → (B, …): each question continues from its own state's prefix
    mask = torch.cat([batch.prefix_mask[batch.group], batch.suffix_mask], dim=1)
    out = decoder(input_ids=batch.suffix_ids, attention_mask=mask, past_key_values=cache, use_cache=True)
    rows = torch.arange(batch.suffix_ids.shape[0], device=batch.suffix_ids.device)
    return out.last_hidden_state[rows, batch.last]  # suffixes are right-padded: read the last real position


def read_option_logits(
    hidden: torch.Tensor,
    output_weight: torch.Tensor,
    label_ids: torch.Tensor,
    option_mask: torch.Tensor,
    output_bias: torch.Tensor | None = None,
    softcap: float | None = None,
) -> torch.Tensor:
    """(B, K) logits of the shown labels only; positions beyond a row's options are −inf.

    Only the K label rows of the output embedding are multiplied: no full-vocabulary logits are ever formed.
    """
    import torch

    k = option_mask.shape[1]
    weight = output_weight[label_ids[:k]]  # (K, H)
    logits = hidden.to(weight.dtype) @ weight.T  # (B, K)
    if output_bias is not None:
        logits = logits + output_bias[label_ids[:k]]
    if softcap:
        logits = torch.tanh(logits / softcap) * softcap
    return logits.float().masked_fill(~option_mask, float("-inf"))


def decoder_of(lm: Any) -> Any:
    """The transformer body (embeddings → final norm) of a causal LM, through a PEFT wrapper if any."""
    base = lm.get_base_model() if hasattr(lm, "get_base_model") else lm
    return base.get_decoder()


def output_head(lm: Any) -> tuple[torch.Tensor, torch.Tensor | None, float | None]:
    """The output embedding's weight and bias, and the final logit softcap (None for most models)."""
    base = lm.get_base_model() if hasattr(lm, "get_base_model") else lm
    head = base.get_output_embeddings()
    softcap = getattr(base.config, "final_logit_softcapping", None)
    return head.weight, getattr(head, "bias", None), softcap


def forward_option_logits(lm: Any, batch: Batch, label_ids: torch.Tensor) -> torch.Tensor:
    """(B, K) option logits in shown order for one batch (gradients flow when enabled)."""
    hidden = last_hidden(decoder_of(lm), batch)
    weight, bias, softcap = output_head(lm)
    return read_option_logits(hidden, weight, label_ids, batch.option_mask, bias, softcap)


def canonical_rows(prompts: Sequence[Prompt], logits: np.ndarray) -> list[np.ndarray]:
    """Each prompt's row of (N, K) shown-order logits, put back in the canonical option order of its question."""
    import numpy as np

    out = []
    for row, p in zip(logits, prompts, strict=True):
        canonical = np.empty(p.k)
        canonical[list(p.order)] = row[: p.k]
        out.append(canonical)
    return out


def score_prompts(
    model: LoadedModel,
    prompts: Sequence[Prompt],
    *,
    batch_size: int = 16,
    shared_prefix: bool = True,
    progress: Callable[[int], None] | None = None,
) -> list[np.ndarray]:
    """Option logits (canonical option order, float64 numpy) for each prompt, batched by length.

    Prompts sharing a prefix are kept in one batch where possible so the prefix is computed once.
    """
    import numpy as np
    import torch

    label_ids = torch.tensor(model.renderer.label_ids, device=model.device)
    pad_id = model.tokenizer.pad_token_id
    # order: by prefix (questions on one state together), then by length (less padding)
    index = sorted(
        range(len(prompts)), key=lambda i: (len(prompts[i].prefix), prompts[i].prefix, len(prompts[i].suffix))
    )
    out: list[np.ndarray] = [np.empty(0)] * len(prompts)
    with torch.inference_mode():
        for start in range(0, len(index), batch_size):
            chunk = index[start : start + batch_size]
            batch = collate([prompts[i] for i in chunk], pad_id, shared_prefix).to(model.device)
            logits = forward_option_logits(model.lm, batch, label_ids).double().cpu().numpy()
            for i, row in zip(chunk, canonical_rows([prompts[i] for i in chunk], logits), strict=True):
                out[i] = row
            if progress:
                progress(len(chunk))
    return out


# ------------------------------------------------------------------------------------------------- packed rows

MAX_ROW_TOKENS = 4096  # longer rows (a (L, L) mask per row) go through score_prompts
_TOLD: set[str] = set()  # models whose probe failed, said once


def packed_passes(prompts: Sequence[Prompt], max_batch_tokens: int = 8192) -> tuple[list[list[int]], list[int]]:
    """The prompts (indices) of each packed forward pass, and those left out: prompts on the same state share one
    row, rows are sorted by length and cut into passes of at most ``max_batch_tokens`` (padded) tokens; the prompts
    of a state whose row would be longer than ``MAX_ROW_TOKENS`` are left out (for ``score_prompts``)."""
    by_root: dict[tuple[int, ...], list[int]] = {}
    for i, p in enumerate(prompts):
        by_root.setdefault(p.root, []).append(i)
    sized = [(tree_tokens([prompts[i] for i in members]), members) for members in by_root.values()]
    sized.sort(key=lambda g: g[0])
    too_long = [i for length, members in sized if length > MAX_ROW_TOKENS for i in members]
    passes: list[list[int]] = []
    chunk: list[list[int]] = []
    for length, members in sized:
        if length > MAX_ROW_TOKENS:
            continue
        if chunk and length * (len(chunk) + 1) > max_batch_tokens:  # sorted: this row is the longest yet
            passes.append([i for group in chunk for i in group])  # one packed row per state, read in this order
            chunk = []
        chunk.append(members)
    if chunk:
        passes.append([i for group in chunk for i in group])
    return passes, too_long


def score_packed(
    model: LoadedModel,
    prompts: Sequence[Prompt],
    *,
    max_batch_tokens: int = 8192,
    progress: Callable[[int], None] | None = None,
) -> list[np.ndarray]:
    """Option logits (canonical order, float64) for each prompt, like ``score_prompts``, with packed rows.

    Prompts on the same state share one row (its root once, each question's stem once: ``packed.pack``); rows are
    sorted by length and cut into forward passes of at most ``max_batch_tokens`` (padded) tokens
    (:func:`packed_passes`). The prompt head every row starts with is computed once per loaded model and kept
    (:func:`head_cache`): rows start after it.
    """
    import numpy as np
    import torch

    passes, too_long = packed_passes(prompts, max_batch_tokens)
    out: list[np.ndarray] = [np.empty(0)] * len(prompts)
    if too_long:
        for i, z in zip(too_long, score_prompts(model, [prompts[i] for i in too_long], progress=progress), strict=True):
            out[i] = z
    decoder = decoder_of(model.lm)
    weight, bias, softcap = output_head(model.lm)
    label_ids = torch.tensor(model.renderer.label_ids, device=model.device)
    pad_id = model.tokenizer.pad_token_id
    with torch.inference_mode():
        head = head_cache(model) if passes else None
        for order in passes:
            shown = [prompts[i] for i in order]
            cached = head if head is not None and head.covers(shown) else None
            batch = pack(shown, pad_id, cached=0 if cached is None else len(cached.ids)).to(model.device)
            last = packed_last_hidden(decoder, batch, cached)  # (N, H)
            logits = read_option_logits(last, weight, label_ids, batch.option_mask, bias, softcap).double().cpu()
            for i, row in zip(order, canonical_rows(shown, logits.numpy()), strict=True):
                out[i] = row
            if progress:
                progress(len(order))
    return out


def head_cache(model: LoadedModel) -> HeadCache | None:
    """The keys and values of the renderer's prompt head on ``model`` (``packed.HeadCache``), computed on first use
    and kept in ``model.head`` while the renderer's head stays the same; None where the model does not pack."""
    if packing_mode(model.lm) != "attention":
        return None
    ids = tuple(model.renderer.head_ids())
    if not ids:
        return None
    if model.head is None or model.head.ids != ids:
        import torch

        with torch.inference_mode():
            model.head = HeadCache.compute(decoder_of(model.lm), ids, model.device)
    return model.head  # type: ignore[no-any-return]


def packing_agrees(model: LoadedModel, prompts: Sequence[Prompt], tolerance: float = 1e-4) -> bool:
    """Whether packed scoring reproduces ``score_prompts`` on these prompts (softmax probabilities)."""
    import numpy as np

    reference = score_prompts(model, prompts, shared_prefix=False)
    rows = score_packed(model, prompts)
    return all(float(np.abs(softmax(a) - softmax(b)).max()) <= tolerance for a, b in zip(reference, rows, strict=True))


def packs(model: LoadedModel) -> bool:
    """Whether :func:`score_packed` may score for ``model``: every layer full attention under ``position_ids`` and a
    4-D mask (``packed.packing_mode``), and a probe of a few prompts reproduces ``score_prompts`` (checked once per
    loaded model, then kept in ``model.packing``). A Qwen3.5 hybrid keeps ``score_prompts``."""
    if model.packing is None:
        model.packing = packing_mode(model.lm) == "attention" and packing_agrees(model, _probe_prompts(model))
        if not model.packing and packing_mode(model.lm) == "attention" and model.name not in _TOLD:
            _TOLD.add(model.name)  # once per process: training builds a LoadedModel for every dev evaluation
            print(
                f"[mydecide] packed rows do not reproduce score_prompts on {model.name}: not packing", file=sys.stderr
            )
    return model.packing


def _probe_prompts(model: LoadedModel) -> list[Prompt]:
    """A yes / no and a 3-option choice question on two states of different lengths, as the renderer reads them."""
    from mydecide.records import Question
    from mydecide.scoring.plan import ScoringPlan

    questions = [
        Question("noul", "Is it ready?", ("yes", "no"), ("", "")),
        Question("choice", "Which?", ("x", "y", "z"), ("", "", "")),
    ]
    states = ("A short state.", "A somewhat longer state, to make the rows differ in length.")
    return ScoringPlan(model.renderer, [(s, q) for s in states for q in questions]).prompts
