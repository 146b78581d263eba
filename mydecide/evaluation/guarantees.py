"""What the conformal section of temperatures.json promised, checked on the evaluated questions (report.json's
``guarantees``, report.md's "Guarantees"; docs/guarantees.md says what is and is not guaranteed).

Per question type and per task: the empirical coverage of the sets with its exact binomial (Clopper-Pearson) 95%
interval, the mean and distribution of set size, coverage by set size and by slice; the realized error rate and
answered fraction of risk-controlled auto-act beside the payoff threshold's; per span label, the rate of missed gold
spans beside its bound. Tasks dev did not hold (held-out tasks) are reported apart, outside the guarantee: their
questions are not exchangeable with the dev questions the thresholds were fitted on.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from mydecide.calibration.conformal import clopper_pearson
from mydecide.calibration.conformal_table import ActRule, ConformalTable, SetRule, answer_set, confidence
from mydecide.evaluation.rows import SLICES, MetricRow

SpanItem = tuple[str, dict[str, np.ndarray]]
"""A span question: its task and, per label with gold spans, the highest word probability inside each of them."""


def _coverage(covered: Sequence[bool]) -> dict[str, Any]:
    n, hits = len(covered), int(sum(covered))
    return {"n": n, "coverage": hits / n if n else None, "ci95": list(clopper_pearson(hits, n)) if n else None}


def set_block(rows: Sequence[MetricRow], rule: SetRule, *, slices: bool = True) -> dict[str, Any]:
    """Coverage, its interval, set sizes and coverage by size (and by slice) of ``rows`` under ``rule``."""
    sizes, covered = [], []
    for r in rows:
        mask = answer_set("noul" if r.qtype == "set" else r.qtype, r.probs, rule)  # a set label row is (p, 1 − p)
        sizes.append(int(mask.sum()))
        covered.append(bool(mask[int(np.argmax(r.target))]))
    out = {"alpha": rule.alpha, "score": rule.score, "dev_n": rule.n, **_coverage(covered)}
    out["mean_size"] = float(np.mean(sizes)) if sizes else None
    by_size: dict[int, list[bool]] = {}
    for size, hit in zip(sizes, covered, strict=True):
        by_size.setdefault(size, []).append(hit)
    out["size_distribution"] = {str(s): len(v) for s, v in sorted(by_size.items())}
    out["coverage_by_size"] = {str(s): sum(v) / len(v) for s, v in sorted(by_size.items())}
    if slices:
        out["by_slice"] = {
            name: {
                value: _coverage([c for r, c in zip(rows, covered, strict=True) if key(r) == value])["coverage"]
                for value in sorted({key(r) for r in rows})
            }
            for name, key in SLICES.items()
        }
    return out


def _questions(rows: Sequence[MetricRow]) -> list[tuple[str, str, np.ndarray, bool]]:
    """(type, task, answer probabilities, wrong) per question; a set question's label rows joined (wrong: any)."""
    grouped: dict[int, list[MetricRow]] = {}
    for r in rows:
        grouped.setdefault(r.question, []).append(r)
    out = []
    for group in grouped.values():
        r = group[0]
        if r.qtype == "set":
            p = np.array([g.probs[0] for g in group])
            wrong = any((g.probs[0] >= 0.5) != (g.target[0] >= 0.5) for g in group)
        else:
            p, wrong = r.probs, int(np.argmax(r.probs)) != int(np.argmax(r.target))
        out.append((r.qtype, r.task, p, bool(wrong)))
    return out


def act_block(questions: Sequence[tuple[str, str, np.ndarray, bool]], rule: ActRule, payoff: float) -> dict[str, Any]:
    """Answered fraction and realized error rate at the risk-controlled threshold and at the payoff threshold."""

    def at(threshold: float | None, strict: bool) -> dict[str, Any]:
        conf = np.array([confidence(t, p) for t, _, p, _ in questions])
        wrong = np.array([w for *_, w in questions], dtype=bool)
        acted = np.zeros(len(conf), bool) if threshold is None else (conf > threshold if strict else conf >= threshold)
        n, errors = int(acted.sum()), int(wrong[acted].sum())
        return {
            "threshold": threshold,
            "answered": n / len(conf) if len(conf) else None,
            "risk": errors / n if n else None,
            "risk_ci95": list(clopper_pearson(errors, n)) if n else None,
        }

    controlled = at(rule.threshold, strict=False)
    return {"max_risk": rule.max_risk, "delta": rule.delta, "dev_n": rule.n, "n": len(questions), **controlled} | {
        "payoff": at(payoff, strict=True)
    }


def span_block(items: Sequence[SpanItem], table: ConformalTable) -> dict[str, Any]:
    """Per label (and pooled): questions with gold spans of it, the mean fraction of those spans that no word reaches
    at the label's threshold, and the bound α."""
    assert table.span is not None
    per_label: dict[str, list[float]] = {}
    for _, best in items:
        for label, values in best.items():
            t = table.span.threshold(label)
            if t is not None:
                per_label.setdefault(label, []).append(float(np.mean(values < t)))
    pooled = [v for values in per_label.values() for v in values]
    return {
        "alpha": table.span.alpha,
        "n": len(pooled),
        "miss_rate": float(np.mean(pooled)) if pooled else None,
        "by_label": {
            label: {
                "n": len(v),
                "threshold": table.span.threshold(label),
                "own_threshold": label in dict(table.span.thresholds),
                "miss_rate": float(np.mean(v)),
            }
            for label, v in sorted(per_label.items())
        },
    }


def guarantee_report(
    rows: Sequence[MetricRow], table: ConformalTable, span_items: Sequence[SpanItem], payoff: float
) -> dict[str, Any]:
    """report.json's ``guarantees``: per type (questions of dev's tasks only) and per task (its own rule where
    calibrate fitted one), held-out tasks marked ``outside_guarantee``."""
    seen = set(table.dev_tasks)
    inside = [r for r in rows if r.qtype != "span" and (not seen or r.task in seen)]
    out: dict[str, Any] = {"dev_tasks": sorted(seen), "types": {}, "tasks": {}}
    questions = _questions([r for r in rows if r.qtype != "span"])
    for qtype in ("choice", "noul", "score", "set"):
        mine = [r for r in inside if r.qtype == qtype]
        if not mine:
            continue
        block: dict[str, Any] = {}
        if qtype in table.sets:
            block["sets"] = set_block(mine, table.sets[qtype])
        if qtype in table.acts:
            asked = [q for q in questions if q[0] == qtype and (not seen or q[1] in seen)]
            block["auto_act"] = act_block(asked, table.acts[qtype], payoff)
        out["types"][qtype] = block
    for task in sorted({r.task for r in rows if r.qtype != "span"}):
        mine = [r for r in rows if r.task == task and r.qtype != "span"]
        qtype = mine[0].qtype
        entry: dict[str, Any] = {"type": qtype, "outside_guarantee": bool(seen) and task not in seen}
        if any(r.qtype != qtype for r in mine):  # a task of several types: its types' blocks hold its questions
            out["tasks"][task] = entry | {"type": "mixed"}
            continue
        rule = table.task_sets.get(task) or table.sets.get(qtype)
        if rule is not None:
            entry["rule"] = "task" if task in table.task_sets else "type"
            entry["sets"] = set_block(mine, rule, slices=False)
        act = table.task_acts.get(task) or table.acts.get(qtype)
        if act is not None:
            entry["auto_act"] = act_block([q for q in questions if q[1] == task], act, payoff)
        out["tasks"][task] = entry
    if table.span is not None and span_items:
        out["span"] = span_block([s for s in span_items if not seen or s[0] in seen], table)
    return out


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    def cell(v: Any) -> str:
        return "—" if v is None else f"{v:.3f}" if isinstance(v, float) else str(v)

    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return [*lines, *("| " + " | ".join(cell(v) for v in row) + " |" for row in rows), ""]


def guarantees_markdown(report: dict[str, Any]) -> list[str]:
    """report.md's "Guarantees" section (nothing when temperatures.json carried no conformal section)."""
    g = report.get("guarantees")
    if not g:
        return []
    lines = ["## Guarantees", "", "Sets and auto-act fitted on dev by calibrate (docs/guarantees.md).", ""]
    sets = [
        (name, b["sets"], b.get("outside_guarantee"))
        for name, b in [*g["types"].items(), *g["tasks"].items()]
        if "sets" in b
    ]
    if sets:
        lines += _table(
            ["", "n", "1 − α", "coverage (95%)", "mean size", "sizes", "coverage by size"],
            [
                [
                    name + (" (held out: outside the guarantee)" if outside else ""),
                    s["n"],
                    1 - s["alpha"],
                    f"{s['coverage']:.3f} ({s['ci95'][0]:.3f}–{s['ci95'][1]:.3f})",
                    s["mean_size"],
                    ", ".join(f"{k}: {v}" for k, v in s["size_distribution"].items()),
                    ", ".join(f"{k}: {v:.2f}" for k, v in s["coverage_by_size"].items()),
                ]
                for name, s, outside in sets
            ],
        )
    acts = [
        (name, b["auto_act"], b.get("outside_guarantee"))
        for name, b in [*g["types"].items(), *g["tasks"].items()]
        if "auto_act" in b
    ]
    if acts:
        lines += _table(
            ["", "n", "ε / δ", "threshold", "answered", "error rate (95%)", "payoff: p >", "answered", "error rate"],
            [
                [
                    name + (" (held out)" if outside else ""),
                    a["n"],
                    f"{a['max_risk']:g} / {a['delta']:g}",
                    a["threshold"],
                    a["answered"],
                    "—" if a["risk"] is None else f"{a['risk']:.3f} ({a['risk_ci95'][0]:.3f}–{a['risk_ci95'][1]:.3f})",
                    a["payoff"]["threshold"],
                    a["payoff"]["answered"],
                    a["payoff"]["risk"],
                ]
                for name, a, outside in acts
            ],
        )
    span = g.get("span")
    if span:
        lines += _table(
            ["span label", "questions", "threshold", "missed gold spans", "bound α"],
            [[label, e["n"], e["threshold"], e["miss_rate"], span["alpha"]] for label, e in span["by_label"].items()]
            + [["all", span["n"], "", span["miss_rate"], span["alpha"]]],
        )
    return lines
