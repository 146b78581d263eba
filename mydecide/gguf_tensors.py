"""The tensors of a decision GGUF (``mydecide export-gguf``, :mod:`mydecide.gguf_export`): merged float32 weights
under llama.cpp's names and layout, beside the base GGUF's own metadata.

llama.cpp stores a llama model's Q and K rows interleaved per head (its rotary layout): loaders (transformers
among them) undo that on read, so the merged HF weights are permuted back here. One-dimensional tensors (norms)
stay F32 in every type, as llama.cpp's own converter keeps them; Q8_0 needs rows of a multiple of 32 values, and a
tensor whose rows are not stays F16.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

SKIPPED_KEYS = ("GGUF.", "general.architecture", "general.file_type", "general.quantization_version")
"""Source metadata not copied: the file's own layout, and what the writer sets for the new tensors."""


@dataclass(frozen=True)
class MergedWeights:
    tensors: dict[str, np.ndarray]  # HF name → float32 array, (out, in) for a matrix
    n_head: int
    n_head_kv: int
    n_layers: int


def merged_weights(loaded: Any) -> MergedWeights:
    """Merge a loaded base + LoRA (float32) in place and take its weights as float32 arrays by HF name."""
    lm = loaded.lm.merge_and_unload()  # W + (alpha / r)·B·A, in float32
    config = lm.config
    tensors = {name: t.detach().float().cpu().numpy() for name, t in lm.state_dict().items()}
    if any("lora_" in name for name in tensors):
        raise RuntimeError("the merged model still carries LoRA weights")  # a bug, not the user's
    return MergedWeights(
        tensors,
        int(config.num_attention_heads),
        int(getattr(config, "num_key_value_heads", None) or config.num_attention_heads),
        int(config.num_hidden_layers),
    )


def rotary_rows(weight: np.ndarray, n_head: int) -> np.ndarray:
    """HF's Q/K row order → llama.cpp's: within each head, the two rotary halves interleaved row by row."""
    half = weight.shape[0] // n_head // 2
    return weight.reshape(n_head, 2, half, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def gguf_tensors(arch: str, merged: MergedWeights, wanted: set[str]) -> dict[str, np.ndarray]:
    """The merged weights under the GGUF names ``wanted`` (the source file's), in llama.cpp's layout. A tied output
    (no ``output.weight`` in the source) is left out; any other name that does not match is a bug."""
    import gguf

    arch_id = next(a for a, name in gguf.MODEL_ARCH_NAMES.items() if name == arch)
    names = gguf.get_tensor_name_map(arch_id, merged.n_layers)
    out: dict[str, np.ndarray] = {}
    for hf_name, tensor in merged.tensors.items():
        name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if name is None:
            raise RuntimeError(f"{hf_name}: no GGUF name for this {arch} tensor")
        if name not in wanted and name == "output.weight":  # tied to token_embd.weight
            continue
        if name.endswith("attn_q.weight"):
            tensor = rotary_rows(tensor, merged.n_head)
        elif name.endswith("attn_k.weight"):
            tensor = rotary_rows(tensor, merged.n_head_kv)
        out[name] = np.ascontiguousarray(tensor, dtype=np.float32)
    if set(out) != wanted:
        missing, extra = sorted(wanted - set(out)), sorted(set(out) - wanted)
        raise RuntimeError(f"merged tensors do not match the source GGUF: missing {missing[:3]}, extra {extra[:3]}")
    return out


def encoded(tensor: np.ndarray, gguf_type: str) -> tuple[np.ndarray, Any]:
    """One tensor in the file's type: (data, the GGML type to declare, None for plain float arrays)."""
    import gguf

    if tensor.ndim == 1 or gguf_type == "f32":
        return tensor, None
    if gguf_type == "q8_0" and tensor.shape[-1] % 32 == 0:
        kind = gguf.GGMLQuantizationType.Q8_0
        return gguf.quants.quantize(tensor, kind), kind
    return tensor.astype(np.float16), None


def _copy_metadata(reader: Any, writer: Any) -> None:
    import gguf

    for name, field in reader.fields.items():
        if name.startswith(SKIPPED_KEYS):
            continue
        kind = field.types[0]
        sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(name, field.contents(), kind, sub)


def write_decision_gguf(
    source: Path,
    merged: MergedWeights,
    path: Path,
    gguf_type: str,
    strings: dict[str, str],
    floats: dict[str, float],
    log: Callable[[str], None],
) -> int:
    """Write ``path``: the source GGUF's metadata (tokenizer, chat template, hyperparameters), then ``strings`` and
    ``floats`` (the decision keys and the export record, ``{arch}`` in a key standing for the architecture), and
    the merged tensors in ``gguf_type``. Returns how many tensors it wrote."""
    import gguf

    reader = gguf.GGUFReader(source)
    arch = reader.fields["general.architecture"].contents()
    tensors = gguf_tensors(arch, merged, {t.name for t in reader.tensors})
    file_type = {
        "f32": gguf.LlamaFileType.ALL_F32,
        "f16": gguf.LlamaFileType.MOSTLY_F16,
        "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
    }[gguf_type]
    writer = gguf.GGUFWriter(str(path), arch)
    _copy_metadata(reader, writer)
    writer.add_file_type(int(file_type))
    if gguf_type == "q8_0":
        writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    for key, text in strings.items():
        writer.add_string(key.format(arch=arch), text)
    for key, value in floats.items():
        writer.add_float32(key.format(arch=arch), value)
    log(f"writing {len(tensors)} tensors as {gguf_type} to {path.name}")
    for name in [t.name for t in reader.tensors]:  # the source file's order
        data, kind = encoded(tensors.pop(name), gguf_type)
        writer.add_tensor(name, data, raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return len(reader.tensors)
