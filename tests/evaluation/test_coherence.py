"""`evaluate --coherence`: jevbench's laws run on the evaluated records through the wire answerer, and the table."""

from __future__ import annotations

from typing import Any

import jevbench as jb
import numpy as np
import pytest
from jevbench.relations.mea import NEGATIONS

from mydecide.commands.options import recipe_from_command_line
from mydecide.config import EvalRecipe
from mydecide.errors import UserError
from mydecide.evaluation.coherence import (
    coherence_cases,
    coherence_lines,
    coherence_markdown,
    jevbench_coherence,
    wire_answerer,
)
from mydecide.records import Record, parse_record
from tests.evaluation.test_evaluation import CHOICE, NOUL, SCORE

ONE = lambda qtype, k: 1.0  # noqa: E731 (T = 1 for every type)
NEGATED = tuple(t.split("{instructions}")[0] for t in NEGATIONS)  # what jevbench's negation wrappers begin with


def eight_states() -> list[Record]:
    rows: list[dict[str, Any]] = []
    for i in range(8):
        state = f"Ticket {i}: checkout returns HTTP 500 for every customer since 09:{10 + i}."
        rows += [
            {"task": "routing", "state": state, "question": CHOICE, "answer": "engineering"},
            {"task": "outage", "state": state, "question": NOUL, "answer": True},
            {"task": "urgency", "state": state, "question": SCORE, "answer": 2},
        ]
    return [r for row in rows for r in parse_record(row)]


def by_content(items, orders=None):
    """Reads each question on its own (its instructions and option texts): no batch can move it."""
    out = []
    for _, q in items:
        if q.type == "noul":
            out.append(np.array([len(q.instructions) % 5 / 2.0, 0.0]))
        else:
            out.append(np.array([len(q.instructions + d) % 7 / 3.0 for d in q.descriptions]))
    return out


def crowd_sensitive(items, orders=None):
    """An answer that moves with the number of questions asked with it."""
    return [np.linspace(0.0, len(items) / 4, q.k) for _, q in items]


def reads_negation(items, orders=None):
    """P(yes) 0.8, and 0.2 for a question wrapped in one of jevbench's negations."""
    return [
        np.array([0.0, np.log(4.0)] if q.instructions.startswith(NEGATED) else [np.log(4.0), 0.0])
        if q.type == "noul"
        else np.zeros(q.k)
        for _, q in items
    ]


def ignores_negation(items, orders=None):
    return [np.array([np.log(4.0), 0.0]) if q.type == "noul" else np.zeros(q.k) for _, q in items]


def run(model, records=None, **kw):
    return jevbench_coherence(model, records or eight_states(), cases=8, seed=13, bootstrap=0, progress=False, **kw)


def test_cases_are_the_sampled_states_with_the_questions_jevbench_can_ask() -> None:
    rows = [
        {"task": "routing", "state": "a", "question": CHOICE, "answer": "billing"},
        {"task": "routing", "state": "a", "question": CHOICE, "answer": "support"},  # the same task twice
        {"task": "outage", "state": "a", "question": NOUL, "answer": True},
        {"task": "urgency", "state": "b", "question": SCORE, "answer": 0},
        {"task": "tags", "state": "c", "question": {**CHOICE, "type": "set"}, "answer": ["billing"]},
        {
            "task": "down",
            "state": "c",
            "question": {**NOUL, "criteria": {"true": "it is down", "false": "it is up"}},
            "answer": False,
        },
    ]
    records = [r for row in rows for r in parse_record(row)]
    cases, left_out = coherence_cases(records, 5, seed=13)
    assert left_out == {"noul with criteria": 1, "set": 1}  # state c has nothing jevbench can ask
    assert [(c.id, list(c.questions)) for c in cases] == [
        ("state-1", ["routing", "routing_2", "outage"]),
        ("state-2", ["urgency"]),
    ]
    assert cases[0].questions["routing"] == CHOICE and cases[0].questions["outage"] == NOUL
    assert cases[1].questions["urgency"] == SCORE
    many, _ = coherence_cases(eight_states(), 3, seed=13)
    assert [c.id for c in many] == [c.id for c in coherence_cases(eight_states(), 3, seed=13)[0]]  # seeded
    assert len(many) == 3 and [c.id for c in many] == sorted(c.id for c in many)  # in file order
    assert [c.id for c in many] != [c.id for c in coherence_cases(eight_states(), 3, seed=14)[0]]


def test_the_wire_answerer_answers_as_the_server_does() -> None:
    answer = wire_answerer(reads_negation, lambda qtype, k: 2.0 if qtype == "noul" else 1.0)
    out = answer("a ticket", {"down": NOUL, "team": CHOICE, "urgency": SCORE})
    p_yes = 1.0 / (1.0 + np.exp(-np.log(4.0) / 2.0))  # the noul temperature 2 applies
    assert out["down"] == {"type": "noul", "noul": pytest.approx(p_yes)}
    assert out["team"] == {  # the server's answer object (scoring.probabilities.build_answer)
        "type": "choice",
        "choice": "billing",
        "confidence": pytest.approx(0.0),
        "probabilities": dict.fromkeys(CHOICE["criteria"], pytest.approx(1 / 3)),
    }
    assert out["urgency"] == {
        "type": "score",
        "score": pytest.approx(1.0),
        "confidence": pytest.approx(0.0),
        "probabilities": dict.fromkeys(("0", "1", "2"), pytest.approx(1 / 3)),
        "legend": {"0": "not urgent", "1": "today", "2": "blocking"},
    }


def test_a_batch_dependent_answerer_fails_batch_independence_that_a_content_one_passes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    calls = 0

    def counted(state, questions):
        nonlocal calls
        calls += 1
        return wire_answerer(by_content, ONE)(state, questions)

    coherent = jevbench_coherence(counted, eight_states(), cases=8, seed=13, bootstrap=0, progress=True)
    assert (
        "coherence: jevbench 0.1.0, 8 states (24 questions), 46 relations: about 581 requests"
        in capsys.readouterr().err
    )
    assert coherent["requests"] == calls == 578  # what the model was asked (a repeated request is answered once)
    assert coherent["groups"]["BAT.isolation"] == {"score": 1.0, "n": 88}
    crowd = run(wire_answerer(crowd_sensitive, ONE))
    assert crowd["groups"]["BAT.isolation"] == {"score": pytest.approx(0.6), "n": 88}
    assert crowd["relations"]["batch_solo"] == {"score": 0.0, "n": 24}
    assert crowd["relations"]["batch_size_sweep"] == {"score": 0.0, "n": 8}
    assert crowd["dimensions"]["BAT"] == {"score": pytest.approx(0.6), "n": 88}


def test_a_noul_and_its_negation_sum_to_one_only_for_an_answerer_that_reads_the_negation() -> None:
    assert run(wire_answerer(reads_negation, ONE))["relations"]["negation_wrapper"] == {"score": 1.0, "n": 8}
    assert run(wire_answerer(ignores_negation, ONE))["relations"]["negation_wrapper"] == {"score": 0.0, "n": 8}


def test_jevbench_fakes_through_the_wiring_score_as_jevbench_scores_them() -> None:
    coherent, biased = run(jb.fake("coherent")), run(jb.fake("biased"))
    assert coherent["overall"] == pytest.approx(0.5863636, abs=1e-6)
    assert biased["overall"] == pytest.approx(0.4102273, abs=1e-6)
    assert coherent["groups"]["REP.equivariance"] == {"score": 1.0, "n": 32}
    assert biased["groups"]["REP.equivariance"]["score"] == pytest.approx(0.6041667, abs=1e-6)  # first-option bias
    assert (coherent["groups"]["CHO.conditioning"]["score"], biased["groups"]["CHO.conditioning"]["score"]) == (
        1.0,
        0.4375,
    )
    assert list(coherent["dimensions"]) == ["REP", "BAT", "MEA", "LOG", "CHO"]
    assert set(coherent["not_run"]) == {
        "instruction_paraphrase",
        "cross_lingual",
        "description_paraphrase",
        "natural_negation",
    }
    assert coherent["groups"]["LOG.bounds"] == {"score": None, "n": 0}  # a case with one noul has no conjunction


def test_the_table_in_the_terminal_and_in_report_md() -> None:
    block = run(wire_answerer(crowd_sensitive, ONE))
    lines = coherence_lines(block)
    assert lines[0] == "coherence (jevbench 0.1.0, 8 states, 24 questions, seed 13): overall 46.1"
    assert lines[2] == "  BAT  60.0 (n 88)  isolation 60.0"
    markdown = "\n".join(coherence_markdown(block))
    assert "| **BAT** | **60.0** | 88 |\n| BAT.isolation | 60.0 | 88 |" in markdown
    assert "| LOG.bounds | — | 0 |" in markdown
    assert "Not run (need a judged rewrite bank): instruction_paraphrase, cross_lingual" in markdown


def test_the_recipe_key_is_a_count_of_states() -> None:
    def recipe(overrides: list[str], options: dict[str, Any] | None = None) -> EvalRecipe:
        return recipe_from_command_line(EvalRecipe, overrides, options or {})

    assert recipe([]).coherence == 0 and recipe(["coherence=12"]).coherence == 12
    with pytest.raises(UserError, match="coherence"):
        recipe(["coherence=-1"])
    with pytest.raises(UserError, match="coherence"):
        recipe(["coherence=true"])  # the old switch: say how many states instead
