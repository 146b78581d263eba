"""Training batches: options shuffled per epoch with targets attached, score order kept, questions grouped by state."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from mydecide.prompt import RenderConfig
from mydecide.records import parse_record
from mydecide.scoring.render import Renderer
from mydecide.training.batches import epoch_units, make_batch, plan_batches, shown_order

CHOICE = {
    "id": "c1",
    "task": "route",
    "state": "Checkout returns HTTP 500.",
    "question": {
        "type": "choice",
        "instructions": "Which team?",
        "criteria": {"billing": "money", "engineering": "bugs", "support": "help", "sales": "deals"},
    },
    "target": {"billing": 0.1, "engineering": 0.6, "support": 0.2, "sales": 0.1},
}
SCORE = {
    "id": "s1",
    "task": "urgency",
    "state": "Checkout returns HTTP 500.",
    "question": {"type": "score", "instructions": "How urgent?", "criteria": ["low", "mid", "high", "critical"]},
    "answer": 3,
}


@pytest.fixture(scope="module")
def renderer(tiny_llama_dir: Path) -> Renderer:
    from transformers import AutoTokenizer

    return Renderer(
        AutoTokenizer.from_pretrained(tiny_llama_dir), RenderConfig(option_form="letters", score_form="letters")
    )


def test_shuffled_targets_stay_attached_to_their_options(renderer: Renderer) -> None:
    record = parse_record(CHOICE)[0]
    orders = set()
    for epoch in range(8):
        (unit,) = epoch_units(renderer, [record], seed=1, epoch=epoch, shuffle_options=True)
        order = unit.prompt.order
        orders.add(order)
        for position, option_index in enumerate(order):
            assert unit.target[position] == record.target[option_index]
        # the letter shown for "engineering" carries the 0.6
        shown = renderer.tokenizer.decode(list(unit.prompt.suffix))
        letter = "ABCD"[order.index(record.question.options.index("engineering"))]
        assert f"{letter}. engineering" in shown
        assert unit.target["ABCD".index(letter)] == pytest.approx(0.6)
    assert len(orders) > 3  # the order really changes between epochs


def test_score_levels_are_never_shuffled(renderer: Renderer) -> None:
    record = parse_record(SCORE)[0]
    for epoch in range(6):
        assert shown_order(record, 7, epoch, shuffle=True) == [0, 1, 2, 3]
        (unit,) = epoch_units(renderer, [record], seed=7, epoch=epoch, shuffle_options=True)
        assert unit.target == (0.0, 0.0, 0.0, 1.0) and unit.is_score


def test_order_is_deterministic_in_seed_and_epoch() -> None:
    record = parse_record(CHOICE)[0]
    assert shown_order(record, 3, 2, True) == shown_order(record, 3, 2, True)
    assert shown_order(record, 3, 2, False) == [0, 1, 2, 3]


def test_batches_keep_a_states_questions_together_and_cover_every_unit(renderer: Renderer) -> None:
    records = []
    for i in range(12):
        state = f"ticket {i} " + "word " * (i * 7)
        for j, rec in enumerate((CHOICE, SCORE)):
            records.extend(parse_record({**rec, "id": f"{i}-{j}", "state": state}))
    units = epoch_units(renderer, records, seed=0, epoch=0, shuffle_options=True)
    batches = plan_batches(units, batch_size=4, seed=0, epoch=0)
    assert sorted(u.record_index for b in batches for u in b) == list(range(len(records)))
    for batch in batches:  # a state's two questions are adjacent, so they land in the same batch of 4
        prefixes = [u.prompt.prefix for u in batch]
        assert all(prefixes.count(p) == 2 for p in prefixes)
    tb = make_batch(batches[0], renderer.tokenizer.pad_token_id, shared_prefix=True)
    assert tb.batch.prefix_ids is not None and tb.batch.prefix_ids.shape[0] == 2  # two states, computed once each
    assert tb.targets.shape == tb.batch.option_mask.shape
    assert tb.targets.sum(dim=1).tolist() == pytest.approx([1.0] * 4)


def test_length_buckets_reduce_padding(renderer: Renderer) -> None:
    records = [parse_record({**SCORE, "id": str(i), "state": "word " * (1 + (i * 37) % 200)})[0] for i in range(64)]
    units = epoch_units(renderer, records, seed=0, epoch=0, shuffle_options=False)

    def padding(buckets: bool) -> float:
        batches = plan_batches(units, 8, seed=0, epoch=0, length_buckets=buckets)
        made = [make_batch(b, 0, shared_prefix=False).batch for b in batches]
        return 1 - sum(b.n_tokens for b in made) / sum(b.n_padded for b in made)

    assert padding(True) < 0.5 * padding(False)


def test_task_weights_show_a_small_task_more_often_and_keep_every_epoch_the_same_size(renderer: Renderer) -> None:
    small = [parse_record({**CHOICE, "id": f"s{i}", "task": "small"})[0] for i in range(10)]
    big = [parse_record({**SCORE, "id": f"b{i}", "task": "big", "state": f"review {i}"})[0] for i in range(40)]
    records = small + big
    sizes, seen = set(), Counter[int]()
    for epoch in range(4):
        units = epoch_units(renderer, records, 0, epoch, True, task_weights={"small": 2.5, "big": 0.5})
        sizes.add(len(units))
        seen.update(u.record_index for u in units)
        per_record = Counter(u.record_index for u in units)
        assert sorted(per_record[i] for i in range(10)).count(3) == 5  # 25 showings: each twice, 5 of them thrice
        assert sum(per_record[i] for i in range(10, 50)) == 20  # half of the big task
        batches = plan_batches(units, 4, seed=0, epoch=epoch)
        assert len(batches) == -(-45 // 4)
        together = sum(
            len({u.record_index for u in b if u.record_index < 10}) < sum(u.record_index < 10 for u in b)
            for b in batches
        )
        assert together <= 2  # two showings of one record are two groups, shuffled apart (together only by chance)
    assert sizes == {45}
    assert all(seen[i] > 0 for i in range(50))  # over four epochs every big record is drawn at least once
    assert seen.total() == 4 * 45
    # the showings of one choice record see the options in different orders
    units = epoch_units(renderer, small[:1], 0, 0, True, task_weights={"small": 3})
    assert len({u.target for u in units}) > 1 and {u.copy for u in units} == {0, 1, 2}
    # weight 1 everywhere is the unweighted plan
    plain = epoch_units(renderer, records, 0, 0, True)
    assert plain == epoch_units(renderer, records, 0, 0, True, task_weights={"small": 1.0})


def test_the_epoch_plan_counts_weighted_showings(renderer: Renderer) -> None:
    from mydecide.config import TrainRecipe
    from mydecide.training.epochs import EpochPlan

    records = [parse_record({**CHOICE, "id": f"s{i}", "task": "small"})[0] for i in range(10)]
    records += [parse_record({**SCORE, "id": f"b{i}", "state": f"review {i}", "task": "big"})[0] for i in range(30)]
    plain = EpochPlan(TrainRecipe(optim={"batch_size": 4, "epochs": 2, "grad_accum": 1}), renderer, records, 1, 0)
    weighted = TrainRecipe(optim={"batch_size": 4, "epochs": 2, "grad_accum": 1}, task_weights={"small": 3})
    plan = EpochPlan(weighted, renderer, records, 1, 0)
    assert (plain.micro_per_epoch, plan.micro_per_epoch, plan.total_updates) == (10, 15, 30)
    shown = Counter(u.record_index for m in range(15, 30) for u in plan.units(m))  # the second epoch
    assert [shown[i] for i in range(40)] == [3] * 10 + [1] * 30
    assert [plan.epoch(u) for u in (0, 14, 15, 30)] == [0.0, 14 / 15, 1.0, 2.0]
    assert [u for u in range(1, 31) if plan.epoch_ends(u)] == [15, 30]
