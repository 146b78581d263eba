"""Choice questions with 27–255 options: groups of ≤ 26 plus a final round among the group leaders."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from mydecide.many_options import (
    ScoringPlan,
    combine,
    is_grouped,
    log_softmax,
    option_groups,
    prompt_count,
    shown_letter_index,
    sub_question,
)
from mydecide.records import parse_question

STATE = "The invoice was charged twice and the customer wants a refund."


def choice(k: int):
    return parse_question({"type": "choice", "instructions": "Which team should handle this ticket?",
                           "criteria": {f"team_{i}": f"Team number {i}" for i in range(k)}}, "q")


NOUL = parse_question({"type": "noul", "instructions": "Is a production system down?"}, "n")


# ------------------------------------------------------------------------------------------------- pure parts


@pytest.mark.parametrize(("k", "sizes"), [(27, [14, 13]), (52, [26, 26]), (53, [18, 18, 17]),
                                          (77, [26, 26, 25]), (255, [26] * 5 + [25] * 5)])
def test_groups_are_consecutive_nearly_equal_and_at_most_26(k: int, sizes: list[int]) -> None:
    order = list(np.random.default_rng(k).permutation(k))
    groups = option_groups(order)
    assert [len(g) for g in groups] == sizes
    assert [i for g in groups for i in g] == order  # shown order kept, nothing lost or repeated
    assert prompt_count(choice(k)) == len(sizes) + 1


def test_prompt_counts_and_letters() -> None:
    assert prompt_count(choice(26)) == 1 and not is_grouped(choice(26)) and is_grouped(choice(27))
    assert prompt_count(NOUL) == 1
    assert shown_letter_index(5, 3) == 3
    assert [shown_letter_index(27, p) for p in (0, 13, 14, 26)] == [0, 13, 0, 12]


def test_combination_is_the_product_of_the_rounds_and_sums_to_one() -> None:
    rng = np.random.default_rng(0)
    groups = option_groups(list(rng.permutation(60)))
    group_logits = [rng.normal(size=len(g)) * 3 for g in groups]
    final = rng.normal(size=len(groups))
    z = combine(groups, group_logits, final, 60)
    p = np.exp(z)
    assert p.sum() == pytest.approx(1.0, abs=1e-12)
    pg = np.exp(log_softmax(final))
    for g, (indices, zg) in enumerate(zip(groups, group_logits, strict=True)):
        assert p[list(indices)].sum() == pytest.approx(pg[g], abs=1e-12)  # P(g)
        np.testing.assert_allclose(p[list(indices)] / pg[g], np.exp(log_softmax(zg)), atol=1e-12)  # p(o | g)


def test_temperature_on_log_probabilities_tempers_the_distribution() -> None:
    from mydecide.modeling import to_probabilities

    rng = np.random.default_rng(1)
    groups = option_groups(list(range(40)))
    z = combine(groups, [rng.normal(size=len(g)) for g in groups], rng.normal(size=2), 40)
    p, t = np.exp(z), 2.5
    expected = p ** (1 / t) / (p ** (1 / t)).sum()
    np.testing.assert_allclose(to_probabilities("choice", z, t), expected, atol=1e-12)
    assert int(np.argmax(to_probabilities("choice", z, t))) == int(np.argmax(p))


def test_sub_question_keeps_ids_and_descriptions_in_the_given_order() -> None:
    q = sub_question(choice(30), [5, 2, 29])
    assert q.options == ("team_5", "team_2", "team_29") and q.descriptions[2] == "Team number 29"


# ---------------------------------------------------------------------------------------------- on a tiny model


@pytest.fixture(scope="module")
def model(tiny_llama_dir: Path):
    from mydecide.modeling import load_model

    return load_model(str(tiny_llama_dir), device="cpu")


def test_plan_rounds_on_a_tiny_model(model) -> None:
    from mydecide.modeling import score_prompts

    q = choice(40)
    plan = ScoringPlan(model.renderer, [(STATE, NOUL), (STATE, q)])
    assert len(plan.pending) == 1 + 2 and plan.owner == [0, 1, 1]
    assert all(p.k <= 26 for p in plan.pending) and len({p.prefix for p in plan.pending}) == 1
    plan.read(score_prompts(model, plan.pending))
    (final,) = plan.pending  # the final round: one prompt, the two group leaders
    assert final.k == 2 and final.prefix == plan.prompts[0].prefix
    with pytest.raises(ValueError, match="still to be scored"):
        plan.logits()
    plan.read(score_prompts(model, plan.pending))
    assert plan.pending == []
    z_noul, z = plan.logits()
    assert z_noul.shape == (2,) and z.shape == (40,)
    # the final round's options are the leaders of the groups
    leaders = [g[int(np.argmax(r))] for g, r in zip(plan.items[1].groups, plan.items[1].rows, strict=True)]
    shown = model.tokenizer.decode(list(final.suffix))
    assert all(f"{q.options[i]} — {q.descriptions[i]}" in shown for i in leaders)
    assert plan.tokens(shared_prefix=True) < plan.tokens(shared_prefix=False)


@pytest.mark.parametrize("k", [27, 77, 255])
def test_every_option_gets_a_probability_summing_to_one(model, k: int) -> None:
    from mydecide.modeling import score_questions, to_probabilities

    (z,) = score_questions(model, [(STATE, choice(k))])
    p = to_probabilities("choice", z)
    assert p.shape == (k,) and np.all(p > 0)
    assert p.sum() == pytest.approx(1.0, abs=1e-9)
    np.testing.assert_allclose(np.exp(z), p, atol=1e-9)  # the logits are log P(o) already


def test_same_answer_alone_or_with_other_questions(model) -> None:
    from mydecide.modeling import score_questions

    big = choice(60)
    (alone,) = score_questions(model, [(STATE, big)])
    together = score_questions(model, [(STATE, NOUL), (STATE, choice(30)), (STATE, big), ("Another state.", big)])
    np.testing.assert_allclose(together[2], alone, atol=1e-4)
    (unshared,) = score_questions(model, [(STATE, big)], shared_prefix=False, batch_size=1)
    np.testing.assert_allclose(unshared, alone, atol=1e-4)


def test_an_order_regroups_the_options_and_logits_stay_canonical(model) -> None:
    from mydecide.modeling import score_questions

    q = choice(30)
    order = list(range(30))[::-1]
    (z,) = score_questions(model, [(STATE, q)], orders=[order])
    plan = ScoringPlan(model.renderer, [(STATE, q)], [order])
    assert plan.items[0].groups == [tuple(order[:15]), tuple(order[15:])]
    assert np.exp(z).sum() == pytest.approx(1.0, abs=1e-9)
    with pytest.raises(ValueError, match="not a permutation"):
        ScoringPlan(model.renderer, [(STATE, q)], [[0] * 30])
