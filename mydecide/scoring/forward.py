"""The forward pass: prompts → one batched decoder run (the shared prefix computed once) → option logits.

Every scoring path ends here: training's forward (``forward_option_logits``, gradients on), and evaluation,
calibration, predict, serve and merge's parity check (``score_prompts``, inference). Only the answer labels' rows
of the output embedding are multiplied, so no full-vocabulary logits are ever formed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from mydecide.scoring.render import Prompt

if TYPE_CHECKING:
    import numpy as np
    import torch

    from mydecide.modeling import LoadedModel


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
