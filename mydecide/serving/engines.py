"""Scoring engines: the seam between mydecide's scoring plans and whatever runs the forward passes (docs/serving.md).

mydecide renders every question into exact token ids (``scoring/render.py``), plans which prompts score it
(``scoring/plan.py``: one per option, letters, groups and a final round for 27–255 options, one per set label) and
reads the answer from label logits. An engine does the one step in between: for each prompt, the logits of the
given label token ids at the prompt's last position. That step is :class:`LogitsEngine`, and :class:`TokenPrompt`
is all it is given; :func:`prompt_scorer` turns an engine into the ``score(prompts) -> rows`` callable that
``score_plans`` drives, round by round (a final round waits for the groups' rows), for the server's micro-batcher.

- :class:`TorchEngine` (``--engine torch``, the default) is the forward path the server always ran: packed shared
  state rows where the model reproduces ``score_prompts`` with them (``scoring.forward.packs``), else ``score_prompts``.
  It returns the same numbers, bit for bit, as before the seam existed (tests/serving/test_engine_seam.py).
- ``--engine vllm`` (``serving/vllm_engine.py``, an optional extra): the same reads on an in-process ``vllm.LLM``.
  :func:`engine_factory` refuses, in one line at startup, what it cannot serve (vLLM missing, an adapter vLLM's LoRA
  cannot apply, a hybrid base with an adapter).

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
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from mydecide.config import BatchOptions
from mydecide.errors import UserError
from mydecide.records import parse_question
from mydecide.scoring.forward import canonical_rows, packs, score_packed, score_prompts
from mydecide.scoring.render import Prompt
from mydecide.serving.request import Request, RequestError

if TYPE_CHECKING:
    import numpy as np

    from mydecide.scoring.model import LoadedModel
    from mydecide.scoring.render import Renderer

log = logging.getLogger("mydecide.serve")

ENGINES = ("torch", "vllm")
QUESTION_TYPES = ("choice", "noul", "score", "set", "span")


@dataclass(frozen=True)
class TokenPrompt:
    """One read an engine makes: the sequence ``prefix + suffix`` (mydecide's exact token ids, never re-tokenised)
    and the token ids whose logits are wanted at its last position, in the order they are returned.

    ``prefix`` is the part shared by the reads of one question (the state, then, for a question read option by
    option, its shared text: the last ``stem`` tokens), a hint for prefix sharing or caching; an engine may also
    run ``ids`` whole. Either way a row must depend on this prompt alone."""

    prefix: tuple[int, ...]
    suffix: tuple[int, ...]
    label_ids: tuple[int, ...]
    stem: int = 0

    @property
    def ids(self) -> tuple[int, ...]:
        return self.prefix + self.suffix


class LogitsEngine(Protocol):
    """What the server needs of an engine: label logits at the last position of token-id prompts."""

    name: str  # reported by /health ("torch", "vllm", …)
    spans: bool  # whether it reads span questions (hidden states at every word); False: they are refused

    def start(self) -> None:
        """Called once, on the scorer's startup, before the first read (load, probe, warm up)."""

    def label_logits(self, prompts: Sequence[TokenPrompt]) -> list[np.ndarray]:
        """Per prompt, the (len(label_ids),) logits of its label ids at its last position (float64)."""
        ...


def token_prompt(prompt: Prompt, label_ids: Sequence[int]) -> TokenPrompt:
    """The read of one rendered prompt: its K shown labels are the renderer's first K label ids."""
    return TokenPrompt(prompt.prefix, prompt.suffix, tuple(label_ids[: prompt.k]), prompt.stem)


def prompt_scorer(engine: LogitsEngine, renderer: Renderer) -> Callable[[list[Prompt]], list[np.ndarray]]:
    """``score(prompts) -> rows`` over an engine: each prompt's label logits, put back in its question's canonical
    option order (what ``ScoringPlan.read`` takes)."""
    label_ids = tuple(renderer.label_ids)

    def score(prompts: list[Prompt]) -> list[np.ndarray]:
        reads = [token_prompt(p, label_ids) for p in prompts]
        rows = engine.label_logits(reads)
        if len(rows) != len(reads):
            raise ValueError(f"the {engine.name} engine returned {len(rows)} rows for {len(reads)} prompts")
        for row, read in zip(rows, reads, strict=True):
            if len(row) != len(read.label_ids):
                k = len(read.label_ids)
                raise ValueError(f"the {engine.name} engine returned {len(row)} logits for {k} labels")
        return canonical_rows(prompts, rows)  # type: ignore[arg-type]  # a list of (K,) rows, each read to its K

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

    def label_logits(self, prompts: Sequence[TokenPrompt]) -> list[np.ndarray]:
        """The forward path reads the renderer's labels only: a prompt's label ids must be their first K."""
        labels = tuple(self.model.renderer.label_ids)
        for p in prompts:
            if p.label_ids != labels[: len(p.label_ids)]:
                raise ValueError(f"the torch engine reads the answer labels {labels[:4]}…, not {p.label_ids}")
        shown = [
            Prompt(p.prefix, p.suffix, tuple(range(len(p.label_ids))), stem=p.stem) for p in prompts
        ]  # shown order
        if self.packed:
            return score_packed(self.model, shown, max_batch_tokens=self.options.max_batch_tokens)
        return score_prompts(
            self.model, shown, batch_size=self.options.forward_batch, shared_prefix=self.options.shared_prefix
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


def engine_factory(
    name: str, model_path: str | None = None, adapter: str | Path | None = None, **engine_args: Any
) -> Callable[[LoadedModel], LogitsEngine] | None:
    """The engine ``mydecide serve --engine NAME`` runs, as a function of the loaded model (None: the torch engine);
    a :class:`UserError` (one line, at startup) when it cannot run here. ``model_path``: the local model directory
    the engine loads (vLLM: the base, or a merged model), ``adapter``: the LoRA adapter served on it (vLLM: as a
    per-request LoRA, from the copy ``vllm_engine.write_vllm_lora`` writes now, so that an adapter vLLM cannot apply
    fails here and not at the first request)."""
    require_engine(name)
    if name == "torch":
        return None
    if model_path is None or not Path(model_path).is_dir():
        raise UserError(
            f"--engine vllm needs a local model directory, and {model_path!r} is none (a hub name, or smollm2-135m "
            "before its first conversion: serve it once with --engine torch)"
        )
    lora: dict[str, Any] = {}
    if adapter is not None:
        lora = vllm_lora(Path(model_path), Path(adapter))

    def build(model: LoadedModel) -> LogitsEngine:
        from mydecide.serving.vllm_engine import VllmEngine

        dtype = str(next(model.lm.parameters()).dtype).removeprefix("torch.")  # the torch model's own
        return VllmEngine(str(model_path), dtype=dtype, **lora, **engine_args)

    return build


def vllm_lora(model_path: Path, adapter: Path) -> dict[str, Any]:
    """``VllmEngine``'s LoRA arguments for ``adapter``: its vLLM copy, written to a temporary directory that lives as
    long as the process, and its rank. Refused in one line: a hybrid base (Qwen3.5's Gated DeltaNet layers: vLLM's
    LoRA there is not verified against mydecide's, so serve a merged model), a feature vLLM's LoRA lacks, a rank
    above vLLM's largest."""
    import atexit
    import json
    import shutil
    import tempfile

    from mydecide.serving.vllm_engine import lora_rank_setting, write_vllm_lora

    config_path = model_path / "config.json"
    config = json.loads(config_path.read_text()) if config_path.is_file() else {}
    layer_types = config.get("layer_types") or (config.get("text_config") or {}).get("layer_types") or []
    if "linear_attention" in layer_types:
        raise UserError(
            f"--engine vllm: {model_path} has linear-attention (Gated DeltaNet) layers, where vLLM's LoRA is not "
            "verified to answer as mydecide does: merge the adapter with `mydecide merge` and serve the merged "
            "directory"
        )
    folder = tempfile.mkdtemp(prefix="mydecide-vllm-lora-")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    try:
        written = write_vllm_lora(adapter, Path(folder))
        return {"lora_dir": folder, "max_lora_rank": lora_rank_setting(written["rank"])}
    except Exception:
        shutil.rmtree(folder, ignore_errors=True)
        raise
