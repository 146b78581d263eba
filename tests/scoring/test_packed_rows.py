"""Packed rows (scoring/packed.py, scoring/forward.py's score_packed) reproduce score_prompts exactly enough, and
only run where they can."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from mydecide.prompt import RenderConfig
from mydecide.serving.request import parse_request
from mydecide.serving.response import render_request

REQUESTS = [
    {
        "state": "Checkout returns HTTP 500 for every customer since 09:10.",
        "questions": {
            "down": {"type": "noul", "instructions": "Is a production system down?"},
            "team": {
                "type": "choice",
                "instructions": "Which team?",
                "criteria": {"billing": "Charges and refunds", "engineering": "Bugs", "support": "Help"},
            },
            "labels": {
                "type": "set",
                "instructions": "Which labels apply?",
                "criteria": {"bug": "A defect", "money": "About money"},
            },
        },
    },
    {
        "state": "Short.",
        "questions": {
            "u": {"type": "score", "instructions": "How urgent?", "criteria": ["low", "medium", "high", "blocking"]}
        },
    },
    {"state": ["line one " * 40, "line two"], "questions": {"down": {"type": "noul", "instructions": "Down?"}}},
]


@pytest.fixture(scope="module")
def llama(tiny_llama_dir: Path):
    from mydecide.modeling import load_model

    return load_model(str(tiny_llama_dir), render=RenderConfig(option_form="letters"), device="cpu")


def prompts_of(model, requests=REQUESTS):
    return [p for r in requests for p in render_request(model, parse_request(r)).prompts]


def gap(a, b) -> float:
    return max(float(np.abs(x - y).max()) for x, y in zip(a, b, strict=True))


def test_packed_logits_equal_each_prompt_scored_alone(llama) -> None:
    from mydecide.scoring.forward import score_packed, score_prompts

    prompts = prompts_of(llama)
    alone = score_prompts(llama, prompts, batch_size=1, shared_prefix=False)
    packed = score_packed(llama, prompts)
    assert [len(z) for z in packed] == [p.k for p in prompts]
    assert gap(alone, packed) < 1e-4
    # prompts given in any order come back in that order
    reordered = score_packed(llama, prompts[::-1])
    assert gap(packed[::-1], reordered) < 1e-5


def test_the_prompt_head_is_computed_once_and_continued_with_the_same_logits(llama, monkeypatch) -> None:
    """score_packed keeps the keys and values of the head every prompt starts with (template, system prompt, answer
    formats) and lays rows out after it: the same hidden states as rows that hold the head, the cache computed once
    per loaded model and dropped while the adapter is off."""
    import torch

    import mydecide.scoring.forward as forward
    from mydecide.scoring.packed import HeadCache, pack, packed_last_hidden

    prompts = prompts_of(llama)
    decoder, pad_id = forward.decoder_of(llama.lm), llama.tokenizer.pad_token_id
    head_ids = llama.renderer.head_ids()
    assert len(head_ids) > 20 and all(p.root[: len(head_ids)] == tuple(head_ids) for p in prompts)
    head = HeadCache.compute(decoder, head_ids, "cpu")
    assert head.covers(prompts) and not head.covers([p.__class__(p.prefix[1:], p.suffix, p.order) for p in prompts])
    with torch.inference_mode():
        whole = packed_last_hidden(decoder, pack(prompts, pad_id))
        rows = pack(prompts, pad_id, cached=len(head_ids))
        assert rows.input_ids.shape[1] == pack(prompts, pad_id).input_ids.shape[1] - len(head_ids)
        after = packed_last_hidden(decoder, rows, head)
        with pytest.raises(ValueError, match="head cache"):
            packed_last_hidden(decoder, rows)  # rows without their head need the cache
    assert float((whole - after).abs().max()) < 1e-5

    llama.head = None
    computed: list[int] = []
    real = HeadCache.compute
    monkeypatch.setattr(HeadCache, "compute", lambda *a: computed.append(1) or real(*a))
    first = forward.score_packed(llama, prompts)
    second = forward.score_packed(llama, prompts[::-1])
    assert computed == [1] and llama.head is not None and gap(first[::-1], second) < 1e-6
    alone = forward.score_prompts(llama, prompts, batch_size=1, shared_prefix=False)
    assert gap(alone, first) < 1e-4


def test_the_head_cache_is_dropped_while_the_adapter_is_off(tiny_llama_dir: Path, tmp_path: Path) -> None:
    from peft import LoraConfig, get_peft_model

    from mydecide.modeling import adapter_disabled, load_model
    from mydecide.scoring.forward import score_packed

    model = load_model(str(tiny_llama_dir), render=RenderConfig(option_form="letters"), device="cpu")
    model.lm = get_peft_model(model.lm, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    prompts = prompts_of(model)
    tuned = score_packed(model, prompts)
    kept = model.head
    with adapter_disabled(model):
        base = score_packed(model, prompts)
        assert model.head is not kept  # the base's own head
    assert model.head is None
    assert gap(tuned, score_packed(model, prompts)) < 1e-6 and gap(tuned, base) > 1e-3


def test_packed_rows_split_by_the_token_budget_and_long_rows_fall_back(llama, monkeypatch) -> None:
    import mydecide.scoring.forward as packing

    prompts = prompts_of(llama)
    whole = packing.score_packed(llama, prompts)
    calls: list[int] = []
    real_pack = packing.pack

    def counting_pack(prompts, pad_id, segments=False, cached=0):
        calls.append(len({p.root for p in prompts}))  # packed rows (states) in this forward pass
        return real_pack(prompts, pad_id, segments, cached)

    monkeypatch.setattr(packing, "pack", counting_pack)
    split = packing.score_packed(llama, prompts, max_batch_tokens=1)  # one row per forward pass
    assert calls == [1, 1, 1] and gap(whole, split) < 1e-5

    calls.clear()
    monkeypatch.setattr(packing, "MAX_ROW_TOKENS", 60)  # every row too long: all through score_prompts
    fallback = packing.score_packed(llama, prompts)
    assert calls == [] and gap(whole, fallback) < 1e-4


def test_pack_layout_isolates_questions(llama) -> None:
    from mydecide.scoring.packed import pack

    prompts = prompts_of(llama, REQUESTS[:1])[:2]
    prefix = prompts[0].prefix
    assert prompts[1].prefix == prefix
    batch = pack(prompts, pad_id=0)
    p, s1, s2 = len(prefix), len(prompts[0].suffix), len(prompts[1].suffix)
    assert batch.input_ids.shape == (1, p + s1 + s2)
    assert batch.position_ids[0].tolist() == [*range(p), *range(p, p + s1), *range(p, p + s2)]
    allowed = batch.allowed[0, 0]
    q2_first = p + s1
    assert allowed[q2_first, :p].all() and not allowed[q2_first, p:q2_first].any()  # sees the prefix, not q1
    assert batch.cols.tolist() == [p + s1 - 1, p + s1 + s2 - 1]


def test_only_plain_attention_models_pack(llama, tiny_qwen_dir: Path) -> None:
    from mydecide.modeling import load_model
    from mydecide.scoring.forward import packing_agrees, packs

    assert packs(llama)
    assert packing_agrees(llama, prompts_of(llama))
    qwen = load_model(str(tiny_qwen_dir), render=RenderConfig(option_form="letters"), device="cpu")
    assert not packs(qwen)  # Gated DeltaNet layers run through every token in order


@pytest.fixture(scope="module")
def per_option(tiny_llama_dir: Path):
    from mydecide.modeling import load_model

    return load_model(str(tiny_llama_dir), render=RenderConfig(option_form="per_option"), device="cpu")


@pytest.mark.parametrize("score_form", ["per_option", "thresholds"])
def test_answer_turn_reads_equal_each_prompt_scored_alone(tiny_llama_dir: Path, score_form: str) -> None:
    """The stem ends with the template's tail, each read is one option's line in the answer turn; a packed row still
    gives every read as if its prompt were scored alone."""
    from mydecide.modeling import load_model
    from mydecide.scoring.forward import score_packed, score_prompts

    render = RenderConfig(option_form="per_option", score_form=score_form)
    model = load_model(str(tiny_llama_dir), render=render, device="cpu")
    prompts = prompts_of(model)
    tail = model.renderer._encode(model.renderer.tail)
    stems = [p for p in prompts if p.stem]
    assert stems and all(list(p.prefix[-len(tail) :]) == tail for p in stems)
    assert gap(score_prompts(model, prompts, batch_size=1, shared_prefix=False), score_packed(model, prompts)) < 1e-5


def test_a_state_and_each_questions_shared_text_are_laid_out_once(per_option) -> None:
    """Per-option and per-level reads: one row per state, holding the state once, each question's stem once and
    every read after its stem; a read sees the state, its own stem and itself, and nothing else."""
    from mydecide.scoring.packed import pack, tree_tokens

    prompts = prompts_of(per_option, REQUESTS[:2])
    stems = {p.prefix: p.stem for p in prompts if p.stem}
    assert len(stems) == 2  # the choice's options and the score's levels each share a stem
    batch = pack(prompts, pad_id=0)
    assert batch.input_ids.shape[0] == 2  # two states
    assert (
        batch.n_tokens
        == tree_tokens(prompts)
        == (sum(len(r) for r in {p.root for p in prompts}) + sum(stems.values()) + sum(len(p.suffix) for p in prompts))
    )
    assert batch.n_tokens < sum(len(p) for p in prompts) - 2 * len(prompts[0].root)
    for i, p in enumerate(prompts):
        r, c = int(batch.rows[i]), int(batch.cols[i])
        seen = batch.allowed[r, 0, c].nonzero().flatten()
        assert batch.input_ids[r, seen].tolist() == list(p.prefix) + list(p.suffix)  # its prompt, in order
        assert batch.position_ids[r, seen].tolist() == list(range(len(p)))  # at the positions it has alone


def test_packed_per_option_reads_equal_each_prompt_scored_alone(per_option) -> None:
    from mydecide.scoring.forward import packing_agrees, score_packed, score_prompts

    prompts = prompts_of(per_option)
    assert any(p.stem for p in prompts)
    alone = score_prompts(per_option, prompts, batch_size=1, shared_prefix=False)
    packed = score_packed(per_option, prompts)
    assert gap(alone, packed) < 1e-5
    assert packing_agrees(per_option, prompts)


def test_the_token_budget_counts_each_stem_once(per_option) -> None:
    from mydecide.scoring.packed import tree_tokens
    from mydecide.serving.batching import token_slices

    prompts = prompts_of(per_option, REQUESTS[:1])
    whole = tree_tokens(prompts)
    stems = {p.prefix: p.stem for p in prompts}
    assert whole == len(prompts[0].root) + sum(stems.values()) + sum(len(p.suffix) for p in prompts)
    assert token_slices(prompts, whole) == [list(range(len(prompts)))]  # the budget fits the whole tree
    cut = token_slices(prompts, whole - 1)
    assert len(cut) == 2 and sorted(i for s in cut for i in s) == list(range(len(prompts)))
    assert all(tree_tokens([prompts[i] for i in s]) <= whole - 1 for s in cut)


def test_evaluation_scores_in_packed_rows_where_the_model_packs(per_option, monkeypatch) -> None:
    """score_questions (evaluate, calibrate, training's dev metrics) packs a model that packs: the same logits as the
    KV-cache path, each state laid out once for all of its per-option questions."""
    import mydecide.scoring.forward as forward
    from mydecide.records import parse_question
    from mydecide.scoring.engine import score_questions

    questions = [parse_question(q, name) for r in REQUESTS[:2] for name, q in r["questions"].items()]
    items = [(state, q) for state in ("The checkout fails for every customer.", "Short.") for q in questions]
    rows: list[int] = []
    real_pack = forward.pack
    monkeypatch.setattr(
        forward,
        "pack",
        lambda prompts, pad_id, segments=False, cached=0: (
            rows.append(len({p.root for p in prompts})) or real_pack(prompts, pad_id, segments, cached)
        ),
    )
    per_option.packing = None
    assert forward.packs(per_option) and per_option.packing is True  # probed once, then kept
    rows.clear()
    packed = score_questions(per_option, items)
    assert rows == [2]  # one forward pass, one row per state
    per_option.packing = False  # as for a model whose probe failed: the KV-cache path
    cached = score_questions(per_option, items)
    per_option.packing = None
    assert gap(packed, cached) < 1e-5
