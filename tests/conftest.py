"""Shared fixtures: tiny models and a tokenizer built in code, so the suite runs offline in minutes."""

from __future__ import annotations

import json
import math
import os
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
CORPUS = [
    "The checkout page returns an error for every customer since this morning.",
    "Is a production system down? Answer yes or no. Choose one option.",
    "Question: Which team should handle this ticket? Options billing engineering support refunds",
    "State: the invoice was charged twice and the customer wants a refund.",
    "very negative negative neutral positive very positive levels are listed lowest first",
    "Answer with the letter only. A. B. C. D. E. F. G. H.",
] * 20


def build_tokenizer(out: Path):
    """A small byte-level BPE tokenizer with a ChatML template (A–Z are single tokens)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>", bos_token=None, unk_token=None
    )
    fast.chat_template = CHATML
    fast.save_pretrained(out)
    return fast


def build_llama(out: Path, vocab_size: int) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        pad_token_id=0,
        bos_token_id=None,
        eos_token_id=2,
    )
    LlamaForCausalLM(config).save_pretrained(out)


def build_qwen3_5(out: Path, vocab_size: int) -> None:
    import torch
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    torch.manual_seed(0)
    config = Qwen3_5TextConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=4096,
        layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"],
        linear_num_value_heads=4,
        linear_num_key_heads=2,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        linear_conv_kernel_dim=4,
        tie_word_embeddings=True,
        pad_token_id=0,
        eos_token_id=2,
    )
    Qwen3_5ForCausalLM(config).save_pretrained(out)


def random_span_head(model: Any, seed: int = 0, scale: float = 0.1) -> Any:
    """A span head attached to ``model.lm`` with random weights (a trained head's word projection is not zero)."""
    import torch

    from mydecide.scoring.span_head import attach_span_head

    head = attach_span_head(model.lm, bias=-1.0)
    torch.manual_seed(seed)
    with torch.no_grad():
        for parameter in head.parameters():
            parameter.copy_(scale * torch.randn_like(parameter))
    return head


def span_grid_by_hand(model: Any, head: Any, layout: Any) -> Any:
    """A layout's grid computed step by step: each sequence alone through the decoder, the hidden state at each
    word's read and at each label line's last token, projected, q·k/√d + the label's bias."""
    import numpy as np
    import torch

    from mydecide.scoring.forward import decoder_of

    grid = np.full(layout.n_words * layout.n_labels, np.nan)
    with torch.no_grad():
        for seq in layout.sequences:
            h = decoder_of(model.lm)(input_ids=torch.tensor([seq.ids])).last_hidden_state[0]
            q, k = head.word(h[list(seq.reads)]), head.label(h[list(seq.label_reads)])
            bias = head.bias + k @ head.label_bias
            grid[seq.cells(layout.n_labels)] = (q @ k.T / math.sqrt(q.shape[-1]) + bias).flatten().double().numpy()
    return grid


@pytest.fixture(scope="session", autouse=True)
def empty_caches(tmp_path_factory: pytest.TempPathFactory):
    """Every test run starts from empty caches, as on a fresh machine: $MYDECIDE_CACHE (where the embedded default is
    converted), $HF_HOME and $XDG_CACHE_HOME point into this run's temporary directory, for the tests and for the
    processes they start. A test that passes only because a warm cache holds a converted model fails here."""
    root = tmp_path_factory.mktemp("caches")
    with pytest.MonkeyPatch.context() as patch:
        for name, folder in (("MYDECIDE_CACHE", "mydecide"), ("HF_HOME", "huggingface"), ("XDG_CACHE_HOME", "xdg")):
            (root / folder).mkdir()
            patch.setenv(name, str(root / folder))
        yield root


@pytest.fixture(scope="session")
def packaged_smollm2(empty_caches: Path) -> str:
    """The real embedded default, converted from its packaged GGUF into this run's cache (the slow tier only: the
    conversion takes a while on a fresh machine). Returns the converted model directory."""
    from mydecide.modeling import resolve_model_path

    return resolve_model_path("smollm2-135m")[0]


@pytest.fixture(scope="session")
def tiny_tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tokenizer")
    build_tokenizer(out)
    return out


def _model_dir(tmp_path_factory: pytest.TempPathFactory, tokenizer_dir: Path, name: str, build) -> Path:
    import shutil

    out = tmp_path_factory.mktemp(name)
    for f in tokenizer_dir.iterdir():
        shutil.copy(f, out / f.name)
    from transformers import AutoTokenizer

    build(out, len(AutoTokenizer.from_pretrained(out)))
    return out


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory: pytest.TempPathFactory, tiny_tokenizer_dir: Path) -> Path:
    """A 2-layer Llama (random weights) + the tiny tokenizer, saved as a local HF directory."""
    return _model_dir(tmp_path_factory, tiny_tokenizer_dir, "llama", build_llama)


@pytest.fixture(scope="session")
def tiny_qwen_dir(tmp_path_factory: pytest.TempPathFactory, tiny_tokenizer_dir: Path) -> Path:
    """A 4-layer hybrid Qwen3.5 (3 Gated DeltaNet + 1 attention layer) + the tiny tokenizer."""
    return _model_dir(tmp_path_factory, tiny_tokenizer_dir, "qwen3_5", build_qwen3_5)


@pytest.fixture(params=["llama", "qwen3_5"])
def tiny_model_dir(request: pytest.FixtureRequest) -> Path:
    return request.getfixturevalue("tiny_llama_dir" if request.param == "llama" else "tiny_qwen_dir")


# ------------------------------------------------------------- score forms: a learnable task, an adapter trained on it

URGENCY = ["not urgent", "this week", "today", "within the hour"]


@pytest.fixture
def score_task(tmp_path: Path) -> Callable[..., Path]:
    """``make(seed)``: train.jsonl and dev.jsonl of a score task a tiny random model can learn (the level is mostly
    the low one, a prior to learn), in a folder of its own."""

    def make(seed: int = 0, n_train: int = 96, n_dev: int = 24) -> Path:
        from mydecide.records import parse_question

        question = parse_question({"type": "score", "instructions": "How urgent is it?", "criteria": URGENCY}, "q")
        rng = random.Random(seed)
        words = ["calm", "soon", "hurry", "panic"]
        rows = []
        for i in range(n_train + n_dev):
            level = 0 if rng.random() < 0.7 else rng.choice([1, 2, 3])
            rows.append(
                {
                    "id": f"s{seed}-{i}",
                    "task": "urgency",
                    "state": f"ticket {i}: {words[level]} {words[level]}",
                    "question": question.to_json(),
                    "answer": level,
                }
            )
        out = tmp_path / f"score-task-{seed}"
        out.mkdir(parents=True, exist_ok=True)
        for name, part in (("train", rows[:n_train]), ("dev", rows[n_train:])):
            (out / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in part))
        return out

    return make


@pytest.fixture
def train_score_form(
    tiny_llama_dir: Path, tmp_path: Path, score_task: Callable[..., Path]
) -> Callable[..., tuple[Path, Path]]:
    """``train(form, objective, seed)``: (the task's data folder, the run) of 16 updates of recipes/train/smoke.yaml
    on the tiny Llama with ``prompt.score_form=form``."""

    def train_in(form: str, objective: str, seed: int = 0) -> tuple[Path, Path]:
        from mydecide.config import TrainRecipe
        from mydecide.recipe_loading import load_recipe
        from mydecide.training.loop import train

        data = score_task(seed)
        lr = "2e-2" if objective == "proper" else "2e-3"
        recipe = load_recipe(
            Path(__file__).resolve().parents[1] / "recipes" / "train" / "smoke.yaml",
            [
                f"model={tiny_llama_dir}",
                f"data={data}",
                f"out={tmp_path / f'run-{form}'}",
                f"prompt.score_form={form}",
                f"objective.kind={objective}",
                "optim.max_steps=16",
                f"optim.lr={lr}",
                "eval_every=8",
            ],
            model=TrainRecipe,
        )
        return data, train(recipe)

    return train_in
