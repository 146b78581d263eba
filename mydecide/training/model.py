"""The model that :func:`~mydecide.training.loop.train` trains: the base model with LoRA on its decoder's linear
layers, activation checkpointing, a span head when span questions are read by one, and the route by which a
state's questions share it in a batch (packed, KV cache, none)."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from mydecide.config import TrainRecipe
from mydecide.errors import UserError
from mydecide.records import Record
from mydecide.scoring.packed import batch_packing, packing_mode
from mydecide.training.batches import TrainBatch, Unit, make_batch

if TYPE_CHECKING:
    from mydecide.prompt import SpanWindows
    from mydecide.scoring.model import LoadedModel
    from mydecide.scoring.render import Renderer


def lora_targets(lm: Any, spec: str | list[str], last_layers: int | None = None) -> str | list[str]:
    """A regex naming every linear layer of the language model's decoder (attention, MLP, Gated DeltaNet
    projections), never the output head or a vision tower; with ``last_layers``, only those of the last N decoder
    layers (the backward pass then stops at the lowest adapted layer)."""
    import torch

    if spec != "all-linear":
        if last_layers:
            raise UserError("lora.last_layers works with lora.target_modules: all-linear, not an explicit list")
        check_targets(lm, spec)
        return spec
    decoder = lm.get_decoder()
    prefix = next(name for name, module in lm.named_modules() if module is decoder)
    leaves = sorted(
        {
            name.rsplit(".", 1)[-1]
            for name, module in decoder.named_modules()
            if isinstance(module, torch.nn.Linear) and not re.search(r"vision|visual", name)
        }
    )
    if not leaves:
        raise UserError(f"no linear layers found in the decoder of {type(lm).__name__}")
    layers = ""
    if last_layers:
        n = len(decoder.layers)
        if last_layers > n:
            raise UserError(f"lora.last_layers={last_layers}, but {type(lm).__name__} has {n} decoder layers")
        layers = rf"layers\.(?:{'|'.join(str(i) for i in range(n - last_layers, n))})\."
    return rf"^{re.escape(prefix)}\.(?!.*(?:vision|visual)){layers}.*\.({'|'.join(map(re.escape, leaves))})$"


def check_targets(lm: Any, spec: str | list[str]) -> None:
    """Refuse (one line) explicit LoRA targets that name no module of ``lm``, or a module LoRA cannot adapt (peft
    matches a list by name suffix, a string as a regular expression over the whole name)."""
    import torch

    names = [name for name, _ in lm.named_modules() if name]

    def matched(target: str) -> list[str]:
        if isinstance(spec, str):
            return [name for name in names if re.fullmatch(target, name)]
        return [name for name in names if name == target or name.endswith("." + target)]

    try:
        missing = [target for target in ([spec] if isinstance(spec, str) else spec) if not matched(target)]
    except re.error as err:
        raise UserError(f"lora.target_modules: {spec!r} is not a regular expression ({err})") from None
    layers = (torch.nn.Linear, torch.nn.Embedding, torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d)
    leaves = sorted({n.rsplit(".", 1)[-1] for n, m in lm.named_modules() if isinstance(m, torch.nn.Linear)})
    if missing:
        raise UserError(
            f"lora.target_modules: {missing} name no module of {type(lm).__name__} (its linear layers: "
            f"{', '.join(leaves)})"
        )
    modules = dict(lm.named_modules())
    targets = [spec] if isinstance(spec, str) else spec
    # transformers' Conv1D (GPT-2's projections) is adaptable too
    odd = sorted(
        n
        for t in targets
        for n in matched(t)
        if not isinstance(modules[n], layers) and type(modules[n]).__name__ != "Conv1D"
    )
    if odd:
        raise UserError(
            f"lora.target_modules: {odd[0]} is a {type(modules[odd[0]]).__name__}, which LoRA cannot adapt (its "
            f"linear layers: {', '.join(leaves)})"
        )


def set_checkpointing(lm: Any, on: bool) -> None:
    """Non-reentrant activation checkpointing on or off (transformers 5's names; the deprecated
    ``gradient_checkpointing_*`` aliases, which warn on every call, only where the new ones are missing)."""
    if on and hasattr(lm, "activation_checkpointing_enable"):
        lm.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    elif on:
        lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    elif hasattr(lm, "activation_checkpointing_disable"):
        lm.activation_checkpointing_disable()
    else:
        lm.gradient_checkpointing_disable()


def lean_lora_dropout(lm: Any) -> int:
    """Give every LoRA dropout of ``lm`` on the CPU a mask drawn with a quarter of the random numbers; returns how
    many were replaced.

    torch's CPU dropout draws one Mersenne Twister number per element, and with LoRA on every linear layer those
    draws took a fifth of a training update on two cores (its inputs' masks, drawn again when checkpointing
    recomputes a layer). This mask takes 16 random bits per element from 64-bit draws and drops an element when its
    bits fall below round(p·2¹⁶): the same independent Bernoulli masks, with p rounded to a multiple of 2⁻¹⁶
    (0.05 → 0.0500031) and the kept elements scaled by 1 / (1 − that p), so the expectation is unchanged. The masks
    come from torch's CPU generator, so seeding and checkpointing's recomputation reproduce them."""
    import torch

    class LoraDropout(torch.nn.Module):
        def __init__(self, p: float) -> None:
            super().__init__()
            self.cut = round(p * 65536)  # an element is dropped when its 16 bits, as unsigned, are below this
            self.scale = 65536 / (65536 - self.cut)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if not self.training or self.cut == 0:
                return x
            n = x.numel()
            draws = torch.randint(-(2**63), 2**63 - 1, ((n + 3) // 4,), dtype=torch.int64, device=x.device)
            bits = draws.view(torch.int16)[:n].view(x.shape)  # signed: unsigned u ≥ cut ⇔ bits ≥ cut − 2¹⁵
            return x * (bits >= self.cut - 32768).to(x.dtype).mul_(self.scale)  # a float mask: faster than masked_fill

        def extra_repr(self) -> str:
            return f"p={self.cut / 65536:.7f}"

    replaced = 0
    for module in list(lm.modules()):
        dropouts = getattr(module, "lora_dropout", None)
        if not isinstance(dropouts, torch.nn.ModuleDict):
            continue
        for name, dropout in list(dropouts.items()):  # entries are replaced as they are read
            if isinstance(dropout, torch.nn.Dropout) and dropout.p > 0:
                dropouts[name] = LoraDropout(dropout.p)
                replaced += 1
    return replaced


def build_module(lm: Any, label_ids: Any) -> Any:
    """An nn.Module whose forward returns (B, K) option logits (and span reads), so DDP sees one forward call."""
    import torch

    from mydecide.scoring.forward import forward_option_logits
    from mydecide.scoring.span_reads import packed_block_reads, span_read_logits

    class DecisionModule(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lm = lm
            self.register_buffer("label_ids", torch.tensor(label_ids), persistent=False)

        def forward(self, batch: Any, spans: Any = None) -> Any:
            label_ids: torch.Tensor = self.label_ids  # type: ignore[assignment]
            if spans is not None and spans.packed_from is not None:  # span blocks in the batch's packed rows
                return packed_block_reads(self.lm, batch, spans.sequences, spans.packed_from, label_ids)
            logits = forward_option_logits(self.lm, batch, label_ids) if batch is not None else None
            if spans is None:  # (B, K); with span questions also their (M,) reads (scoring.span_reads)
                return logits
            return logits, span_read_logits(self.lm, spans.sequences, label_ids, spans.pad_id)

    return DecisionModule()


@dataclass
class TrainableModel:
    """The base model as loaded (its renderer and tokenizer), the PEFT model over it, and the module DDP wraps."""

    base: LoadedModel
    lm: Any  # the PEFT model (LoRA, and the span head among modules_to_save)
    module: Any  # build_module(lm): one forward call for option logits and span reads
    base_weights: Any  # adapters.weights_fingerprint of the base, saved beside each adapter
    packing: str | None  # packing_mode of the model, when the recipe shares states
    cache_fails: bool  # the KV cache cannot serve (gradient checkpointing, recurrent layers)
    shared_prefix: bool  # a state is computed once per batch (packed or through the KV cache)

    @property
    def renderer(self) -> Renderer:
        return self.base.renderer

    def batch(self, units: Sequence[Unit], device: Any) -> TrainBatch:
        """One micro-batch on ``device``, packed where packing pays (:func:`~mydecide.scoring.packed.batch_packing`)."""
        layout = batch_packing(units, self.packing, self.cache_fails)
        return make_batch(units, self.base.tokenizer.pad_token_id, self.shared_prefix, layout).to(device)


def span_log_odds(records: Sequence[Record]) -> float:
    """The span head's initial bias: the log-odds of the share of span questions' word × label cells inside a gold
    span (0 without any)."""
    cells = [y for r in records if r.question.type == "span" for y in r.target]
    share = min(max(sum(cells) / len(cells), 1e-4), 1 - 1e-4) if cells else 0.5
    return math.log(share / (1 - share))


def trainable_model(
    recipe: TrainRecipe,
    span: SpanWindows,
    train_records: Sequence[Record],
    *,
    device: str,
    precision: str,
    log: Callable[[str], None],
) -> TrainableModel:
    """Load the recipe's model with ``span`` (resolved) and make it trainable: LoRA, a span head when
    ``span.read`` is ``head``, checkpointing; logs the trainable parameters and the state-sharing route."""
    import torch
    from peft import LoraConfig, get_peft_model

    from mydecide.adapters import weights_fingerprint
    from mydecide.modeling import load_model, peft_warnings_silenced
    from mydecide.scoring.span_head import HEAD_NAME, attach_span_head

    head = span.read == "head"
    base = load_model(
        recipe.model,
        render=recipe.prompt.model_copy(update={"span": span}),
        device=device,
        dtype=torch.bfloat16 if precision == "bf16" else torch.float32,
    )
    base_weights = weights_fingerprint(base.lm)  # saved beside each adapter: loading it checks the base (modeling)
    head_module = attach_span_head(base.lm, bias=span_log_odds(train_records)) if head else None
    targets = lora_targets(base.lm, recipe.lora.target_modules, recipe.lora.last_layers)
    lora = LoraConfig(
        r=recipe.lora.r,
        lora_alpha=int(recipe.lora.alpha or 2 * recipe.lora.r),
        lora_dropout=recipe.lora.dropout,
        target_modules=targets,
        bias="none",
        task_type="CAUSAL_LM",
        modules_to_save=[HEAD_NAME] if head else None,
    )
    with peft_warnings_silenced():
        lm = get_peft_model(base.lm, lora)
    # A state's questions share it in one packed forward call (scoring/packed.py): checkpointing can recompute it and it
    # runs Gated DeltaNet layers. Where the KV cache also works (no checkpointing, no recurrent layers), a batch is
    # packed only when a state in it has several questions (batch_packing); the cache is the fallback for models
    # that cannot take a packed batch.
    recurrent = "linear_attention" in (getattr(base.lm.config, "layer_types", None) or [])
    cache_fails = recipe.gradient_checkpointing or recurrent
    packing = packing_mode(lm) if recipe.shared_prefix else None
    shared_prefix = recipe.shared_prefix and (packing is not None or not cache_fails)
    if recipe.gradient_checkpointing:
        set_checkpointing(lm, True)
    if str(device).startswith("cpu"):
        lean_lora_dropout(lm)  # the GPU's dropout draws its masks cheaply; torch's CPU one does not
    n_trainable = sum(p.numel() for p in lm.parameters() if p.requires_grad)
    with_head = ""
    if head_module is not None:
        with_head = f", a span head's {sum(p.numel() for p in head_module.parameters()):,} among them"
    log(f"LoRA r={lora.r} on {len(lm.targeted_module_names)} modules: {n_trainable:,} trainable parameters{with_head}")
    route = f"packed ({packing})" if packing else "KV cache" if shared_prefix else "none"
    if packing and not cache_fails:
        route += ", KV cache for batches with one question per state"
    log(f"state sharing: {route}")
    module = build_module(lm, base.renderer.label_ids)
    return TrainableModel(base, lm, module, base_weights, packing, cache_fails, shared_prefix)
