"""Scoring engines: the seam between mydecide's scoring plans and whatever runs the forward passes (docs/serving.md).

mydecide renders every question into exact token ids (``scoring/render.py``), plans which prompts score it
(``scoring/plan.py``: one per option, letters, groups and a final round for 27–255 options, one per set label) and
reads the answer from label logits. An engine does the one step in between: for each rendered
:class:`~mydecide.scoring.render.Prompt`, the logits of its K shown answer labels (the renderer's first K label ids)
at its last position, put back in its question's canonical option order. That step is :class:`LogitsEngine`;
:func:`prompt_scorer` turns an engine into the ``score(prompts) -> rows`` callable that ``score_plans`` drives, round
by round (a final round waits for the groups' rows), for the server's micro-batcher.

- :class:`TorchEngine` (``--engine torch``, the default) is the forward path the server always ran, on the prompts as
  they are: packed shared state rows where the model reproduces ``score_prompts`` with them
  (``scoring.forward.packs``), else ``score_prompts`` (tests/serving/test_engine_seam.py).
- ``--engine vllm`` (``serving/vllm_engine.py``, an optional extra): the same reads on an in-process ``vllm.LLM``,
  which takes the prompts' token ids; its ``vllm_factory`` refuses, in one line at startup, what it cannot serve
  (an adapter vLLM's LoRA cannot apply, a hybrid base with an adapter). This module never imports it:
  ``serving/server.py`` picks the engine.

Span questions are not one label read at the last position: every word's last token is read, through the label
rows (``read: letters``) or the trained span head on hidden states (``read: head``). An engine that returns only
label logits (``spans`` False) cannot serve them, and they are refused with a 422 naming the question and its type
(:func:`check_served`), never answered by another read. ``/health`` lists what serves each question type
(:func:`served_types`).
"""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

from mydecide.config import BatchOptions
from mydecide.errors import UserError
from mydecide.records import QUESTION_TYPES, parse_question
from mydecide.scoring.forward import packs, score_packed, score_prompts
from mydecide.serving.request import Request, RequestError

if TYPE_CHECKING:
    import numpy as np

    from mydecide.scoring.model import LoadedModel
    from mydecide.scoring.render import Prompt, Renderer

log = logging.getLogger("mydecide.serve")

ENGINES = ("torch", "vllm")


class LogitsEngine(Protocol):
    """What the server needs of an engine: the answer labels' logits at the last position of rendered prompts."""

    name: str  # reported by /health ("torch", "vllm", …)
    spans: bool  # whether it reads span questions (hidden states at every word); False: they are refused

    def start(self) -> None:
        """Called once, on the scorer's startup, before the first read (load, probe, warm up)."""

    def label_logits(self, prompts: Sequence[Prompt]) -> list[np.ndarray]:
        """Per prompt, the (K,) logits (float64) of its K shown labels, the renderer's first K label ids, at its last
        position, in its question's canonical option order (``prompt.order[j]`` is the option shown at label j). A
        row must depend on its own prompt only."""
        ...


def prompt_scorer(engine: LogitsEngine) -> Callable[[list[Prompt]], list[np.ndarray]]:
    """``score(prompts) -> rows`` over an engine: each prompt's label logits in its question's canonical option order
    (what ``ScoringPlan.read`` takes), refused when the engine returns another number of rows or logits."""

    def score(prompts: list[Prompt]) -> list[np.ndarray]:
        rows = engine.label_logits(prompts)
        if len(rows) != len(prompts):
            raise ValueError(f"the {engine.name} engine returned {len(rows)} rows for {len(prompts)} prompts")
        for row, prompt in zip(rows, prompts, strict=True):
            if len(row) != prompt.k:
                raise ValueError(f"the {engine.name} engine returned {len(row)} logits for {prompt.k} labels")
        return rows

    return score


class TorchEngine:
    """The model in this process, read by mydecide's own forward pass (``score_packed`` or ``score_prompts``)."""

    name = "torch"
    spans = True  # span questions are read by serving.response.score_spans on the same model

    def __init__(self, model: LoadedModel, options: BatchOptions = BatchOptions()):
        self.model = model
        self.options = options
        self.packed = False  # decided in start(): packing is used only where it reproduces score_prompts

    def start(self) -> None:
        self.packed = self.options.shared_prefix and self.options.packing and packs(self.model)

    def label_logits(self, prompts: Sequence[Prompt]) -> list[np.ndarray]:
        if self.packed:
            return score_packed(self.model, prompts, max_batch_tokens=self.options.max_batch_tokens)
        return score_prompts(
            self.model, prompts, batch_size=self.options.forward_batch, shared_prefix=self.options.shared_prefix
        )


def served_types(engine: LogitsEngine, renderer: Renderer) -> dict[str, dict[str, str]]:
    """Per question type, the form it is scored in and what serves it: ``torch``, ``engine`` or ``refused``."""
    path = "torch" if engine.name == "torch" else "engine"
    out = {}
    for kind in QUESTION_TYPES:
        if kind == "span":
            out[kind] = {"form": f"read: {renderer.config.span.read}", "path": path if engine.spans else "refused"}
        else:
            out[kind] = {"form": renderer.form(parse_question(_SAMPLES[kind], "q")), "path": path}
    return out


_SAMPLES = {
    "choice": {"type": "choice", "instructions": "?", "criteria": ["a", "b"]},
    "noul": {"type": "noul", "instructions": "?"},
    "score": {"type": "score", "instructions": "?", "criteria": ["low", "high"]},
    "set": {"type": "set", "instructions": "?", "criteria": {"a": "", "b": ""}},
}


def check_served(request: Request, engine: LogitsEngine) -> None:
    """Refuse (a :class:`RequestError`, the client's 422) a question the engine cannot read, naming it and its type."""
    if engine.spans:
        return
    for name, question in request.questions.items():
        if question.type == "span":
            raise RequestError(
                f"question {name!r}: span questions are not served by the {engine.name} engine (they need hidden "
                f"states at every word, not label logits at the last position); serve them with --engine torch"
            )


def require_engine(name: str) -> None:
    """Refuse (a :class:`UserError`, one line) an engine that cannot run here, before anything loads."""
    if name not in ENGINES:
        raise UserError(f"--engine {name!r}: choose one of {', '.join(ENGINES)}")
    if name == "vllm" and importlib.util.find_spec("vllm") is None:
        raise UserError("--engine vllm needs vLLM, which is not installed: pip install -e .[vllm]")
