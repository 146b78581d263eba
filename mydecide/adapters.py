"""An adapter's files checked before a model is loaded with it.

``check_adapter`` reads its files (a damaged one is an error naming the file), and ``check_base`` compares the base
it is loaded on with the one it was trained on: the weights fingerprint saved beside it (``BASE_FILE``, written by
``training.model_card``) against the loaded base's (``weights_fingerprint``). Loading itself is
:func:`mydecide.modeling.load_model`.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

from mydecide.errors import UserError

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
BASE_FILE = "mydecide_base.json"  # beside an adapter: the base it was trained on, by name and weights fingerprint
FINGERPRINT_SAMPLES = 4096
FINGERPRINT = (
    f"sha256 over the input embedding and every tensor of the last decoder layer (sorted by name): for each its "
    f"name, its shape and {FINGERPRINT_SAMPLES} evenly spaced values as bfloat16"
)


def weights_fingerprint(lm: Any) -> str:
    """What ``FINGERPRINT`` says, of a (not PEFT-wrapped) causal LM: a few milliseconds whatever the model's size.

    Two bases with the same shapes but other weights (another seed, another fine-tune) differ in it. The values
    are read as bfloat16 on the CPU, so the same base loaded in float32 or bfloat16, on a CPU or a GPU, gives the
    same fingerprint."""
    import torch

    tensors = [("embed_tokens", lm.get_input_embeddings().weight)]
    decoder = lm.get_decoder() if hasattr(lm, "get_decoder") else None
    layers = getattr(decoder, "layers", None)
    if layers is not None and len(layers):
        tensors += sorted((f"last_layer.{key}", p) for key, p in layers[-1].named_parameters())
    digest = hashlib.sha256()
    for key, tensor in tensors:
        values = tensor.detach().reshape(-1)
        n, k = values.numel(), min(values.numel(), FINGERPRINT_SAMPLES)
        index = torch.arange(k, dtype=torch.int64) * max(n - 1, 0) // max(k - 1, 1)  # exact, on every device
        sample = values[index.to(values.device)].float().cpu().to(torch.bfloat16)
        digest.update(f"{key} {tuple(tensor.shape)}\n".encode())
        digest.update(sample.view(torch.int16).numpy().tobytes())
    return digest.hexdigest()


def read_json_file(path: Path, what: str) -> dict[str, Any]:
    """A JSON object file of an adapter; a :class:`~mydecide.errors.UserError` naming it when it is not one."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:  # ValueError: not JSON, not UTF-8
        raise UserError(f"{path}: not a readable {what} ({' '.join(str(err).split())[:160]})") from None
    if not isinstance(data, dict):
        raise UserError(f"{path}: not a readable {what} (a JSON object is expected)")
    return data


def check_adapter(adapter: str | Path) -> None:
    """Raise, naming the file, unless ``adapter`` is a LoRA adapter directory whose files read: adapter_config.json
    a JSON object with a positive ``r``, adapter_model.safetensors whole (not cut short), and the config's ``r``
    the rank of its LoRA weights. Cheap (the weights' header only), so commands call it before loading a model."""
    from safetensors import safe_open

    adapter = Path(adapter)
    config_path = adapter / ADAPTER_CONFIG
    if not config_path.is_file():
        raise FileNotFoundError(f"{adapter}: not a LoRA adapter directory (no {ADAPTER_CONFIG})")
    config = read_json_file(config_path, "adapter config")
    r = config.get("r")
    if isinstance(r, bool) or not isinstance(r, int) or r < 1:
        raise UserError(f"{config_path}: r must be a positive whole number (the LoRA rank), not {r!r}")
    weights = adapter / ADAPTER_WEIGHTS
    if not weights.is_file():
        if (adapter / "adapter_model.bin").is_file():  # a pickled adapter: peft reads (and checks) it itself
            return
        raise FileNotFoundError(f"{adapter}: no {ADAPTER_WEIGHTS}; the adapter's weights are missing")
    try:
        with safe_open(str(weights), framework="pt") as handle:
            ranks = {key: handle.get_slice(key).get_shape()[0] for key in handle.keys() if ".lora_A." in key}  # noqa: SIM118
    except Exception as err:  # safetensors' own error type: a header that does not parse, a file cut short
        reason = " ".join(str(err).split())[:160] or type(err).__name__
        raise UserError(f"{weights}: not a readable safetensors file ({reason}); the adapter is damaged") from None
    if config.get("rank_pattern"):  # per-module ranks: peft matches them to the weights as it loads
        return
    other = sorted({rank for rank in ranks.values() if rank != r})
    if other:
        key = next(k for k, rank in ranks.items() if rank != r)
        raise UserError(
            f"{config_path}: r={r}, but {weights} holds rank-{other[0]} LoRA weights ({key}); "
            "the config and the weights do not belong together"
        )


def check_base(adapter: Path, name: str, lm: Any, allow_other_base: bool = False) -> None:
    """Refuse to load ``adapter`` on a base ``lm`` (named ``name``) whose weights fingerprint is not the one
    recorded when the adapter was saved; with ``allow_other_base``, say so and go on. An adapter without its
    ``BASE_FILE`` (saved by a version before adapters recorded their base, or the file lost) is refused in one line:
    its base cannot be checked, and it is retrained rather than loaded unchecked."""
    record_path = adapter / BASE_FILE
    if not record_path.is_file():
        raise UserError(
            f"no {record_path}, so the base {adapter} was trained on cannot be checked against {name}; retrain the "
            "adapter with this version of mydecide"
        )
    record = read_json_file(record_path, "base model record")
    recorded = record.get("weights_fingerprint")
    if not isinstance(recorded, str):
        raise UserError(f"{record_path}: not a readable base model record (no weights_fingerprint)")
    here = weights_fingerprint(lm)
    if here == recorded:
        return
    message = (
        f"{adapter} was trained on {record.get('model', '(unnamed)')} (weights fingerprint {recorded[:12]}), "
        f"not on {name} (fingerprint {here[:12]}): the two bases' weights differ"
    )
    if not allow_other_base:
        raise UserError(f"{message}; load it on its own base, or pass --allow-other-base to load it anyway")
    print(f"[mydecide] warning: {message}; loading it anyway (--allow-other-base)", file=sys.stderr)
