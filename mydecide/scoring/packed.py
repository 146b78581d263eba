"""Shared-state batches as one ordinary forward pass: every state is read once, under gradient checkpointing too.

The cache route (``scoring.forward.last_hidden``: run the prefixes with a KV cache, copy it to the questions, continue)
needs the cache inside the autograd graph across two forward calls. Gradient checkpointing drops the cache (a
checkpointed layer runs with ``past_key_values=None``) and Gated DeltaNet layers write their cached state in place,
so that route cannot train with either. A *packed* batch is one forward call that is a pure function of its inputs,
so non-reentrant checkpointing can recompute any layer:

    row r:  [ pad … | prefix of state r | question 1 | question 2 | … ]

* Attention layers take a block mask: the prefix is causal; each question sees the whole prefix and itself
  (causally), never another question. Position ids of every question continue from the prefix length, so each
  question token is computed as if its prompt were scored alone.
* Gated DeltaNet layers (Qwen3.5) cannot skip tokens, so the batch also carries the *segments* of each row. Those
  layers run each state's prefix up to its last whole 64-token chunk (one row per state), keep the recurrent state
  there, and then run all questions at once (one row per question) from that state: the rest of the prefix, then
  the question, with the prefix's last ``kernel − 1`` inputs before it for the causal convolution. The chunked
  kernel therefore sees exactly the chunks it sees when a prompt is scored alone (the same sums in the same order;
  only the < 64-token prefix tail is computed once per question, in these layers only). The prefix's state enters
  each question as an ordinary tensor, so gradients reach the prefix through it.

:func:`packing_mode` says whether a model can take packed batches (all attention layers sdpa or eager, no sliding
window; linear-attention layers only of the Qwen3.5 kind); other models fall back to one prompt per question.
"""

from __future__ import annotations

import types
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from mydecide.scoring.render import Prompt

PACKABLE_KERNELS = ("sdpa", "eager")
_GATED_DELTANET_PARTS = ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "conv1d", "norm", "out_proj", "A_log")
CHUNK = 64  # the chunk length of the Gated DeltaNet kernels (the PyTorch one and flash-linear-attention's)
CONV_HISTORY = 3  # inputs before a position that Qwen3.5's causal convolution (kernel 4) reads


def _config(lm: Any) -> Any:
    base = lm.get_base_model() if hasattr(lm, "get_base_model") else lm
    config = base.config
    return getattr(config, "text_config", None) or config


def packing_mode(lm: Any) -> str | None:
    """``"attention"`` (every layer full attention), ``"hybrid"`` (full attention + Qwen3.5 Gated DeltaNet) or None
    (the model cannot take a packed batch: another attention kernel, sliding windows, another kind of layer)."""
    config = _config(lm)
    if getattr(config, "_attn_implementation", None) not in PACKABLE_KERNELS:
        return None
    if getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True):
        return None
    kinds = set(getattr(config, "layer_types", None) or ["full_attention"])
    if kinds == {"full_attention"}:
        return "attention"
    if kinds == {"full_attention", "linear_attention"} and all(
        all(hasattr(layer.linear_attn, part) for part in _GATED_DELTANET_PARTS)
        and layer.linear_attn.conv_kernel_size == CONV_HISTORY + 1
        for layer in _decoder(lm).layers
        if hasattr(layer, "linear_attn")
    ):
        return "hybrid"
    return None


def _decoder(lm: Any) -> Any:
    base = lm.get_base_model() if hasattr(lm, "get_base_model") else lm
    return base.get_decoder()


@dataclass
class Segments:
    """Where each state's prefix and each question are, as indices into the flattened (B·L) packed positions
    (−1: padding). ``head`` (G, Hw): each prefix up to its last whole chunk (a multiple of ``CHUNK`` tokens, maybe
    none), right-padded; ``rows`` (N, CONV_HISTORY + Sw): per question the ``CONV_HISTORY`` prefix tokens before
    its prefix's head ends (convolution inputs only), then the rest of the prefix and the question, right-padded;
    ``group`` (N,) the state of each question; ``scatter`` (B·L,) where each packed position's output is in the
    concatenation [head outputs (G·Hw), question-row outputs without the history columns (N·Sw), a zero row]."""

    head: torch.Tensor
    rows: torch.Tensor
    group: torch.Tensor
    scatter: torch.Tensor

    def to(self, device: Any) -> Segments:
        return Segments(*(t.to(device) for t in (self.head, self.rows, self.group, self.scatter)))


@dataclass
class PackedBatch:
    """One forward pass over packed rows. ``allowed`` (B, 1, L, L) True where a token may attend; ``rows``/``cols``
    (N,) the answer slot of each prompt, in the order the prompts were given; ``starts`` (N,) the column of each
    prompt's first suffix token (a span block is read at many of its positions); ``option_mask`` (N, K)."""

    option_mask: torch.Tensor
    input_ids: torch.Tensor
    position_ids: torch.Tensor
    allowed: torch.Tensor
    rows: torch.Tensor
    cols: torch.Tensor
    segments: Segments | None = None
    n_tokens: int = 0  # real (non-pad) tokens processed
    n_padded: int = 0  # tokens processed including padding
    starts: torch.Tensor | None = None
    cached: int = 0  # leading tokens of every root left out of the rows: a HeadCache holds them

    def to(self, device: Any) -> PackedBatch:
        return PackedBatch(
            self.option_mask.to(device),
            self.input_ids.to(device),
            self.position_ids.to(device),
            self.allowed.to(device),
            self.rows.to(device),
            self.cols.to(device),
            None if self.segments is None else self.segments.to(device),
            self.n_tokens,
            self.n_padded,
            None if self.starts is None else self.starts.to(device),
            self.cached,
        )

    def last_hidden(self, decoder: Any) -> torch.Tensor:
        """(N, H) final hidden state at each prompt's answer slot (:func:`packed_last_hidden`)."""
        return packed_last_hidden(decoder, self)


def pack(prompts: Sequence[Prompt], pad_id: int, segments: bool = False, cached: int = 0) -> PackedBatch:
    """Lay out the prompts one row per state (rows left-padded); answers are read in the given order.

    A row is a tree laid flat: the state's ``root`` (template head and state), then per question its ``stem`` (the
    shared text of a per-option or threshold question, empty for other questions) followed by the continuations
    that read it::

        [ pad … | root | stem 1 | read 1.1 | read 1.2 | … | stem 2 | read 2.1 | … ]

    A stem sees the root and itself; a read sees the root, its own stem and itself, never another question's stem
    or another read. Positions continue from the root (a stem) and from the root and stem (a read), so every token is
    computed as if its prompt were scored alone, and the state and each question's shared text are computed once.

    ``segments``: also lay out the heads and question rows of Gated DeltaNet layers (:class:`Segments`). Those
    layers run each question row from the state's recurrent state, so there a stem joins each of its reads.

    ``cached``: the first ``cached`` tokens of every root (the prompt head every prompt shares: :class:`HeadCache`)
    are already in a KV cache, so rows leave them out; positions start after them and ``allowed`` has ``cached``
    more columns in front, which every token may attend to.
    """
    import torch

    if cached and segments:
        raise ValueError("a cached head is for attention layers only; Gated DeltaNet segments start from zero")

    if segments:
        prompts = [
            replace(p, prefix=p.root, suffix=p.prefix[len(p.root) :] + p.suffix, stem=0) if p.stem else p
            for p in prompts
        ]
    trees: dict[tuple[int, ...], dict[tuple[int, ...], list[int]]] = {}
    for i, p in enumerate(prompts):
        trees.setdefault(p.root, {}).setdefault(p.prefix, []).append(i)
    lengths = [
        len(root)
        - cached
        + sum(
            len(prefix) - len(root) + sum(len(prompts[i].suffix) for i in members) for prefix, members in stems.items()
        )
        for root, stems in trees.items()
    ]
    width = max(lengths)
    n_rows = len(trees)
    ids = torch.full((n_rows, width), pad_id, dtype=torch.long)
    pos = torch.zeros((n_rows, width), dtype=torch.long)
    allowed = torch.zeros((n_rows, 1, width, width), dtype=torch.bool)
    rows, cols, starts = [0] * len(prompts), [0] * len(prompts), [0] * len(prompts)
    heads = [len(root) // CHUNK * CHUNK if segments else 0 for root in trees]  # Gated DeltaNet layers only
    h_width = max(heads)
    r_width = max(len(p.prefix) % CHUNK + len(p.suffix) for p in prompts)
    head_index = torch.full((n_rows, h_width), -1, dtype=torch.long)
    row_index = torch.full((len(prompts), CONV_HISTORY + r_width), -1, dtype=torch.long)
    group = torch.zeros(len(prompts), dtype=torch.long)
    scatter = torch.full((n_rows * width,), n_rows * h_width + len(prompts) * r_width, dtype=torch.long)

    def causal(r: int, at: int, n: int) -> None:
        allowed[r, 0, at : at + n, at : at + n] = torch.ones(n, n, dtype=torch.bool).tril()

    for r, (root, stems) in enumerate(trees.items()):
        start = width - lengths[r]
        p_len, head = len(root) - cached, heads[r]  # p_len: the root's tokens laid out in the row
        span = start + torch.arange(p_len)  # the root's packed columns
        ids[r, span] = torch.tensor(root[cached:], dtype=torch.long)
        pos[r, span] = torch.arange(cached, cached + p_len)
        causal(r, start, p_len)
        head_index[r, :head] = r * width + span[:head]
        scatter[r * width + span[:head]] = r * h_width + torch.arange(head)
        at = start + p_len
        first = True
        for prefix, members in stems.items():
            stem = prefix[len(root) :]
            m_len = len(stem)
            stem_cols = torch.arange(at, at + m_len)
            ids[r, stem_cols] = torch.tensor(stem, dtype=torch.long)
            pos[r, stem_cols] = torch.arange(len(root), len(root) + m_len)
            allowed[r, 0, at : at + m_len, start : start + p_len] = True
            causal(r, at, m_len)
            at += m_len
            for i in members:
                suffix = prompts[i].suffix
                s_len = len(suffix)
                block = torch.arange(at, at + s_len)
                ids[r, block] = torch.tensor(suffix, dtype=torch.long)
                pos[r, block] = torch.arange(len(root) + m_len, len(root) + m_len + s_len)
                allowed[r, 0, at : at + s_len, start : start + p_len] = True
                allowed[r, 0, at : at + s_len, stem_cols] = True
                causal(r, at, s_len)
                if segments:  # stems are empty here (joined to their reads above)
                    history = span[max(0, head - CONV_HISTORY) : head]
                    row_index[i, CONV_HISTORY - len(history) : CONV_HISTORY] = r * width + history
                    own = torch.cat([span[head:], block])  # the root's tail, then the question
                    row_index[i, CONV_HISTORY : CONV_HISTORY + len(own)] = r * width + own
                    out_at = n_rows * h_width + i * r_width
                    if first:  # the root tail's outputs are read from the state's first question row
                        scatter[r * width + span[head:]] = out_at + torch.arange(p_len - head)
                    scatter[r * width + block] = out_at + (p_len - head) + torch.arange(s_len)
                first = False
                group[i] = r
                rows[i], cols[i], starts[i] = r, at + s_len - 1, at
                at += s_len
        pad = torch.arange(start)
        allowed[r, 0, pad, pad] = True  # padding attends to itself only, so no softmax row is empty
    if cached:  # the cached head comes first in every key row, and every token sees it
        allowed = torch.cat([torch.ones((n_rows, 1, width, cached), dtype=torch.bool), allowed], dim=-1)
    k_max = max(p.k for p in prompts)
    option_mask = torch.zeros(len(prompts), k_max, dtype=torch.bool)
    for i, p in enumerate(prompts):
        option_mask[i, : p.k] = True
    return PackedBatch(
        option_mask,
        ids,
        pos,
        allowed,
        torch.tensor(rows),
        torch.tensor(cols),
        Segments(head_index, row_index, group, scatter) if segments else None,
        n_tokens=sum(lengths),
        n_padded=ids.numel(),
        starts=torch.tensor(starts),
        cached=cached,
    )


def tree_tokens(prompts: Sequence[Prompt]) -> int:
    """Tokens :func:`pack` lays out for these prompts: each state's root once, each question's stem once, every
    read's suffix."""
    roots = {p.root for p in prompts}
    prefixes = {p.prefix: p for p in prompts}
    return (
        sum(map(len, roots))
        + sum(len(p.prefix) - len(p.root) for p in prefixes.values())
        + sum(len(p.suffix) for p in prompts)
    )


@dataclass
class HeadCache:
    """The keys and values of the prompt head every prompt starts with (the chat template's text, the system prompt
    and the answer formats: ``Renderer.head_ids``), computed once and then continued by every packed pass, whose rows
    leave the head out (``pack(cached=...)``). Inference on attention layers only: a cache belongs to one set of
    weights (``LoadedModel.head`` is dropped when they change, ``modeling.adapter_disabled``)."""

    ids: tuple[int, ...]
    layers: list[tuple[torch.Tensor, torch.Tensor]]

    @classmethod
    def compute(cls, decoder: Any, ids: Sequence[int], device: Any) -> HeadCache:
        import torch
        from transformers import DynamicCache

        cache = DynamicCache(config=decoder.config)
        decoder(input_ids=torch.tensor([list(ids)], device=device), past_key_values=cache, use_cache=True)
        return cls(tuple(ids), [(layer.keys, layer.values) for layer in cache.layers])  # type: ignore[union-attr,misc]

    def covers(self, prompts: Sequence[Prompt]) -> bool:
        """Whether every prompt's root starts with this head and has a token after it."""
        n = len(self.ids)
        return all(len(p.root) > n and p.root[:n] == self.ids for p in prompts)

    def expanded(self, decoder: Any, rows: int) -> Any:
        """A fresh cache holding the head once per row (the forward call appends the rows' own keys to it)."""
        from transformers import DynamicCache

        cache = DynamicCache(config=decoder.config)
        for i, (keys, values) in enumerate(self.layers):
            cache.update(keys.expand(rows, -1, -1, -1), values.expand(rows, -1, -1, -1), i)
        return cache


def packed_last_hidden(decoder: Any, batch: PackedBatch, head: HeadCache | None = None) -> torch.Tensor:
    """(N, H) final hidden state at each prompt's answer slot: one decoder call over the packed rows."""
    return packed_hidden(decoder, batch, head)[batch.rows, batch.cols]


def packed_hidden(decoder: Any, batch: PackedBatch, head: HeadCache | None = None) -> torch.Tensor:
    """(B, L, H) final hidden states at every packed position: one decoder call over the packed rows (continuing
    ``head``, the cache of the ``batch.cached`` tokens the rows leave out)."""
    import torch

    held = 0 if head is None else len(head.ids)
    if batch.cached != held:
        raise ValueError(f"the rows leave out {batch.cached} head tokens; the head cache holds {held}")

    config = getattr(decoder.config, "text_config", None) or decoder.config
    if config._attn_implementation == "eager":  # eager adds the mask to the scores; sdpa takes it as booleans
        dtype = decoder.get_input_embeddings().weight.dtype
        mask: Any = torch.zeros(batch.allowed.shape, dtype=dtype, device=batch.allowed.device)
        mask = mask.masked_fill(~batch.allowed, torch.finfo(dtype).min)
    else:
        mask = batch.allowed
    if batch.segments is not None:
        _install_segmented_forward(decoder)
        mask = {"full_attention": mask, "linear_attention": batch.segments}
    past = None if head is None else head.expanded(decoder, batch.input_ids.shape[0])
    out = decoder(
        input_ids=batch.input_ids,
        position_ids=batch.position_ids,
        attention_mask=mask,
        past_key_values=past,
        use_cache=past is not None,
    )
    return out.last_hidden_state  # type: ignore[no-any-return]


# ---------------------------------------------------------------------------------------- Gated DeltaNet segments


def _install_segmented_forward(decoder: Any) -> None:
    """Let every Gated DeltaNet layer of ``decoder`` take :class:`Segments` in place of its padding mask."""
    for layer in decoder.layers:
        module = getattr(layer, "linear_attn", None)
        if module is None or getattr(module, "_mydecide_segmented", False):
            continue
        original = module.forward

        def forward(
            self: Any,
            hidden_states: torch.Tensor,
            cache_params: Any = None,
            attention_mask: Any = None,
            _original: Any = original,
            **kwargs: Any,
        ) -> torch.Tensor:
            if isinstance(attention_mask, Segments):
                return _segmented(self, hidden_states, attention_mask)
            return _original(hidden_states, cache_params=cache_params, attention_mask=attention_mask, **kwargs)

        module.forward = types.MethodType(forward, module)
        module._mydecide_segmented = True


def _segmented(layer: Any, hidden_states: torch.Tensor, seg: Segments) -> torch.Tensor:
    """A Gated DeltaNet layer over packed rows: the prefixes' heads, then every question row from its head's state."""
    import torch

    b, length, size = hidden_states.shape
    flat = torch.cat([hidden_states.reshape(b * length, size), hidden_states.new_zeros(1, size)])

    def take(index: torch.Tensor) -> torch.Tensor:
        return flat[torch.where(index < 0, b * length, index)]

    rows_real = seg.rows[:, CONV_HISTORY:] >= 0
    if seg.head.shape[1]:
        head_out, state = _gated_delta(layer, take(seg.head), seg.head >= 0, None, None)
        head_flat = head_out.flatten(0, 1)
        initial: torch.Tensor | None = state[seg.group]
    else:  # no prefix fills a whole chunk: every question starts from the zero state
        head_flat, initial = hidden_states.new_zeros(0, layer.hidden_size), None
    rows = take(seg.rows)
    history = layer.in_proj_qkv(rows[:, :CONV_HISTORY]).transpose(1, 2)  # zero rows give zero inputs
    row_out, _ = _gated_delta(layer, rows[:, CONV_HISTORY:], rows_real, initial, history)
    outputs = torch.cat([head_flat, row_out.flatten(0, 1), row_out.new_zeros(1, row_out.shape[-1])])
    return outputs[seg.scatter].reshape(b, length, -1)


def _gated_delta(
    layer: Any, hidden: torch.Tensor, real: torch.Tensor, state: torch.Tensor | None, history: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The layer's forward on (R, W, H) right-padded rows (``real`` (R, W) marks the tokens), from a recurrent
    ``state`` and the convolution inputs ``history`` (R, C, CONV_HISTORY) before the rows (None: from zero).
    Padding neither decays nor writes the state, so the final state is the state after each row's last token."""
    import torch
    import torch.nn.functional as F
    from transformers.models.qwen3_5 import modeling_qwen3_5 as q

    rows, width, _ = hidden.shape
    mixed = layer.in_proj_qkv(hidden).transpose(1, 2)  # (R, C, W)
    z = layer.in_proj_z(hidden).reshape(rows, width, -1, layer.head_v_dim)
    beta = layer.in_proj_b(hidden).sigmoid()
    g = -layer.A_log.float().exp() * F.softplus(layer.in_proj_a(hidden).float() + layer.dt_bias)
    g = g.masked_fill(~real[..., None], 0.0)  # padding: decay exp(0) = 1, and its zero key writes nothing
    conv_in = mixed if history is None else torch.cat([history, mixed], dim=-1)
    conv = q.causal_conv1d_fn(conv_in, layer.conv1d.weight.squeeze(1), layer.conv1d.bias, activation=layer.activation)
    conv = conv[:, :, -width:].transpose(1, 2)
    query, key, value = torch.split(conv, [layer.key_dim, layer.key_dim, layer.value_dim], dim=-1)
    key = key.masked_fill(~real[..., None], 0.0)  # the convolution spreads real inputs into the padding after them
    out, final = q.torch_chunk_gated_delta_rule(
        query.reshape(rows, width, -1, layer.head_k_dim),
        key.reshape(rows, width, -1, layer.head_k_dim),
        value.reshape(rows, width, -1, layer.head_v_dim),
        g=g,
        beta=beta,
        initial_state=state,
        output_final_state=True,
        use_qk_l2norm_in_kernel=True,
    )
    out = layer.norm(out.reshape(-1, layer.head_v_dim), z.reshape(-1, layer.head_v_dim))
    return layer.out_proj(out.reshape(rows, width, -1)), final


def batch_packing(units: Any, packing: str | None, cache_fails: bool) -> str | None:
    """The packed layout where it pays: always when the KV cache cannot serve, else only for a batch in which a
    state has several questions (3 questions per state: packing 1.29x faster; docs/shared-state.md). With one
    question per state both compute the state and a per-option question's text once (:func:`pack` lays a stem out
    once too), and the cache route, measured 1.2x faster there when packing still repeated the stem, is kept."""
    if packing is None or cache_fails:
        return packing
    states = [unit.state_ids for unit in units]
    return packing if len(set(states)) < len(states) else None
