"""The pieces of `prepare` on Ray with a rule of their own, each on hand-built input: the actor that keeps the first
row of each key, the driver's near-dedup keep rule on arrays, and the key-holding actors' lifetime (one local Ray
with 2 CPUs, started for that test only)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from mydecide.data.ray.engine import key_actors
from mydecide.data.ray.near_steps import kept_by
from mydecide.data.ray.near_tasks import KeyCounts
from mydecide.data.ray.tasks import FirstSeen

ray = pytest.importorskip("ray")


@pytest.fixture
def local_ray() -> Any:
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def test_a_first_seen_share_removes_every_row_but_the_lowest_seq_of_its_key_across_blocks_and_waves() -> None:
    """FirstSeen (the actor of the exact-dedup and duplicate-id shuffles) called wave by wave, blocks in order: a
    later row of a key already seen is removed against the first row's ref, with its target conflict."""
    seen = FirstSeen()

    def share(keys: list[int], seqs: list[int], targets: list[int]) -> tuple[Any, ...]:
        k = np.array([[key, 0] for key in keys], dtype=np.uint64).reshape(-1, 2)
        return (k, np.array(seqs, dtype=np.int64), np.array(targets, dtype=np.uint64), [f"row{q}" for q in seqs])

    # wave 1: block 0 (seqs 0-2; rows given out of seq order) and block 1 (seqs 3-5)
    b0, b1 = seen.add(share([7, 9, 7], [2, 0, 1], [1, 1, 2]), share([9, 5, 5], [3, 4, 5], [1, 0, 0]))
    assert b0[0].tolist() == [2] and b0[1] == ["row1"] and b0[2].tolist() == [True]  # seq 1 came first; other target
    assert b1[0].tolist() == [3, 5] and b1[1] == ["row0", "row4"] and b1[2].tolist() == [False, False]
    # wave 2: one block; every key seen in wave 1 is still held
    removed, matched, conflicts = seen.add(share([5, 8, 7], [6, 7, 8], [0, 0, 2]))
    assert removed.tolist() == [6, 8] and matched == ["row4", "row1"] and conflicts.tolist() == [False, False]


def dead(actor: Any, wait: float = 30.0) -> bool:
    """Whether ``actor`` is gone: ``ray.kill`` returns before the actor stops, so a call made right after it may
    still be answered; poll until a call fails with the actor's death, for at most ``wait`` seconds."""
    import time

    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        try:
            ray.get(actor.__ray_ready__.remote(), timeout=max(0.1, deadline - time.monotonic()))
        except ray.exceptions.RayActorError:
            return True
        except ray.exceptions.GetTimeoutError:
            break
        time.sleep(0.1)
    return False


def test_the_key_holding_actors_go_when_their_step_ends_or_fails(local_ray: Any) -> None:
    """A waved shuffle's actors hold a share of every key seen: they are killed when the step is over, and also when
    it raises, so a failed step leaves no actor holding keys in the cluster."""
    with key_actors(KeyCounts, 2) as counts:
        ray.get([a.add.remote(np.array([4, 4, 4, 4], dtype=np.uint64)) for a in counts])
        assert [x.tolist() for x in ray.get([a.frequent.remote() for a in counts])] == [[4], [4]]
        assert not dead(counts[0], wait=0.5)  # alive while the step runs
    assert all(dead(a) for a in counts)
    with pytest.raises(RuntimeError, match="a step failed"), key_actors(FirstSeen, 1) as seen:
        raise RuntimeError("a step failed")
    assert dead(seen[0])


def test_the_keep_rule_on_arrays_removes_a_row_only_for_the_most_similar_earlier_kept_row() -> None:
    # row 2 matches 1 (0.9) and 0 (0.8), but 1 is removed by 0: 2 goes with 0; row 5 matches only 4, kept: removed;
    # row 6 matches only 5, itself removed: 6 stays; row 7 ties 0.75 on 4 and 3: the first, 3
    matches = [(1, 0, 0.95), (2, 1, 0.9), (2, 0, 0.8), (5, 4, 0.7), (6, 5, 0.99), (7, 4, 0.75), (7, 3, 0.75)]
    table = kept_by(np.array(matches[::-1], dtype=np.float64))
    assert table.tolist() == [[1, 0, 0.95], [2, 0, 0.8], [5, 4, 0.7], [7, 3, 0.75]]
    assert kept_by(np.zeros((0, 3))).shape == (0, 3)
