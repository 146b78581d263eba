"""Span decisions fitted on dev (``mydecide calibrate``): a threshold per label, and the probability a span carries.

A span question's grid is calibrated word by word by its type's temperature, but what a user gets is spans, and two
things decide them that a temperature cannot fix:

* **Where a label's words are cut.** A rare label (e-mail addresses are 1.6% of the demo's words) can sit just under
  0.5 in every cell. Each label with at least :data:`MIN_LABEL_SPANS` gold spans on dev gets the threshold in
  :data:`THRESHOLDS` that gives it the best exact-match F1 there; every other label, and any label never seen on dev,
  gets the one threshold that is best over all labels together. Ties go to the threshold nearest 0.5.
* **Whether a word may carry two labels.** Where no gold span on dev shares a word with a gold span of another label
  (as in PII: a word is a name or a phone number, not both), and answering one label per word (the most probable of
  those past their thresholds) does not lower the dev exact-match F1, the decisions say ``exclusive``: a phone
  number then stops being read as an e-mail address as well.
* **What a span's probability means.** A span carries the mean of its words' probabilities, which is not the chance
  that the span is exactly right. With at least :data:`MIN_SPANS` predicted spans on dev, a Platt map
  sigmoid(a · logit(mean) + b) is fitted against exact-match correctness (Platt's targets, 1 / (n + 2) moved), so
  that the reported probability is that chance. Fewer: the mean is kept.

Only dev is used; the test split never is (``calibration/run.py`` refuses it).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from mydecide.metrics import span_ece
from mydecide.spans import SPAN_THRESHOLD, Span, SpanDecisions, merge_spans, words

THRESHOLDS = tuple(round(0.05 * i, 2) for i in range(1, 20))
"""The thresholds tried: 0.05, 0.10, …, 0.95."""
MIN_LABEL_SPANS = 20
"""Gold spans of a label on dev for it to get a threshold of its own."""
MIN_SPANS = 20
"""Predicted spans on dev for a fitted span probability."""

SpanItem = tuple[str, Sequence[float], Sequence[str], Sequence[Span]]
"""One dev span question: its text part, its grid of calibrated P(yes) (word × label), its labels, its gold spans."""


def _counts(items: Sequence[SpanItem], decisions: SpanDecisions) -> dict[str, list[int]]:
    """Per label, exact-match (tp, fp, fn) over ``items`` with the spans ``decisions`` cut."""
    counts: dict[str, list[int]] = {}
    for part, grid, labels, gold in items:
        found = {(s["label"], s["start"], s["end"]) for s in merge_spans(part, grid, labels, decisions)}
        wanted = {(s.label, s.start, s.end) for s in gold}
        for label in labels:
            mine, theirs = {t for t in found if t[0] == label}, {t for t in wanted if t[0] == label}
            c = counts.setdefault(label, [0, 0, 0])
            c[0] += len(mine & theirs)
            c[1] += len(mine - theirs)
            c[2] += len(theirs - mine)
    return counts


def _f1(tp: int, fp: int, fn: int) -> float:
    return 2 * tp / (2 * tp + fp + fn) if tp + fp + fn else 1.0


def _pooled_f1(counts: dict[str, list[int]]) -> float:
    """Exact-match F1 over every label's counts together."""
    return _f1(*(sum(c[i] for c in counts.values()) for i in range(3)))


def _best(scores: dict[float, float]) -> float:
    """The threshold of the highest score, the one nearest 0.5 on a tie."""
    return max(scores, key=lambda t: (round(scores[t], 12), -abs(t - SPAN_THRESHOLD)))


def _platt(means: np.ndarray, right: np.ndarray) -> tuple[float, float]:
    """(a, b) of sigmoid(a · logit(mean) + b) minimising the log loss against Platt's targets."""
    from scipy.optimize import minimize

    x = np.log(np.clip(means, 1e-6, 1 - 1e-6) / (1 - np.clip(means, 1e-6, 1 - 1e-6)))
    eps = 1.0 / (len(right) + 2.0)
    y = right * (1 - eps) + (1 - right) * eps

    def loss(ab: np.ndarray) -> float:
        z = ab[0] * x + ab[1]
        return float(np.mean(np.logaddexp(0.0, -z) * y + np.logaddexp(0.0, z) * (1 - y)))

    fit = minimize(loss, np.array([1.0, 0.0]), method="L-BFGS-B", bounds=[(0.05, 20.0), (-20.0, 20.0)])
    return float(fit.x[0]), float(fit.x[1])


def scored_spans(items: Sequence[SpanItem], decisions: SpanDecisions) -> list[tuple[float, bool]]:
    """(probability, exactly right) of every span ``decisions`` locate in ``items``."""
    out = []
    for part, grid, labels, gold in items:
        wanted = {(s.label, s.start, s.end) for s in gold}
        for s in merge_spans(part, grid, labels, decisions):
            out.append((s["probability"], (s["label"], s["start"], s["end"]) in wanted))
    return out


def fit_span_decisions(items: Sequence[SpanItem]) -> tuple[SpanDecisions, dict[str, Any]]:
    """Per-label thresholds and the span probability map fitted on ``items``, and the summary calibrate writes."""
    by_threshold = {t: _counts(items, SpanDecisions(default=t)) for t in THRESHOLDS}
    labels = sorted({label for _, _, names, _ in items for label in names})
    pooled = {t: _pooled_f1(counts) for t, counts in by_threshold.items()}
    default = _best(pooled) if labels else SPAN_THRESHOLD
    thresholds: dict[str, float] = {}
    per_label: dict[str, dict[str, Any]] = {}
    for label in labels:
        gold = by_threshold[SPAN_THRESHOLD][label][0] + by_threshold[SPAN_THRESHOLD][label][2]
        scores = {t: _f1(*counts[label]) for t, counts in by_threshold.items()}
        own = gold >= MIN_LABEL_SPANS
        if own:
            thresholds[label] = _best(scores)
        used = thresholds.get(label, default)
        per_label[label] = {
            "gold_spans": int(gold),
            "threshold": used,
            "fallback": None if own else f"fewer than {MIN_LABEL_SPANS} gold spans: the pooled threshold",
            "exact_f1_at_0.5": scores[SPAN_THRESHOLD],
            "exact_f1": scores[used],
        }
    cut = SpanDecisions(default=default, thresholds=tuple(sorted(thresholds.items())))
    exclusive, why, cut_f1 = exclusive_fit(items, cut)
    cut = dataclasses.replace(cut, exclusive=exclusive)
    before = scored_spans(items, cut)
    slope, intercept, note = 1.0, 0.0, None
    if len(before) >= MIN_SPANS:  # Platt's targets keep the fit finite when every span is right (or wrong)
        slope, intercept = _platt(np.array([p for p, _ in before]), np.array([float(r) for _, r in before]))
    else:
        note = f"{len(before)} spans located on dev, fewer than {MIN_SPANS}: the mean kept"
    decisions = dataclasses.replace(cut, slope=slope, intercept=intercept)
    after = scored_spans(items, decisions)
    (ece_before, band_before), (ece_after, band_after) = span_ece(before), span_ece(after)
    summary = {
        "questions": len(items),
        "default_threshold": default,
        "thresholds": dict(cut.thresholds),
        "labels": per_label,
        "exact_f1_at_0.5": pooled[SPAN_THRESHOLD],
        "exact_f1": cut_f1,
        "exclusive": {"used": exclusive, "why": why},
        "probability": {"slope": slope, "intercept": intercept, "spans": len(before), "note": note},
        "span_ece_before": ece_before,
        "span_ece_after": ece_after,
        "span_ece_band": band_after if band_after is not None else band_before,
    }
    return decisions, summary


def shared_words(items: Sequence[SpanItem]) -> int:
    """How many words of ``items`` lie in gold spans of two or more labels."""
    shared = 0
    for part, _, _, gold in items:
        for start, end in words(part):
            if len({s.label for s in gold if s.start < end and start < s.end}) > 1:
                shared += 1
    return shared


def exclusive_fit(items: Sequence[SpanItem], cut: SpanDecisions) -> tuple[bool, str, float]:
    """(one label per word?, why, the dev pooled exact F1 of the reading chosen): yes where dev's gold never puts a
    word in two labels' spans and the exclusive reading's pooled exact F1 on dev is at least the independent one's."""
    independent = _pooled_f1(_counts(items, cut))
    if not items:
        return False, "no span questions on dev", independent
    shared = shared_words(items)
    if shared:
        return False, f"{shared} dev words are in gold spans of two labels: labels read independently", independent
    exclusive = _pooled_f1(_counts(items, dataclasses.replace(cut, exclusive=True)))
    if exclusive < independent:
        return False, f"one label per word lowers dev exact F1 ({exclusive:.3f} against {independent:.3f})", independent
    return (
        True,
        f"no dev word is in gold spans of two labels; dev exact F1 {independent:.3f} → {exclusive:.3f}",
        exclusive,
    )


def decisions_to_json(decisions: SpanDecisions) -> dict[str, Any]:
    """The ``spans`` entry of temperatures.json that :func:`decisions_from_json` reads back."""
    return {
        "default_threshold": decisions.default,
        "thresholds": dict(decisions.thresholds),
        "slope": decisions.slope,
        "intercept": decisions.intercept,
        "exclusive": decisions.exclusive,
    }


def decisions_from_json(data: Any, where: str) -> SpanDecisions:
    """A temperatures.json ``spans`` entry, checked: thresholds in (0, 1), a positive finite slope, a finite
    intercept; a bad value is a ``ValueError`` naming its key under ``where``."""

    def number(value: Any, key: str, low: float, high: float) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ValueError(f"{where}.{key}: {value!r} is not a number")
        if not low < value < high:
            raise ValueError(f"{where}.{key}: {value!r} is outside ({low:g}, {high:g})")
        return float(value)

    if not isinstance(data, dict):
        raise ValueError(f"{where}: must be an object (default_threshold, thresholds, slope, intercept, exclusive)")
    unknown = set(data) - {"default_threshold", "thresholds", "slope", "intercept", "exclusive"}
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {sorted(unknown)}")
    labels = data.get("thresholds", {})
    if not isinstance(labels, dict):
        raise ValueError(f"{where}.thresholds: must be an object label → threshold")
    exclusive = data.get("exclusive", False)  # files written before it: labels independent
    if not isinstance(exclusive, bool):
        raise ValueError(f"{where}.exclusive: {exclusive!r} is not true or false")
    return SpanDecisions(
        number(data.get("default_threshold", SPAN_THRESHOLD), "default_threshold", 0.0, 1.0),
        tuple(sorted((str(k), number(v, f"thresholds.{k}", 0.0, 1.0)) for k, v in labels.items())),
        number(data.get("slope", 1.0), "slope", 0.0, math.inf),
        number(data.get("intercept", 0.0), "intercept", -math.inf, math.inf),
        exclusive,
    )
