"""An exponential moving average of the trainable weights (``optim.ema_decay``).

After each optimiser update the average moves towards the weights just trained: ``avg ← d·avg + (1 − d)·w``, with
``d = min(ema_decay, (1 + u) / (10 + u))`` at update ``u`` so that the first updates are not swamped by the
untrained start. When a recipe sets ``ema_decay``, the dev evaluations and both saved adapters (RUN/adapter and
RUN/last) use the averaged weights; the optimiser keeps training the raw ones. Only the trainable weights (the LoRA
matrices and a span head's) are averaged: the frozen base never moves.

The average of each LoRA factor is kept, not the average of their product B·A; with the small steps of the end of a
schedule the two differ by second-order terms. Checkpoints carry the average (``ema.safetensors``, weights only), so a
resumed run continues the same average.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

AVERAGE_FILE = "ema.safetensors"  # beside Accelerate's files in a checkpoint


def decay_at(update: int, decay: float) -> float:
    """The decay used for the average after ``update`` updates (1, 2, …): ramps up to ``decay``."""
    return min(decay, (1.0 + update) / (10.0 + update))


class WeightAverage:
    """The moving average of ``model``'s trainable parameters (by name), in float32 beside them."""

    def __init__(self, model: Any, decay: float) -> None:
        import torch

        self.decay = decay
        self.params = {name: p for name, p in model.named_parameters() if p.requires_grad}
        with torch.no_grad():
            self.shadow = {name: p.detach().float().clone() for name, p in self.params.items()}

    def update(self, update: int) -> None:
        """Fold in the weights after optimiser update number ``update`` (counted from 1)."""
        import torch

        weight = 1.0 - decay_at(update, self.decay)
        with torch.no_grad():
            for name, p in self.params.items():
                self.shadow[name].lerp_(p.detach().float(), weight)

    @contextmanager
    def applied(self) -> Iterator[None]:
        """The averaged weights in the model for the duration (dev metrics, saving an adapter), the trained ones
        back afterwards, bit for bit."""
        import torch

        kept = {name: p.detach().clone() for name, p in self.params.items()}
        try:
            with torch.no_grad():
                for name, p in self.params.items():
                    p.copy_(self.shadow[name].to(p.dtype))
            yield
        finally:
            with torch.no_grad():
                for name, p in self.params.items():
                    p.copy_(kept[name])

    def save(self, folder: Path) -> None:
        from safetensors.torch import save_file

        save_file({name: t.contiguous() for name, t in self.shadow.items()}, str(folder / AVERAGE_FILE))

    def load(self, folder: Path) -> None:
        """The average saved in checkpoint ``folder``; ValueError when it is missing or holds other tensors than
        the model trains."""
        from safetensors.torch import load_file

        path = folder / AVERAGE_FILE
        if not path.is_file():
            raise ValueError(f"no {AVERAGE_FILE} in it, and the recipe sets optim.ema_decay")
        saved = load_file(str(path))
        if set(saved) != set(self.shadow):
            raise ValueError(f"{AVERAGE_FILE} holds {len(saved)} tensors, the model trains {len(self.shadow)}")
        for name, tensor in saved.items():
            if tensor.shape != self.shadow[name].shape:
                shape, wanted = tuple(tensor.shape), tuple(self.shadow[name].shape)
                raise ValueError(f"{AVERAGE_FILE}: {name} has shape {shape}, not {wanted}")
            self.shadow[name] = tensor.float().to(self.shadow[name].device)
