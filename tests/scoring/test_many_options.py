"""Choice questions with 27–255 options: groups of ≤ 26 plus a final round among the group leaders."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from mydecide.prompt import RenderConfig
from mydecide.records import parse_question
from mydecide.scoring.plan import (
    ScoringPlan,
    combine,
    is_grouped,
    option_groups,
    prompt_count,
    shown_letter_index,
    sub_question,
)
from mydecide.scoring.probabilities import log_softmax

STATE = "The invoice was charged twice and the customer wants a refund."


def choice(k: int):
    return parse_question(
        {
            "type": "choice",
            "instructions": "Which team should handle this ticket?",
            "criteria": {f"team_{i}": f"Team number {i}" for i in range(k)},
        },
        "q",
    )


NOUL = parse_question({"type": "noul", "instructions": "Is a production system down?"}, "n")


# ------------------------------------------------------------------------------------------------- pure parts


@pytest.mark.parametrize(
    ("k", "sizes"), [(27, [14, 13]), (52, [26, 26]), (53, [18, 18, 17]), (77, [26, 26, 25]), (255, [26] * 5 + [25] * 5)]
)
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
    from mydecide.scoring.probabilities import to_probabilities

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

    # groups and a final round are how the letters form scores more than 26 options
    return load_model(str(tiny_llama_dir), render=RenderConfig(option_form="letters"), device="cpu")


def test_plan_rounds_on_a_tiny_model(model) -> None:
    from mydecide.scoring.forward import score_prompts

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
    from mydecide.scoring.engine import score_questions
    from mydecide.scoring.probabilities import to_probabilities

    (z,) = score_questions(model, [(STATE, choice(k))])
    p = to_probabilities("choice", z)
    assert p.shape == (k,) and np.all(p > 0)
    assert p.sum() == pytest.approx(1.0, abs=1e-9)
    np.testing.assert_allclose(np.exp(z), p, atol=1e-9)  # the logits are log P(o) already


def test_same_answer_alone_or_with_other_questions(model) -> None:
    from mydecide.scoring.engine import score_questions

    big = choice(60)
    (alone,) = score_questions(model, [(STATE, big)])
    together = score_questions(model, [(STATE, NOUL), (STATE, choice(30)), (STATE, big), ("Another state.", big)])
    np.testing.assert_allclose(together[2], alone, atol=1e-4)
    (unshared,) = score_questions(model, [(STATE, big)], shared_prefix=False, batch_size=1)
    np.testing.assert_allclose(unshared, alone, atol=1e-4)


def test_an_order_regroups_the_options_and_logits_stay_canonical(model) -> None:
    from mydecide.scoring.engine import score_questions

    q = choice(30)
    order = list(range(30))[::-1]
    (z,) = score_questions(model, [(STATE, q)], orders=[order])
    plan = ScoringPlan(model.renderer, [(STATE, q)], [order])
    assert plan.items[0].groups == [tuple(order[:15]), tuple(order[15:])]
    assert np.exp(z).sum() == pytest.approx(1.0, abs=1e-9)
    with pytest.raises(ValueError, match="not a permutation"):
        ScoringPlan(model.renderer, [(STATE, q)], [[0] * 30])


# ---------------------------------------------------------------------------------------------------- serving


def test_served_answer_has_every_option_and_matches_score_questions(model) -> None:
    from fastapi.testclient import TestClient

    from mydecide.scoring.engine import score_questions
    from mydecide.scoring.probabilities import to_probabilities
    from mydecide.serving.app import create_app
    from mydecide.serving.batching import BatchOptions

    big = {
        "type": "choice",
        "instructions": "Which team should handle this ticket?",
        "criteria": {f"team_{i}": f"Team number {i}" for i in range(77)},
    }
    others = {
        "outage": {"type": "noul", "instructions": "Is a production system down?"},
        "small": {"type": "choice", "instructions": "Which word fits?", "criteria": ["refund", "outage"]},
    }
    (expected,) = score_questions(model, [(STATE, choice(77))])
    for packing in (True, False):
        with TestClient(create_app(model, batching=BatchOptions(packing=packing), warm_up=False)) as client:
            alone = client.post("/v1/systemone", json={"state": STATE, "questions": {"big": big}}).json()
            mixed = client.post("/v1/systemone", json={"state": STATE, "questions": {**others, "big": big}}).json()
        for body in (alone, mixed):
            answer = body["answers"]["big"]
            p = np.array(list(answer["probabilities"].values()))
            assert list(answer["probabilities"]) == [f"team_{i}" for i in range(77)]
            assert p.sum() == pytest.approx(1.0, abs=1e-9) and np.all(p > 0)
            np.testing.assert_allclose(p, to_probabilities("choice", expected), atol=1e-4)
            assert answer["choice"] == f"team_{int(np.argmax(expected))}"
            assert answer["confidence"] == pytest.approx((77 * p.max() - 1) / 76, abs=1e-9)
        assert mixed["usage"]["input_tokens"] > alone["usage"]["input_tokens"] > 0
    from mydecide.config import Limits
    from mydecide.serving.request import RequestError, parse_request

    with pytest.raises(RequestError, match="choice needs 2 to 40 options"):
        parse_request({"state": STATE, "questions": {"big": big}}, Limits(max_choice_options=40))
    with pytest.raises(RequestError, match="more than 3 scored prompts"):  # 77 options: 3 groups + 1 final
        parse_request({"state": STATE, "questions": {"big": big}}, Limits(max_prompts=3))


def test_predict_answers_a_255_option_request(model) -> None:
    from mydecide.serving.request import parse_request
    from mydecide.serving.response import answer_request

    body = {"state": STATE, "questions": {"q": choice(255).to_json()}}
    out = answer_request(model, parse_request(body))
    p = out["answers"]["q"]["probabilities"]
    assert len(p) == 255 and sum(p.values()) == pytest.approx(1.0, abs=1e-9)


# --------------------------------------------------------------------------------------------------- training


def record(k: int, gold: int, rid: str = "r1", target: dict[str, float] | None = None):
    from mydecide.records import parse_record

    row = {"id": rid, "task": "route", "state": STATE, "question": choice(k).to_json()}
    row.update({"target": target} if target else {"answer": f"team_{gold}"})
    return parse_record(row)[0]


def test_a_40_option_record_trains_on_its_gold_among_25_fresh_distractors(model) -> None:
    from mydecide.training.batches import epoch_units, sampled_options, shown_order

    r = record(40, gold=33)
    seen: set[int] = set()
    for epoch in range(12):
        order = shown_order(r, 5, epoch, shuffle=True)
        shown = sampled_options(r, order, 5, epoch)
        assert len(shown) == 26 and 33 in shown and len(set(shown)) == 26
        assert shown == [i for i in order if i in shown]  # in the epoch's shuffled order
        assert shown == sampled_options(r, order, 5, epoch)  # deterministic in seed / epoch / record
        seen.update(shown)
        (unit,) = epoch_units(model.renderer, [r], seed=5, epoch=epoch, shuffle_options=True)
        assert unit.prompt.k == 26 and sum(unit.target) == pytest.approx(1.0)
        letter = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"[shown.index(33)]
        assert unit.target[shown.index(33)] == 1.0
        assert f"{letter}. team_33 — Team number 33" in model.tokenizer.decode(list(unit.prompt.suffix))
    assert seen == set(range(40))  # over the epochs every distractor is shown
    assert sampled_options(r, list(range(40)), 5, 0) != sampled_options(record(40, 33, "r2"), list(range(40)), 5, 0)


def test_soft_targets_keep_every_option_with_mass() -> None:
    from mydecide.training.batches import sampled_options

    r = record(30, 0, target={"team_3": 0.5, "team_29": 0.3, "team_7": 0.2})
    shown = sampled_options(r, list(range(30)), 1, 0)
    assert {3, 7, 29} <= set(shown) and len(shown) == 26
    many = record(40, 0, target={f"team_{i}": 1 / 30 for i in range(30)})
    shown = sampled_options(many, list(range(40)), 1, 0)
    assert shown == list(range(26))  # 30 options with mass: the 26 largest (ties by index), no distractor


def test_training_on_40_option_records_runs_and_dev_metrics_score_them(tiny_llama_dir: Path, tmp_path: Path) -> None:
    import json
    import math

    from mydecide.config import TrainRecipe
    from mydecide.recipe_loading import load_recipe
    from mydecide.training.loop import train

    data = tmp_path / "data"
    data.mkdir()
    for name, n in (("train", 8), ("dev", 3)):
        rows = [record(40, (i * 7) % 40, f"{name}{i}").to_json() for i in range(n)]
        (data / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    smoke = Path(__file__).resolve().parents[2] / "recipes" / "train" / "smoke.yaml"
    run = train(
        load_recipe(
            smoke,
            [
                f"model={tiny_llama_dir}",
                f"data={data}",
                f"out={tmp_path / 'run'}",
                "optim.max_steps=2",
                "optim.batch_size=2",
                "optim.grad_accum=1",
            ],
            model=TrainRecipe,
        )
    )
    dev = [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if r["kind"] == "dev"]
    assert len(dev) >= 2 and all(math.isfinite(r["log_loss"]) and r["n"] == 3 for r in dev)
    assert dev[0]["log_loss"] == pytest.approx(math.log(40), abs=1.0)  # a random model: near uniform over 40
    assert dev[0]["top_letter"] == "-"  # read option by option (the default form): no answer letter to count
    assert (run / "adapter" / "adapter_config.json").is_file()


def test_evaluate_and_calibrate_questions_with_more_than_26_options(model) -> None:
    from mydecide.calibration.temperatures import option_bucket
    from mydecide.evaluation.run import run_evaluation

    records = [record(30, i, f"e{i}") for i in range(3)]
    ev = run_evaluation(model, records, permutations=1, base=False, progress=False)
    report = ev.report
    assert report["choice"]["n"] == 3 and report["choice"]["flip_n"] == 3
    for row in ev.predictions:
        assert len(row["probabilities"]) == 30 and sum(row["probabilities"].values()) == pytest.approx(1.0)
    assert option_bucket(30) == "27+"  # calibrate --by-bucket gives these questions their own temperature
    with pytest.raises(ValueError, match="at most 255"):
        run_evaluation(model, [_too_many()], progress=False)


def _too_many():
    from mydecide.records import Question, Record

    q = Question("choice", "Which?", tuple(f"o{i}" for i in range(256)), ("",) * 256)
    return Record(task="t", state=STATE, question=q, target=(1.0,) + (0.0,) * 255, id="x")
