"""The span head (``prompt.span.read: head``): a small trained layer that scores every word against every label.

A span question's sequence lists its labels, one line each, before the text (``scoring.span_layout``). The head
projects the last hidden state at each word's read (``word``) and at each label line's last token (``label``) to
``SPAN_HEAD_DIM`` dimensions; a cell's log-odds is their scaled dot product plus the label's bias
``label_bias · k + bias`` (``k`` the label's projection): a bias conditioned on what the label says, so a rare label
can learn a far lower bias than a common one, and a label never seen in training still gets one. It reads any label
set, named at request time, without label-specific weights, and all labels from one sequence.

``word`` and ``label_bias`` start at zero, so an untrained head answers ``bias`` everywhere and sends no gradient into
the model until it has learnt something; ``bias`` starts at the log-odds of the training split's share of span cells.
The head is saved with the adapter (peft's ``modules_to_save``: ``adapter_model.safetensors`` holds it) and, in a
merged model directory, as ``span_head.safetensors`` (docs/spans.md).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch

SPAN_HEAD_DIM = 64
HEAD_NAME = "span_head"  # the attribute on the causal LM, and peft's modules_to_save name
MERGED_FILE = "span_head.safetensors"


class SpanHead(torch.nn.Module):
    """(M, H) word states × (N, L, H) label states → (M, L) log-odds; ``index`` (M,) names each word's sequence."""

    def __init__(self, hidden_size: int, dim: int = SPAN_HEAD_DIM, bias: float = 0.0) -> None:
        super().__init__()
        self.word = torch.nn.Linear(hidden_size, dim, bias=False)
        self.label = torch.nn.Linear(hidden_size, dim, bias=False)
        self.bias = torch.nn.Parameter(torch.tensor(float(bias)))
        self.label_bias = torch.nn.Parameter(torch.zeros(dim))  # u of the label's bias u · k + bias
        torch.nn.init.zeros_(self.word.weight)

    def forward(self, words: torch.Tensor, labels: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        dtype = self.word.weight.dtype
        q = self.word(words.to(dtype))  # (M, d)
        k = self.label(labels.to(dtype))  # (N, L, d)
        bias = k @ self.label_bias.to(dtype) + self.bias  # (N, L): each label's own bias, from its read
        return torch.einsum("md,mld->ml", q, k[index]) / math.sqrt(q.shape[-1]) + bias[index]


def base_of(lm: Any) -> Any:
    return lm.get_base_model() if hasattr(lm, "get_base_model") else lm


def span_head_of(lm: Any) -> Any:
    """The model's span head (through a peft wrapper: the adapter's trained copy), None when it has none."""
    return getattr(base_of(lm), HEAD_NAME, None)


def attach_span_head(lm: Any, bias: float = 0.0) -> SpanHead:
    """A new span head on ``lm`` (before peft wraps it), on the device of its output head."""
    weight = base_of(lm).get_output_embeddings().weight
    head = SpanHead(weight.shape[1], bias=bias).to(device=weight.device)
    setattr(base_of(lm), HEAD_NAME, head)
    return head


def adapter_has_head(adapter: Path) -> bool:
    """Whether a LoRA adapter directory carries a span head (peft's ``modules_to_save`` names it)."""
    import json

    path = adapter / "adapter_config.json"
    if not path.is_file():  # not an adapter: load_model says so next
        return False
    config = json.loads(path.read_text())
    return HEAD_NAME in (config.get("modules_to_save") or [])


def save_merged_head(lm: Any, folder: Path) -> None:
    """Detach a merged model's head and write it beside the model's weights (which then hold no head)."""
    from safetensors.torch import save_file

    head = span_head_of(lm)
    if head is None:
        return
    delattr(base_of(lm), HEAD_NAME)
    save_file({k: v.detach().contiguous().cpu() for k, v in head.state_dict().items()}, str(folder / MERGED_FILE))


def load_merged_head(lm: Any, folder: Path) -> bool:
    """Attach the head a merged model directory holds; False when it holds none."""
    from safetensors.torch import load_file

    path = folder / MERGED_FILE
    if not path.is_file():
        return False
    state = load_file(str(path))
    head = attach_span_head(lm)
    head.load_state_dict(state)
    head.to(dtype=torch.float32)
    return True
