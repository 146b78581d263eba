"""The scoring layer end to end: (state, question) items → render → plan → forward → logits per question.

:func:`score_questions` runs a :class:`~mydecide.scoring.plan.ScoringPlan` on a loaded model round by round;
:func:`score_records` drives any :data:`QuestionScorer` in chunks of about N prompts (questions on one state kept
together) and measures each question's share of the wall time. Evaluation, calibration, training's dev metrics
and merge's parity check all score through here; the server drives the same plans with its own batching.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from mydecide.records import Question
from mydecide.scoring.forward import packs, score_packed, score_prompts
from mydecide.scoring.plan import ScoringPlan, prompt_count
from mydecide.scoring.render import Prompt, render_state
from mydecide.scoring.span_layout import shared_layout, span_layout
from mydecide.scoring.span_reads import score_span_questions, score_with_blocks

if TYPE_CHECKING:
    from mydecide.scoring.model import LoadedModel

Orders = Sequence[Sequence[int] | None] | None
"""Per item, the order its options are shown in (None: canonical)."""
QuestionScorer = Callable[[Sequence[tuple[Any, Question]], Orders], list[np.ndarray]]
"""(state, question) items and optional option orders → logits in canonical option order (set: yes − no per
label): what :func:`model_scorer` returns, and what tests pass instead of a model."""


def question_prompts(
    model: LoadedModel, items: Sequence[tuple[Any, Question]], orders: Orders = None
) -> tuple[list[Prompt], list[int]]:
    """The first-round prompts of every (state, question), and the item index of each prompt.

    A ``set`` question, and a question scored per option, becomes one yes/no prompt per label or option (canonical
    order); a choice with more than 26 options read by letter one prompt per group of options; any other question
    one prompt.
    """
    plan = ScoringPlan(model.renderer, items, orders)
    return plan.prompts, plan.owner


def score_questions(
    model: LoadedModel,
    items: Sequence[tuple[Any, Question]],
    *,
    orders: Orders = None,
    batch_size: int = 16,
    shared_prefix: bool = True,
    progress: Callable[[int], None] | None = None,
) -> list[np.ndarray]:
    """Logits for each (state, question), in the question's canonical option order.

    ``set`` questions are scored as one yes/no question per label and return (L,) logits of yes minus no, so that
    sigmoid gives P(label applies). A question scored per option (the renderer's form) returns its (K,) yes − no
    logits, whose softmax is the answer. A choice with more than 26 options read by letter is scored in groups plus a
    final round and returns log P(o) for every option. ``orders`` optionally shows each question's options in
    another order (the per-option form sees none). ``progress`` is called with the number of prompts scored.
    A ``span`` question returns its (W·L,) yes − no word × label grid (``scoring.span_reads``; orders do not apply).
    With ``shared_prefix``, a model that :func:`~mydecide.scoring.forward.packs` is scored in packed rows (each state
    and each question's text computed once), any other through the KV cache; ``batch_size`` counts prompts there.
    """
    spans = [i for i, (_, q) in enumerate(items) if q.type == "span"]
    rest = [i for i, (_, q) in enumerate(items) if q.type != "span"]
    plan = ScoringPlan(model.renderer, [items[i] for i in rest], [orders[i] for i in rest] if orders else None)
    packed = shared_prefix and packs(model)  # each state once in a packed row, each question's text once
    out: list[np.ndarray] = [np.empty(0)] * len(items)
    unread = spans  # span questions read on their own (score_span_questions)
    if spans and packed and shared_layout(model.renderer):
        unread = []  # each span block one more question in its state's packed row
        layouts = [span_layout(model.renderer, *items[i]) for i in spans]
        blocks = [seq for layout in layouts for seq in layout.sequences]
        first, reads = score_with_blocks(model, plan.pending, blocks, progress=progress)
        if plan.pending:
            plan.read(first)
        at = 0
        for i, layout in zip(spans, layouts, strict=True):
            out[i] = layout.grid(reads[at : at + len(layout.sequences)])
            at += len(layout.sequences)
    while plan.pending:
        if packed:
            plan.read(score_packed(model, plan.pending, progress=progress))
        else:
            plan.read(
                score_prompts(
                    model, plan.pending, batch_size=batch_size, shared_prefix=shared_prefix, progress=progress
                )
            )
    for i, z in zip(rest, plan.logits(), strict=True):
        out[i] = z
    if unread:
        for i, z in zip(unread, score_span_questions(model, [items[i] for i in unread]), strict=True):
            out[i] = z
    if spans and progress:
        progress(sum(items[i][1].k for i in spans))
    return out


def model_scorer(model: LoadedModel, *, batch_size: int = 16, shared_prefix: bool = True) -> QuestionScorer:
    """The default :data:`QuestionScorer`: :func:`score_questions` on a loaded model."""

    def score(items: Sequence[tuple[Any, Question]], orders: Orders = None) -> list[np.ndarray]:
        return score_questions(model, items, orders=orders, batch_size=batch_size, shared_prefix=shared_prefix)

    return score


def prompt_counter(model: LoadedModel | None) -> Callable[[Question], int]:
    """Prompts one question costs with ``model``'s scoring form (letters without a model)."""
    if model is None:
        return prompt_count
    renderer = model.renderer
    return lambda question: prompt_count(question, renderer.form(question))


def score_records(
    scorer: QuestionScorer,
    items: Sequence[tuple[Any, Question]],
    orders: Orders = None,
    *,
    chunk_prompts: int = 64,
    desc: str = "scoring",
    progress: bool = True,
    prompts_of: Callable[[Question], int] | None = None,
) -> tuple[list[np.ndarray], list[float]]:
    """Logits and per-question latency (seconds) for each (state, question).

    Questions are scored in chunks of about ``chunk_prompts`` prompts, questions on one state kept together so
    the state is computed once. A question's latency is its share of its chunk's wall time (set questions
    count one prompt per label, per-option questions one per option: ``prompts_of``): the amortised cost of a
    question in a batched server.
    """
    from tqdm import tqdm

    prompts_of = prompts_of or prompt_counter(None)
    keys = [render_state(state) for state, _ in items]
    index = sorted(range(len(items)), key=lambda i: (len(keys[i]), keys[i]))  # similar lengths, same state adjacent
    logits: list[np.ndarray] = [np.empty(0)] * len(items)
    latency = [0.0] * len(items)
    bar = tqdm(total=len(items), desc=desc, unit="q", file=sys.stderr, disable=not progress, leave=False)
    start = 0
    while start < len(index):
        stop, prompts = start, 0
        while stop < len(index) and (
            prompts < chunk_prompts or (stop > start and keys[index[stop]] == keys[index[stop - 1]])
        ):
            prompts += prompts_of(items[index[stop]][1])
            stop += 1
        chunk = index[start:stop]
        started = time.perf_counter()
        out = scorer([items[i] for i in chunk], [orders[i] for i in chunk] if orders is not None else None)
        elapsed = time.perf_counter() - started
        for i, z in zip(chunk, out, strict=True):
            logits[i] = np.asarray(z, dtype=float)
            latency[i] = elapsed * prompts_of(items[i][1]) / prompts
        bar.update(len(chunk))
        start = stop
    bar.close()
    return logits, latency
