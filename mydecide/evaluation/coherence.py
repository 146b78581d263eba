"""Coherence: JevBench's laws (the pinned ``jevbench`` package, called as a library) on the records evaluated.

``mydecide evaluate --coherence`` (recipe key ``coherence``: how many states) samples states of the eval data with
the recipe's seed, makes each one a JevBench case (its state and its noul, choice and score questions, keyed by
task), and has jevbench run every relation it scores through :func:`wire_answerer`: the same scoring and
temperatures as the rest of the report, answered in the wire format. The result is JevBench's dimension and group
table: REP (representation), BAT (batch independence), MEA (probability measure), LOG (logical), CHO (choice set),
scores 0–1 (the share of tests within tolerance), with the tests behind each group.

What is not measured, and why: set and span questions (JevBench has no such type) and nouls with yes / no
criteria (its nouls take none) are left out of the cases; the relations that need a judged rewrite bank for each
question (natural negation, paraphrases, translations) are not run, as the bank exists only for jevbench's suite.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from mydecide.records import Question, Record, parse_question
from mydecide.scoring.engine import QuestionScorer
from mydecide.scoring.probabilities import TemperatureLookup, build_answer, calibrated_probabilities
from mydecide.scoring.render import render_state
from mydecide.scoring.yes_no import family

DIMENSIONS = ("REP", "BAT", "MEA", "LOG", "CHO")
TOLERANCE = 0.05
"""jevbench's fixed tolerance (its default, and bench/coherence.py's): a law holds within this distance."""
WireAnswerer = Callable[[Any, dict[str, Any]], dict[str, Any]]
"""(state, {name: wire question}) → {name: wire answer}: a /v1/systemone request answered in-process."""


def wire_question(question: Question) -> dict[str, Any] | None:
    """The question as JevBench's wire has it, or None where JevBench has no such question (set, span, a noul with
    yes / no criteria)."""
    if question.type == "noul":
        return None if any(question.descriptions) else {"type": "noul", "instructions": question.instructions}
    if question.type in ("choice", "score"):
        out = question.to_json()
        return {"type": out["type"], "instructions": out["instructions"], "criteria": out["criteria"]}
    return None


def coherence_cases(records: Sequence[Record], n: int, seed: int) -> tuple[list[Any], dict[str, int]]:
    """Up to ``n`` JevBench cases, one per state (sampled with ``seed``, kept in file order), each with every
    question JevBench can ask about that state, keyed by task; and the questions left out, counted by why."""
    from jevbench import Case

    by_state: dict[str, tuple[Any, list[Question], list[str]]] = {}
    left_out: dict[str, int] = {}
    for r in records:
        wire = wire_question(r.question)
        if wire is None:
            why = "noul with criteria" if r.question.type == "noul" else r.question.type
            left_out[why] = left_out.get(why, 0) + 1
            continue
        _, questions, tasks = by_state.setdefault(render_state(r.state), (r.state, [], []))
        questions.append(r.question)
        tasks.append(r.task or "question")
    states = list(by_state.values())
    chosen = sorted(np.random.default_rng(seed).permutation(len(states))[:n].tolist())
    cases = []
    for i in chosen:
        state, questions, tasks = states[i]
        keyed: dict[str, Any] = {}
        for question, task in zip(questions, tasks, strict=True):
            key, copy = task, 1
            while key in keyed:
                copy += 1
                key = f"{task}_{copy}"
            keyed[key] = wire_question(question)
        cases.append(Case(id=f"state-{i + 1}", state=state, questions=keyed))
    return cases, dict(sorted(left_out.items()))


def wire_answerer(scorer: QuestionScorer, temperature: TemperatureLookup) -> WireAnswerer:
    """A wire request answered with ``scorer`` and ``temperature``, as ``mydecide serve`` answers it (the same
    question parsing, scoring plan and calibrated probabilities): what jevbench's ``from_callable`` wraps."""

    def answer(state: Any, questions: dict[str, Any]) -> dict[str, Any]:
        parsed = {name: parse_question(q, name) for name, q in questions.items()}
        logits = scorer([(state, q) for q in parsed.values()], None)
        out: dict[str, Any] = {}
        for (name, q), z in zip(parsed.items(), logits, strict=True):
            out[name] = build_answer(q, calibrated_probabilities(family(q), q.k, z, temperature))
        return out

    return answer


def not_run() -> dict[str, str]:
    """The relations jevbench scores that cannot run on the user's questions, with why."""
    from jevbench.relations import REGISTRY
    from jevbench.taxonomy import scored

    return {
        name: "needs a judged rewrite of each question (jevbench rewrite); the bank covers jevbench's suite only"
        for name in scored()
        if REGISTRY[name].needs_rewrites
    }


def jevbench_coherence(
    model: WireAnswerer | Any,
    records: Sequence[Record],
    *,
    cases: int,
    seed: int,
    name: str = "mydecide",
    bootstrap: int = 1000,
    progress: bool = True,
) -> dict[str, Any]:
    """report.json's ``coherence``: jevbench's scores of ``model`` (a :data:`WireAnswerer` or a jevbench backend,
    e.g. ``jevbench.fake("biased")``) on up to ``cases`` states of ``records``, by dimension and group, with the
    tests behind each."""
    import jevbench as jb
    from jevbench.relations import REGISTRY

    chosen, left_out = coherence_cases(records, cases, seed)
    skipped = not_run()
    relations = [r for r in jb.select_relations() if r not in skipped]
    out: dict[str, Any] = {
        "jevbench": jb.__version__,
        "suite": "custom: the evaluated records",
        "seed": seed,
        "cases": len(chosen),
        "questions": sum(len(c.questions) for c in chosen),
        "left_out": left_out,
        "not_run": skipped,
    }
    if not chosen:
        return out | {"requests": 0, "overall": None, "dimensions": {}, "groups": {}, "relations": {}}
    if progress:  # jevbench's count of distinct requests, from a dry run on its toy model
        requests = jb.estimate(cases=chosen, relations=relations)["requests"]
        print(
            f"coherence: jevbench {jb.__version__}, {len(chosen)} states ({out['questions']} questions), "
            f"{len(relations)} relations: about {requests} requests",
            file=sys.stderr,
            flush=True,
        )
    backend = jb.from_callable(model, name=name) if callable(model) else model
    report = jb.evaluate(
        backend,
        cases=chosen,
        relations=relations,
        seed=seed,
        cache=":memory:",
        tolerance=TOLERANCE,
        bootstrap=bootstrap,
        progress=progress,  # jevbench's heartbeat: requests sent, every 30 s
    )
    s = report.scores
    included = {key.split("/")[0]: row for key, row in s["checks"].items() if "excluded" not in row}
    groups = {
        g: {"score": value, "n": sum(row["n"] for rel, row in included.items() if REGISTRY[rel].group == g)}
        for g, value in s["groups"].items()
    }
    dimensions = {
        d: {"score": s["pillars"][d], "n": sum(v["n"] for g, v in groups.items() if g.split(".")[0] == d)}
        for d in DIMENSIONS
    }
    errors = report.errors
    return (
        out
        | {
            "requests": report.result["requests"],  # sent to the model (a request asked twice is answered once)
            "tolerance": s["tolerance"],
            "min_n": s["min_n"],
            "overall": s["overall"],
            "overall_ci95": s["ci"].get("overall"),
            "dimensions": dimensions,
            "groups": groups,
            "relations": {rel: {"score": row["score"], "n": row["n"]} for rel, row in included.items()},
            "too_few_tests": [key.split("/")[0] for key in s["excluded"]["low_n"]],
            "incomplete": s["incomplete"],
            "errors": len(errors),
            **({"first_error": str(errors[0].get("error"))[:400]} if errors else {}),
        }
    )


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{100 * value:.1f}"


def coherence_lines(block: dict[str, Any]) -> list[str]:
    """The terminal's coherence lines: overall, then each dimension with its groups (scores 0–100)."""
    head = (
        f"coherence (jevbench {block['jevbench']}, {block['cases']} states, {block['questions']} questions, "
        f"seed {block['seed']}): overall {_pct(block['overall'])}"
    )
    lines = [head]
    for dim, d in block["dimensions"].items():
        groups = [f"{g[len(dim) + 1 :]} {_pct(v['score'])}" for g, v in block["groups"].items() if g.startswith(dim)]
        lines.append(f"  {dim} {_pct(d['score']):>5} (n {d['n']})  " + ", ".join(groups))
    return lines


def coherence_markdown(block: dict[str, Any]) -> list[str]:
    """report.md's "Coherence (JevBench)" section: the dimension and group table with the tests behind each."""
    ci = block.get("overall_ci95")
    interval = f" [{_pct(ci[0])}–{_pct(ci[1])}]" if ci else ""
    lines = [
        "## Coherence (JevBench)",
        "",
        f"jevbench {block['jevbench']} on {block['cases']} states of these records ({block['questions']} questions, "
        f"seed {block['seed']}, {block['requests']} requests, tolerance {block.get('tolerance', '—')}). A score is "
        "the share of tests whose law holds; n counts the tests (docs/many-options.md#coherence).",
        "",
        "| dimension / group | score | n |",
        "|---|---|---|",
        f"| **overall** | **{_pct(block['overall'])}**{interval} | |",
    ]
    for dim, d in block["dimensions"].items():
        lines.append(f"| **{dim}** | **{_pct(d['score'])}** | {d['n']} |")
        lines += [
            f"| {g} | {_pct(v['score'])} | {v['n']} |" for g, v in block["groups"].items() if g.startswith(dim + ".")
        ]
    lines.append("")
    if block["left_out"]:
        lines.append(
            "Left out (no JevBench question of that kind): "
            + ", ".join(f"{k} {v}" for k, v in block["left_out"].items())
            + "."
        )
    lines.append("Not run (need a judged rewrite bank): " + ", ".join(block["not_run"]) + ".")
    if block.get("too_few_tests"):
        lines.append(f"Too few tests to score (< {block['min_n']}): " + ", ".join(block["too_few_tests"]) + ".")
    if block.get("errors"):
        lines.append(f"{block['errors']} requests failed; the first: {block['first_error']}")
    return [*lines, ""]
