"""Splits: held-out tasks whole, train/dev/test by a stable state hash, caps by a stable sample."""

from __future__ import annotations

import pytest
from prepare_builders import NOUL, make

from mydecide.data import split
from mydecide.records import Record, parse_record


def records(n: int, start: int = 0, task: str = "tickets") -> list[Record]:
    return [parse_record(make(i, task=task))[0] for i in range(start, start + n)]


def by_id(rs: list[Record], indices: dict[str, list[int]]) -> dict[str, str]:
    return {rs[i].id: name for name, idx in indices.items() for i in idx}


def test_appending_rows_never_moves_old_rows() -> None:
    old = records(300)
    before = by_id(old, split.split_records(old, dev_fraction=0.2, test_fraction=0.1, seed=13))
    grown = records(200, start=1000) + old[:150] + records(100, start=2000) + old[150:]  # new rows anywhere
    after = by_id(grown, split.split_records(grown, dev_fraction=0.2, test_fraction=0.1, seed=13))
    assert {rid: after[rid] for rid in before} == before


def test_fractions_and_seed() -> None:
    rs = records(2000)
    sizes = {k: len(v) for k, v in split.split_records(rs, dev_fraction=0.2, test_fraction=0.1, seed=13).items()}
    assert sizes["heldout"] == 0 and sum(sizes.values()) == 2000
    assert 330 <= sizes["dev"] <= 470 and 140 <= sizes["test"] <= 260  # binomial, > 4 sigma margins
    other = split.split_records(rs, dev_fraction=0.2, seed=14)
    assert other["dev"] != split.split_records(rs, dev_fraction=0.2, seed=13)["dev"]


def test_heldout_tasks_go_out_whole_and_questions_on_one_state_stay_together() -> None:
    rs = records(200) + records(50, start=5000, task="other")
    same_state = [parse_record(make(i, question=NOUL, task="outage"))[0] for i in range(200)]
    indices = split.split_records(rs + same_state, heldout_tasks=["other"], dev_fraction=0.3, seed=13)
    assert indices["heldout"] == list(range(200, 250))
    placed = {}
    for name, idx in indices.items():
        for i in idx:
            placed.setdefault((rs + same_state)[i].state, set()).add(name)
    assert all(len(names) == 1 for names in placed.values())


def test_unknown_heldout_task_is_an_error_naming_it() -> None:
    with pytest.raises(ValueError, match=r"\['typo'\].*\['tickets'\]"):
        split.split_records(records(5), heldout_tasks=["typo"])


def test_cap_keeps_a_stable_sample_per_task() -> None:
    rs = records(100) + records(10, start=500, task="small")
    removed = split.capped(rs, 30, seed=13)
    assert len(removed) == 70 and set(removed.values()) == {"tickets"}
    assert split.capped(list(reversed(rs)), 30, seed=13).keys() == {109 - i for i in removed}  # order-free
    assert len(split.capped(rs, {"small": 4}, seed=13)) == 6
    assert split.capped(rs, None, seed=13) == {}
