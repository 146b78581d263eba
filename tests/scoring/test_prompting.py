"""The shared renderer and option scorer on both tiny architectures (Llama and hybrid Qwen3.5).

The tiny models' weights are re-drawn with a larger spread so that their answers depend visibly on the state
(probabilities move by far more than the 1e-4 tolerances checked here); otherwise "equal within 1e-4" would
hold for a scorer that ignored the state altogether.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from mydecide.modeling import load_model
from mydecide.prompt import RenderConfig
from mydecide.records import Question, parse_question
from mydecide.scoring.engine import score_questions
from mydecide.scoring.forward import collate, forward_option_logits, read_option_logits
from mydecide.scoring.model import LoadedModel
from mydecide.scoring.probabilities import to_probabilities
from mydecide.scoring.render import LETTERS, TRUNCATION_MARK, LabelError, Renderer
from mydecide.serving.request import parse_request
from mydecide.serving.response import answer_request

TEAM = parse_question(
    {
        "type": "choice",
        "instructions": "Which team should handle this ticket?",
        "criteria": {
            "billing": "Charges, invoices and refunds",
            "engineering": "Bugs, errors and outages",
            "support": "How-to and account questions",
        },
    }
)
OUTAGE = parse_question({"type": "noul", "instructions": "Is a production system down?"})
URGENCY = parse_question(
    {
        "type": "score",
        "instructions": "How urgent is it?",
        "criteria": ["not urgent", "soon", "today", "this hour", "blocking"],
    }
)
REFUND = parse_question(
    {
        "type": "choice",
        "instructions": "What does the customer want?",
        "criteria": ["refund", "invoice", "nothing", "a call", "a discount", "to cancel"],
    }
)
SHORT = "The checkout page returns an error."
LONG = (
    "State: the invoice was charged twice and the customer wants a refund. " * 4
    + "Every customer sees an error since this morning."
)
MID = {"ticket": 17, "text": "The invoice page is slow.", "customer": "very positive"}


def sharpen(model: LoadedModel, seed: int = 0) -> LoadedModel:
    """Re-draw every weight matrix with std 0.2 so that the state moves the answer visibly."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for param in model.lm.parameters():
            if param.dim() >= 2:
                param.normal_(0.0, 0.2)
    return model


@pytest.fixture(scope="module", params=["llama", "qwen3_5"])
def model(request: pytest.FixtureRequest) -> LoadedModel:
    directory = request.getfixturevalue("tiny_llama_dir" if request.param == "llama" else "tiny_qwen_dir")
    return sharpen(load_model(str(directory), render=RenderConfig(option_form="letters"), device="cpu"))


def probs(model: LoadedModel, items: list[tuple[Any, Question]], **kwargs: Any) -> list[np.ndarray]:
    logits = score_questions(model, items, **kwargs)
    return [to_probabilities(q.type, z) for (_, q), z in zip(items, logits, strict=True)]


def max_diff(a: list[np.ndarray], b: list[np.ndarray]) -> float:
    assert [x.shape for x in a] == [y.shape for y in b]
    return max(float(np.abs(x - y).max()) for x, y in zip(a, b, strict=True))


def test_the_state_moves_the_answer(model: LoadedModel) -> None:
    # guards the equality tests below: a scorer that ignored the state would pass them too
    (short,), (long,) = probs(model, [(SHORT, TEAM)]), probs(model, [(LONG, TEAM)])
    assert np.abs(short - long).max() > 5e-3  # 50× the tolerance (measured: llama 0.2, qwen3_5 0.007)


def test_alone_equals_inside_a_left_padded_batch(model: LoadedModel) -> None:
    items = [(LONG, URGENCY), (SHORT, TEAM), (MID, OUTAGE), (SHORT + " Again.", REFUND)]
    alone = [probs(model, [item])[0] for item in items]
    prompts = [model.renderer.render(s, q) for s, q in items]
    batch = collate(prompts, model.tokenizer.pad_token_id, shared_prefix=False)
    assert batch.input_ids is not None and batch.attention_mask is not None
    lengths = [len(p) for p in prompts]
    assert len(set(lengths)) == len(lengths)  # all different: every row but the longest is padded
    assert batch.attention_mask.sum(1).tolist() == lengths
    assert (batch.attention_mask[:, -1] == 1).all()  # left padding: every row ends at its answer slot
    for shared in (False, True):
        assert max_diff(probs(model, items, shared_prefix=shared), alone) <= 1e-4


def test_shared_prefix_equals_independent_full_prompts(model: LoadedModel) -> None:
    # several questions on one state, mixed with other states (of other lengths) in one batch
    items = [
        (SHORT, TEAM),
        (LONG, OUTAGE),
        (SHORT, URGENCY),
        (MID, TEAM),
        (SHORT, OUTAGE),
        (LONG, REFUND),
        (SHORT, REFUND),
    ]
    prompts = [model.renderer.render(s, q) for s, q in items]
    batch = collate(prompts, model.tokenizer.pad_token_id, shared_prefix=True)
    assert batch.prefix_ids is not None and batch.prefix_ids.shape[0] == 3  # one prefix row per distinct state
    assert batch.group is not None and batch.group.tolist() == [0, 1, 0, 2, 0, 1, 0]
    shared = probs(model, items, shared_prefix=True)
    independent = probs(model, items, shared_prefix=False)
    alone = [probs(model, [item])[0] for item in items]
    assert max_diff(shared, independent) <= 1e-4
    assert max_diff(shared, alone) <= 1e-4
    # small batches split the groups across forward passes: still the same answers
    assert max_diff(probs(model, items, shared_prefix=True, batch_size=3), independent) <= 1e-4


def test_probabilities_sum_to_one_over_exactly_the_shown_options(model: LoadedModel) -> None:
    items = [(SHORT, TEAM), (SHORT, OUTAGE), (LONG, URGENCY), (SHORT, REFUND)]
    ks = [3, 2, 5, 6]
    for p, k in zip(probs(model, items), ks, strict=True):
        assert p.shape == (k,)
        assert p.sum() == pytest.approx(1.0, abs=1e-12)
        assert (p > 0).all()
    prompts = [model.renderer.render(s, q) for s, q in items]
    for shared in (False, True):
        batch = collate(prompts, model.tokenizer.pad_token_id, shared_prefix=shared)
        label_ids = torch.tensor(model.renderer.label_ids)
        with torch.no_grad():
            logits = forward_option_logits(model.lm, batch, label_ids)  # (B, K_max)
        assert logits.shape == (4, 6)
        assert batch.option_mask.sum(1).tolist() == ks
        for row, k in enumerate(ks):
            assert torch.isfinite(logits[row, :k]).all() and torch.isneginf(logits[row, k:]).all()
        q = logits.softmax(-1)
        assert torch.allclose(q.sum(-1), torch.ones(4))
        assert (q[~batch.option_mask] == 0).all()


def test_an_answer_does_not_depend_on_the_other_questions(model: LoadedModel) -> None:
    team = TEAM.to_json()
    alone = answer_request(model, parse_request({"state": LONG, "questions": {"team": team}}))
    crowded = answer_request(
        model,
        parse_request(
            {
                "state": LONG,
                "questions": {
                    "outage": OUTAGE.to_json(),
                    "team": team,
                    "urgency": URGENCY.to_json(),
                    "refund": REFUND.to_json(),
                },
            }
        ),
    )
    a = alone["answers"]["team"]["probabilities"]
    b = crowded["answers"]["team"]["probabilities"]
    assert list(a) == list(b) == ["billing", "engineering", "support"]
    assert max(abs(a[o] - b[o]) for o in a) <= 1e-4
    # and the same question asked twice under two names gets the same answer
    twice = answer_request(model, parse_request({"state": LONG, "questions": {"x": team, "y": team}}))
    x, y = twice["answers"]["x"]["probabilities"], twice["answers"]["y"]["probabilities"]
    assert max(abs(x[o] - y[o]) for o in x) <= 1e-4


@pytest.fixture(scope="module")
def short_state_model(tiny_llama_dir: Path) -> LoadedModel:
    return sharpen(
        load_model(str(tiny_llama_dir), render=RenderConfig(max_state_tokens=24, option_form="letters"), device="cpu")
    )


def test_truncation_cuts_only_the_state_and_marks_the_cut(short_state_model: LoadedModel) -> None:
    renderer = short_state_model.renderer
    head = renderer._encode(renderer.head)
    mark = renderer._encode(TRUNCATION_MARK)
    state_ids = renderer._encode(LONG)
    assert len(state_ids) > 24
    full = renderer.render(SHORT, URGENCY)
    cut = renderer.render(LONG, URGENCY)
    assert not full.truncated and cut.truncated
    assert len(cut.prefix) == len(head) + 24
    assert cut.prefix == (*head, *state_ids[: 24 - len(mark)], *mark)  # the state's start, then the mark
    assert cut.suffix == full.suffix  # question, every option and the answer slot are whole
    text = short_state_model.tokenizer.decode(list(cut.prefix + cut.suffix))
    assert "[… state truncated]" in text and "E. blocking" in text
    # a state exactly at the limit is kept whole
    exact = short_state_model.tokenizer.decode(state_ids[:24])
    if renderer._encode(exact) == state_ids[:24]:
        assert not renderer.render(exact, URGENCY).truncated
    (p,) = probs(short_state_model, [(LONG, URGENCY)])
    assert p.shape == (5,) and p.sum() == pytest.approx(1.0)


def test_option_order_shows_permuted_letters_and_returns_canonical_logits(model: LoadedModel) -> None:
    order = (2, 0, 1)  # shown: A = support, B = billing, C = engineering
    prompt = model.renderer.render(SHORT, TEAM, order)
    shown = model.tokenizer.decode(list(prompt.suffix))
    assert (
        "A. support — How-to and account questions\nB. billing — Charges, invoices and refunds\n"
        "C. engineering — Bugs, errors and outages" in shown
    )
    batch = collate([prompt], model.tokenizer.pad_token_id)
    with torch.no_grad():
        raw = forward_option_logits(model.lm, batch, torch.tensor(model.renderer.label_ids))[0].double().numpy()
    (canonical,) = score_questions(model, [(SHORT, TEAM)], orders=[order])
    for position, option in enumerate(order):
        assert canonical[option] == pytest.approx(raw[position], abs=1e-6)
    # score levels keep their order whatever the order argument: the caller decides; default is canonical
    levels = model.tokenizer.decode(list(model.renderer.render(SHORT, URGENCY).suffix))
    assert "A. not urgent\nB. soon\nC. today\nD. this hour\nE. blocking" in levels
    yes_no = model.tokenizer.decode(list(model.renderer.render(SHORT, OUTAGE).suffix))
    assert "Answer A for yes or B for no." in yes_no and "A. yes" not in yes_no  # a plain yes / no question
    assert model.tokenizer.decode(model.renderer.head_ids()).endswith("State:\n")  # the head says no format


def test_render_rejects_bad_orders_and_set_questions(model: LoadedModel) -> None:
    with pytest.raises(ValueError, match=r"order \(0, 0, 1\) is not a permutation of the 3 options"):
        model.renderer.render(SHORT, TEAM, (0, 0, 1))
    labels = parse_question({"type": "set", "instructions": "Tags?", "criteria": {"bug": "", "vip": ""}})
    with pytest.raises(ValueError, match="question_units"):
        model.renderer.render(SHORT, labels)
    many = parse_question({"type": "choice", "instructions": "Pick", "criteria": [f"o{i}" for i in range(27)]})
    with pytest.raises(ValueError, match=r"shows 27 options; at most 26"):
        model.renderer.render(SHORT, many)


def test_label_tokens_are_single_tokens_that_continue_the_prompt(model: LoadedModel) -> None:
    renderer = model.renderer
    assert renderer.label_form in ("A", " A")
    assert len(renderer.label_ids) == 26 and len(set(renderer.label_ids)) == 26
    prompt = renderer.render(SHORT, TEAM)
    space = renderer.label_form[:-1]
    for letter, token in zip(LETTERS, renderer.label_ids, strict=True):
        text = model.tokenizer.decode(list(prompt.prefix + prompt.suffix)) + space + letter
        ids = model.tokenizer(text, add_special_tokens=False)["input_ids"]
        assert ids[-1] == token and model.tokenizer.decode([token]) == space + letter


def _word_level_tokenizer(out: Path) -> None:
    """A tokenizer without single-letter tokens: every letter maps to [UNK]."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["[UNK]", "[PAD]", "Answer", ":", "State", "Question", "the", "ticket"]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]").save_pretrained(out)


def test_a_tokenizer_without_single_letter_labels_fails_naming_the_tokenizer(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    _word_level_tokenizer(tmp_path)
    tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    with pytest.raises(LabelError) as info:
        Renderer(tokenizer)
    assert f"tokenizer {str(tmp_path)!r}" in str(info.value)
    assert "not single tokens" in str(info.value) and "(tried the forms ['A', ' A'])" in str(info.value)


def test_read_option_logits_multiplies_only_the_label_rows(model: LoadedModel) -> None:
    items = [(LONG, TEAM), (SHORT, OUTAGE), (MID, URGENCY)]
    prompts = [model.renderer.render(s, q) for s, q in items]
    batch = collate(prompts, model.tokenizer.pad_token_id, shared_prefix=False)
    label_ids = torch.tensor(model.renderer.label_ids)
    lm = model.lm
    with torch.no_grad():
        full = lm(input_ids=batch.input_ids, attention_mask=batch.attention_mask, logits_to_keep=1).logits
        assert full.shape == (3, 1, lm.config.vocab_size)
        expected = full[:, -1, label_ids[:5]]  # (B, K) read from the full LM head
        ours = forward_option_logits(lm, batch, label_ids)
        assert ours.shape == (3, 5)
        valid = batch.option_mask
        assert torch.allclose(ours[valid], expected[valid].float(), atol=1e-5)
        # every other row of the output matrix is NaN: if it were multiplied, NaN would leak into the result
        from mydecide.scoring.forward import last_hidden

        hidden = last_hidden(lm.get_decoder(), batch)  # (B, H)
        poisoned = torch.full_like(lm.get_output_embeddings().weight, float("nan"))
        poisoned[label_ids[:5]] = lm.get_output_embeddings().weight[label_ids[:5]]
        out = read_option_logits(hidden, poisoned, label_ids, valid)
        assert torch.isfinite(out[valid]).all()
        assert torch.allclose(out, ours)
