"""Jev ``/v1/systemone`` responses (docs/wire.md): a request scored and answered, shared by ``predict`` and ``serve``.

``answer_request`` scores every question of one request (sharing the state's computation) and builds the response.
The server runs its two halves, ``render_request`` (which also checks the token limits) and ``build_response``,
around the forward passes over the prompts of many concurrent requests: ``predict`` and ``serve`` run the same code.
A choice with more than 26 options takes two rounds of prompts (``many_options``): each request's
:class:`~mydecide.scoring.plan.ScoringPlan` says what to score next, and ``score_plans`` runs the rounds. Span
questions are read apart (``score_spans``) and answered with their merged spans (``span_answer``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from mydecide.calibration.conformal_table import ConformalTable, act, answer_set, wire_set
from mydecide.config import Limits
from mydecide.records import Question
from mydecide.scoring.forward import score_prompts
from mydecide.scoring.plan import ScoringPlan, score_plans
from mydecide.scoring.probabilities import (
    TemperatureLookup,
    build_answer,
    calibrated_probabilities,
    to_probabilities,
)
from mydecide.scoring.span_layout import SpanLayout, span_layout
from mydecide.scoring.span_reads import read_sequences
from mydecide.scoring.yes_no import family
from mydecide.serving.request import Request, RequestError, check_span_floor, check_span_limits
from mydecide.spans import SpanDecisions, merge_spans, state_part

if TYPE_CHECKING:
    import numpy as np

    from mydecide.scoring.model import LoadedModel
    from mydecide.scoring.render import Prompt


@dataclass(frozen=True)
class RenderedRequest:
    """A request's scoring plan over its questions but span ones (``names``, in request order); ``prompts`` are its
    first-round prompts, ``owner[i]`` indexes prompt i's question in ``names``. Span questions have their sequences
    in ``spans`` (name → layout) and, once read (:func:`score_spans`), their grids in ``span_grids``."""

    request: Request
    plan: ScoringPlan
    shared_prefix: bool = True
    names: tuple[str, ...] = ()
    spans: dict[str, SpanLayout] = field(default_factory=dict)
    span_grids: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def prompts(self) -> list[Prompt]:
        return self.plan.prompts

    @property
    def owner(self) -> list[int]:
        return self.plan.owner

    @property
    def input_tokens(self) -> int:
        """Tokens processed: per round, with a shared prefix the state prefix once plus every question's suffix,
        else every prompt in full, and every span sequence. (Two requests about the same state batched together count
        once each.)"""
        return self.plan.tokens(self.shared_prefix) + sum(len(s.ids) for v in self.spans.values() for s in v.sequences)


def set_and_act(
    question: Question, probs: np.ndarray, conformal: ConformalTable, part: str, decisions: SpanDecisions | None
) -> dict[str, Any]:
    """The optional ``set`` and ``act`` of an answer, where temperatures.json carries a rule for its type
    (docs/wire.md#sets-and-auto-act): a span question's set is its spans at the word thresholds that bound the rate
    of missed gold spans (labels read independently)."""
    out: dict[str, Any] = {}
    if question.type == "span":
        if conformal.span is not None:
            rule = conformal.span
            cut = [(label, rule.threshold(label)) for label in question.options]
            bounded = dataclasses.replace(
                decisions or SpanDecisions(),
                default=rule.default if rule.default is not None else SpanDecisions().default,
                thresholds=tuple(sorted((label, t) for label, t in cut if t is not None)),
                exclusive=False,
            )
            out["set"] = merge_spans(part, [float(p) for p in probs], question.options, bounded)
        return out
    if question.type in conformal.sets:
        mask = answer_set(question.type, probs, conformal.sets[question.type])
        out["set"] = wire_set(question.type, question.options, mask)
    if question.type in conformal.acts:
        out["act"] = act(question.type, probs, conformal.acts[question.type])
    return out


def render_request(
    model: LoadedModel, request: Request, *, shared_prefix: bool = True, limits: Limits | None = None
) -> RenderedRequest:
    """Tokenise every question of a request (the first round of its scoring plan).

    With ``limits``, raises :class:`RequestError` when one prompt holds more than ``max_prompt_tokens`` tokens, or
    all of them more than ``max_input_tokens`` (the state prefix once plus every prompt's suffix, whatever
    ``shared_prefix``), naming the question; span questions that cannot fit are refused before their text is
    tokenised (:func:`check_span_floor`).
    """
    if limits is not None:
        check_span_floor(request, model.renderer.config.span, limits)
    names = [name for name, q in request.questions.items() if q.type != "span"]
    items = [(request.state, request.questions[name]) for name in names]
    spans = {
        name: span_layout(model.renderer, request.state, q) for name, q in request.questions.items() if q.type == "span"
    }
    rendered = RenderedRequest(request, ScoringPlan(model.renderer, items), shared_prefix, tuple(names), spans)
    if limits is not None:
        check_span_limits({name: [len(s.ids) for s in layout.sequences] for name, layout in spans.items()}, limits)
    if limits is not None and items:
        longest = max(range(len(rendered.prompts)), key=lambda i: len(rendered.prompts[i]))
        if len(rendered.prompts[longest]) > limits.max_prompt_tokens:
            raise RequestError(
                f"question {names[rendered.owner[longest]]!r}: a prompt of "
                f"{len(rendered.prompts[longest])} tokens is over the limit of "
                f"{limits.max_prompt_tokens} tokens in one prompt (the state, cut to "
                f"{len(rendered.prompts[longest].prefix)}, plus the question)"
            )
        max_input_tokens = limits.max_input_tokens
        tokens = rendered.plan.tokens(shared_prefix=True)
        if tokens > max_input_tokens:
            per_question = [0] * len(items)
            for n, prompt in zip(rendered.owner, rendered.prompts, strict=True):
                per_question[n] += len(prompt.suffix)
            largest = max(range(len(names)), key=per_question.__getitem__)
            raise RequestError(
                f"the request's prompts hold {tokens} tokens, over the limit of {max_input_tokens} "
                f"input tokens (question {names[largest]!r} holds the most: "
                f"{per_question[largest]}, the state {len(rendered.prompts[0].prefix)})"
            )
    return rendered


def build_response(
    rendered: RenderedRequest, temperature: TemperatureLookup | None = None, model_name: str = ""
) -> dict[str, Any]:
    """The Jev response of one request whose plan has been scored (``score_plans``)."""
    request = rendered.request
    logits = dict(zip(rendered.names, rendered.plan.logits(), strict=True))
    answers = {}
    conformal = getattr(temperature, "conformal", None)
    decisions = getattr(temperature, "span_decisions", None)
    for name, question in request.questions.items():
        kind = family(question)  # the type whose temperature it takes (a yes / no choice: noul)
        t = temperature(kind, question.k) if temperature else 1.0
        if question.type == "span":
            probs = to_probabilities("span", rendered.span_grids[name], t)
            answers[name] = span_answer(state_part(request.state, question.over), question, probs, decisions)
        else:
            probs = calibrated_probabilities(kind, question.k, logits[name], temperature)
            answers[name] = build_answer(question, probs)
        if conformal is not None:
            part = state_part(request.state, question.over) if question.type == "span" else ""
            answers[name] |= set_and_act(question, probs, conformal, part, decisions)
    return {
        "model": request.model or model_name,
        "answers": answers,
        "usage": {"input_tokens": rendered.input_tokens, "output_tokens": 0},
    }


def answer_request(
    model: LoadedModel,
    request: Request,
    temperature: TemperatureLookup | None = None,
    *,
    shared_prefix: bool = True,
    model_name: str | None = None,
    batch_size: int = 16,
) -> dict[str, Any]:
    """Score every question of one request (one shared state prefix) and build the Jev response."""
    rendered = render_request(model, request, shared_prefix=shared_prefix)
    score_plans(
        [rendered.plan],
        lambda prompts: score_prompts(model, prompts, batch_size=batch_size, shared_prefix=shared_prefix),
    )
    score_spans(model, rendered)
    return build_response(rendered, temperature, model_name or model.name)


def score_spans(model: LoadedModel, requests: RenderedRequest | list[RenderedRequest]) -> None:
    """Read the sequences of the span questions of one or many requests (in one call, batched by length) into each
    request's ``span_grids``; a request already read is left as it is."""
    pending = [r for r in (requests if isinstance(requests, list) else [requests]) if r.spans and not r.span_grids]
    layouts = [(r, name, layout) for r in pending for name, layout in r.spans.items()]
    sequences = [s for _, _, layout in layouts for s in layout.sequences]
    reads = read_sequences(model, sequences) if sequences else []
    at = 0
    for rendered, name, layout in layouts:
        rendered.span_grids[name] = layout.grid(reads[at : at + len(layout.sequences)])
        at += len(layout.sequences)


def span_answer(
    part: str, question: Question, probs: np.ndarray, decisions: SpanDecisions | None = None
) -> dict[str, Any]:
    """A span question's answer: P(there is any span) (the grid's highest word probability) and the merged spans,
    cut and given probabilities by ``decisions`` (fitted on dev with the temperatures) when there are some."""
    return {
        "type": "span",
        "noul": float(probs.max()) if len(probs) else 0.0,
        "spans": merge_spans(part, [float(p) for p in probs], question.options, decisions),
    }
