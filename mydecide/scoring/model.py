"""The scoring layer's input: a loaded model (``modeling.load_model`` builds one; training builds one per dev pass)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from mydecide.scoring.render import Renderer


@dataclass
class LoadedModel:
    """A model ready to score: the (possibly PEFT-wrapped) LM, its tokenizer and the renderer."""

    lm: Any
    tokenizer: Any
    renderer: Renderer
    name: str
    packing: bool | None = field(default=None, compare=False)
    """Whether packed rows reproduce each prompt scored alone on this model (``scoring.forward.packs``: probed on
    first use, then kept)."""
    head: Any = field(default=None, compare=False, repr=False)
    """The prompt head's keys and values on these weights (``scoring.forward.head_cache``: computed on first use,
    then kept; dropped while the weights change, ``modeling.adapter_disabled``)."""

    @property
    def device(self) -> torch.device:
        return next(self.lm.parameters()).device
