"""Report rendering: report.md (readable tables of report.json) and reliability.png, and writing every output.

Every file is written atomically (``mydecide.io``) into a staged directory that replaces ``--out`` whole, so a crash
never leaves half a report; ``--out`` is checked before any work (:func:`check_report_dir`).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mydecide import metrics
from mydecide.errors import UserError
from mydecide.evaluation.classes import CONFUSION_PLOT, classes_markdown, plot_confusions
from mydecide.evaluation.coherence import coherence_markdown
from mydecide.evaluation.curves import CURVES_PLOT, curves_markdown, plot_curves
from mydecide.evaluation.guarantees import guarantees_markdown
from mydecide.io import (
    atomic_write_figure,
    atomic_write_json,
    atomic_write_text,
    foreign_entries,
    holds,
    staged_directory,
)
from mydecide.jsonl import write_jsonl
from mydecide.records import QUESTION_TYPES

if TYPE_CHECKING:
    from mydecide.evaluation.rows import Evaluation, MetricRow


def _fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return f"{value:.{digits}f}" if math.isfinite(value) else str(value)
    return str(value).replace("|", "\\|")  # a bare | would end the table cell


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(_fmt(v) for v in row) + " |" for row in rows]
    return [*lines, ""]


FULL_COLUMNS = (
    ("n", "n"),
    ("questions", "questions"),
    ("accuracy", "accuracy"),
    ("chance_corrected", "chance-corr."),
    ("log_loss", "log loss"),
    ("brier", "Brier"),
    ("ece", "ECE"),
    ("ece_band", "ECE if calibrated (p90)"),
    ("rps", "RPS"),
    ("aurc", "AURC"),
    ("flip_rate", "flip rate"),
    ("latency_p50_ms", "p50 ms"),
    ("latency_p95_ms", "p95 ms"),
)

SHORT_COLUMNS = (
    ("n", "n"),
    ("accuracy", "accuracy"),
    ("chance_corrected", "chance-corr."),
    ("log_loss", "log loss"),
    ("ece", "ECE"),
    ("ece_band", "ECE if calibrated (p90)"),
    ("flip_rate", "flip rate"),
)


def _rows_for(blocks: dict[str, dict[str, Any]], columns: Sequence[tuple[str, str]]) -> list[list[Any]]:
    return [[name, *(b.get(key) for key, _ in columns)] for name, b in blocks.items() if b.get("n")]


def render_markdown(report: dict[str, Any]) -> str:
    """report.md: readable tables of report.json (overall, baselines, per task, slices, thresholds, coherence)."""
    model = report["model"] + (f" + {report['adapter']}" if report.get("adapter") else "")
    lines = [f"# Evaluation: {model}", ""]
    data = report.get("data") or []
    lines += [
        f"- data: {', '.join(data) if data else '(in process)'} — {report['records']} questions",
        f"- temperatures: {report.get('temperatures') or 'none (T = 1)'}",
        f"- option orders per question: reversed + {report['settings']['permutations']} random "
        f"(seed {report['settings']['seed']})",
        "",
    ]

    lines += ["## Overall", ""]
    overall = {name: report[name] for name in ("all", *QUESTION_TYPES)}
    lines += _table(["", *(label for _, label in FULL_COLUMNS)], _rows_for(overall, FULL_COLUMNS))
    extra = [
        (t, report[t])
        for t in QUESTION_TYPES
        if report[t].get("n") and (report[t].get("n_soft") or report[t].get("exact_set_accuracy") is not None)
    ]
    if extra:
        lines += _table(
            ["", "soft accuracy", "total variation", "exact-set accuracy", "micro F1", "macro F1", "label log loss"],
            [
                [
                    t,
                    b.get("soft_accuracy"),
                    b.get("total_variation"),
                    b.get("exact_set_accuracy"),
                    b.get("micro_f1"),
                    b.get("macro_f1"),
                    b.get("label_log_loss"),
                ]
                for t, b in extra
            ],
        )

    lines += span_markdown(report)
    lines += ordinal_markdown(report)
    lines += ["## Baselines", ""]
    side: dict[str, dict[str, Any]] = {"model" + (" (calibrated)" if report.get("uncalibrated") else ""): report["all"]}
    if report.get("uncalibrated"):
        side["model, T = 1"] = report["uncalibrated"]["all"]
    baselines = report.get("baselines", {})
    if "base_model" in baselines:
        side["base model (no adapter)"] = baselines["base_model"]["all"]
    if "majority" in baselines:
        side[f"majority ({baselines['majority']['source']})"] = baselines["majority"]["all"]
    lines += _table(["", *(label for _, label in SHORT_COLUMNS)], _rows_for(side, SHORT_COLUMNS))
    if baselines.get("majority", {}).get("in_sample_tasks") and baselines["majority"]["source"] != "in-sample majority":
        lines += [
            f"In-sample majority for tasks absent from the training split: "
            f"{', '.join(baselines['majority']['in_sample_tasks'])}.",
            "",
        ]

    lines += ["## Per task", ""]
    header = ["task", "type", *(label for _, label in SHORT_COLUMNS), "RPS", "majority acc."]
    has_base = "base_model" in baselines
    if has_base:
        header.append("base acc.")
    task_rows = []
    for task, b in report["by_task"].items():
        row = [
            task,
            "/".join(b.get("types") or ["—"]),
            *(b.get(key) for key, _ in SHORT_COLUMNS),
            b.get("rps"),
            baselines.get("majority", {}).get("by_task", {}).get(task, {}).get("accuracy"),
        ]
        if has_base:
            row.append(baselines["base_model"]["by_task"].get(task, {}).get("accuracy"))
        task_rows.append(row)
    lines += _table(header, task_rows)

    lines += ["## Slices", ""]
    for name, groups in report.get("slices", {}).items():
        lines += [f"### {name.replace('_', ' ')}", ""]
        lines += _table([name, *(label for _, label in SHORT_COLUMNS)], _rows_for(groups, SHORT_COLUMNS))

    th = report["thresholds"]
    costs = th["costs"]
    lines += [
        "## Thresholds",
        "",
        f"Payoffs right = {costs['right']:g}, wrong = {costs['wrong']:g}, escalate = {costs['escalate']:g}: "
        f"auto-act when p > {th['auto_act_threshold']:.3f}, escalate otherwise.",
        "",
    ]
    lines += _table(
        ["threshold", "coverage", "accuracy", "payoff / question", "auto-act"],
        [
            [e["threshold"], e["coverage"], e["accuracy"], e["payoff"], "◀" if e["auto_act"] else ""]
            for e in th["table"]
        ],
    )

    lines += guarantees_markdown(report)
    if report.get("coherence"):
        lines += coherence_markdown(report["coherence"])

    if report.get("temperatures_used"):
        lines += ["## Temperatures", ""]
        lines += _table(
            ["type", "K", "T"], [[t, k, v] for t, ks in report["temperatures_used"].items() for k, v in ks.items()]
        )
        if report.get("level_maps_used"):
            ks = ", ".join(str(k) for k in report["level_maps_used"])
            lines += [
                f"Score questions of K = {ks} also went through the level map calibrate fitted for their K, after "
                "the temperature (docs/calibration.md, level maps).",
                "",
            ]
    lines += classes_markdown(report)
    lines += curves_markdown(report)
    lines += ["## Reliability", "", "![reliability diagram](reliability.png)", ""]
    return "\n".join(lines)


def plotted(rows: Sequence[MetricRow]) -> list[MetricRow]:
    """The rows the reliability diagram shows: those the report's "all" block counts. A span question's word × label
    cells (hundreds per question, nearly all confidently "no") are left out beside other questions, as there; they
    have their own span rows in report.md."""
    questions = [r for r in rows if r.qtype != "span"]
    return questions or list(rows)


def plot_reliability(
    rows: Sequence[MetricRow], path: str | Path, raw_rows: Sequence[MetricRow] | None = None, bins: int = 10
) -> None:
    """reliability.png: accuracy vs confidence per bin (before and after temperatures when both are known)
    beside the histogram of top probabilities, over the rows :func:`plotted` keeps. Written atomically."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = plotted(rows)
    spans_left_out = len(shown) < len(rows)
    curves = [("after temperatures" if raw_rows is not None else "model", shown)]
    if raw_rows is not None:
        curves.insert(0, ("before (T = 1)", plotted(raw_rows)))
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4.2))
    left.plot([0, 1], [0, 1], linestyle="--", color="grey", linewidth=1, label="perfect calibration")
    width = 1.0 / bins
    for n, (label, group) in enumerate(curves):
        rb = metrics.reliability_bins([r.probs for r in group], [r.target for r in group], bins)
        filled = rb.counts > 0
        ece = metrics.ece([r.probs for r in group], [r.target for r in group], bins)
        left.plot(rb.confidence[filled], rb.accuracy[filled], marker="o", label=f"{label} (ECE {ece:.3f})")
        offset = (n - (len(curves) - 1) / 2) * width / len(curves)
        right.bar(rb.edges[:-1] + width / 2 + offset, rb.counts, width=width / len(curves), label=label, alpha=0.8)
    title = "Reliability diagram" + (" (span cells left out)" if spans_left_out else "")
    left.set(xlim=(0, 1), ylim=(0, 1), xlabel="confidence (top probability)", ylabel="accuracy", title=title)
    left.legend(loc="upper left", fontsize=8)
    right.set(
        xlim=(0, 1), xlabel="confidence (top probability)", ylabel="questions (rows)", title="Confidence histogram"
    )
    right.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    atomic_write_figure(path, fig)


REPORT_FORMAT = "mydecide.report/1"  # report.json's "format": how evaluate knows a directory it may replace
OUTPUT_FILES = (
    "predictions.jsonl",
    "base_predictions.jsonl",
    "report.json",
    "report.md",
    "reliability.png",
    CONFUSION_PLOT,
    CURVES_PLOT,
)
RECIPE_FILE = "recipe.yaml"


def check_report_dir(out: str | Path, inputs: Sequence[tuple[str, str | None]]) -> None:
    """Refuse, before any work, an ``--out`` that evaluate would replace but did not write (ValueError, one line):

    * the working directory or a directory above it;
    * one that holds any of ``inputs`` (``(option, path)`` pairs: the data files, the adapter, the temperatures);
    * one that holds files but no report.json of an earlier evaluate (a prepare output, an adapter, your files);
    * one that holds a file evaluate does not write (checked again when the outputs are swapped in)."""
    if holds(out, Path.cwd()):
        raise UserError(f"--out {out}: is the working directory or above it, which evaluate replaces; choose --out")
    for option, path in inputs:
        if path is not None and holds(out, path):
            raise UserError(f"--out {out}: holds {option} {path}, and evaluate replaces it whole; choose --out")
    target = Path(os.path.realpath(out))
    if not target.exists():
        return
    if not target.is_dir():
        raise NotADirectoryError(f"--out {out}: exists and is not a directory; choose another --out")
    present = foreign_entries(target)
    if not present:
        return
    if not _written_by_evaluate(target / "report.json"):
        raise UserError(
            f"--out {out}: holds {', '.join(present[:5])} but no report.json of an earlier evaluate: these are not "
            "its outputs to replace; choose an empty or new output directory"
        )
    foreign = foreign_entries(target, (*OUTPUT_FILES, RECIPE_FILE))
    if foreign:
        raise UserError(
            f"--out {out}: holds {', '.join(foreign[:5])}, which evaluate did not write; choose an empty or new "
            "output directory"
        )


def _written_by_evaluate(path: Path) -> bool:
    """report.json carries this version's evaluate format (one without it, or with another, is not replaced)."""
    try:
        report = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return False
    return isinstance(report, dict) and report.get("format") == REPORT_FORMAT


def write_outputs(evaluation: Evaluation, out_dir: str | Path, recipe_text: str | None = None) -> dict[str, Path]:
    """predictions.jsonl (and base_predictions.jsonl), report.json, report.md, reliability.png and the resolved
    recipe.yaml, written into a new directory beside ``out_dir`` that then replaces it whole: a re-run that stops
    half-way leaves the previous report or the new one, never a mix of two."""
    out = Path(out_dir)
    names = {
        "predictions": "predictions.jsonl",
        "report": "report.json",
        "markdown": "report.md",
        "plot": "reliability.png",
    }
    if evaluation.base_predictions is not None:
        names["base_predictions"] = "base_predictions.jsonl"
    if evaluation.report.get("classes"):
        names["confusion"] = CONFUSION_PLOT
    if evaluation.report.get("training"):
        names["curves"] = CURVES_PLOT
    with staged_directory(out, (*OUTPUT_FILES, RECIPE_FILE)) as staging:
        write_jsonl(staging / names["predictions"], evaluation.predictions)
        if evaluation.base_predictions is not None:
            write_jsonl(staging / names["base_predictions"], evaluation.base_predictions)
        atomic_write_json(staging / names["report"], {"format": REPORT_FORMAT, **evaluation.report})
        atomic_write_text(staging / names["markdown"], render_markdown(evaluation.report))
        plot_reliability(evaluation.rows, staging / names["plot"], evaluation.raw_rows)
        if "confusion" in names:
            plot_confusions(evaluation.report["classes"], staging / names["confusion"])
        if "curves" in names:
            plot_curves(evaluation.report["training"], staging / names["curves"])
        if recipe_text is not None:
            atomic_write_text(staging / RECIPE_FILE, recipe_text)
    return {key: out / name for key, name in names.items()}


ORDINAL_COLUMNS = (
    ("n", "n"),
    ("rps", "RPS"),
    ("rps_skill", "RPS skill"),
    ("mae", "MAE (levels)"),
    ("spearman", "Spearman ρ"),
    ("within_one", "within one"),
    ("threshold_ece", "threshold ECE"),
    ("threshold_ece_band", "if calibrated (p90)"),
    ("unimodal_share", "unimodal"),
)


def ordinal_markdown(report: dict[str, Any]) -> list[str]:
    """report.md's "Score questions" section: the ordinal metrics of the model beside T = 1, the base model and the
    majority prior, then per task (nothing when the report has no score questions)."""
    if not report.get("score", {}).get("ordinal"):
        return []
    baselines = report.get("baselines", {})
    sides = {"model" + (" (calibrated)" if report.get("uncalibrated") else ""): report["score"]}
    if report.get("uncalibrated"):
        sides["model, T = 1"] = report["uncalibrated"]["score"]
    if "base_model" in baselines:
        sides["base model (no adapter)"] = baselines["base_model"]["score"]
    if "majority" in baselines:
        sides[f"majority ({baselines['majority']['source']})"] = baselines["majority"]["score"]
    sides |= {f"task {task}": b for task, b in report["by_task"].items() if b.get("ordinal")}
    header = ["", "accuracy", *(label for _, label in ORDINAL_COLUMNS)]
    rows = [
        [name, b.get("accuracy"), *(b["ordinal"].get(key) for key, _ in ORDINAL_COLUMNS)]
        for name, b in sides.items()
        if b.get("ordinal")
    ]
    lines = ["## Score questions", ""]
    lines += [
        "Levels lowest first, counted 0 … K−1. RPS skill is against each K's level frequencies in these questions; "
        "threshold ECE is the ECE of every P(level ≥ k), averaged over k.",
        "",
    ]
    return lines + _table(header, rows)


def span_markdown(report: dict[str, Any]) -> list[str]:
    """report.md's "Spans" section: span-level F1 of the model and the base model, word-level log loss / ECE, and
    a row per label (nothing when the report has no span questions)."""
    block = report.get("span") or {}
    if not block.get("spans"):
        return []

    def fmt(value: Any) -> str:
        return "—" if value is None else f"{value:.3f}"

    sides = {"model": block}
    base = report.get("baselines", {}).get("base_model", {}).get("span")
    if base and base.get("spans"):
        sides["base model (no adapter)"] = base
    header = (
        "| | exact P | exact R | exact F1 | overlap P | overlap R | overlap F1 | word log loss | word ECE "
        "| span ECE (calibrated: up to) |"
    )
    lines = ["## Spans", "", header, "|" + "---|" * 10]
    for name, b in sides.items():
        s = b["spans"]
        values = [s["exact"][k] for k in ("precision", "recall", "f1")]
        values += [s["overlap"][k] for k in ("precision", "recall", "f1")] + [b.get("log_loss"), b.get("ece")]
        band = f" ({fmt(s['span_ece_band'])})" if s.get("span_ece_band") is not None else ""
        lines.append(f"| {name} | " + " | ".join(fmt(v) for v in values) + f" | {fmt(s.get('span_ece'))}{band} |")
    lines += ["", "| label | gold | predicted | exact F1 (95% bootstrap) | overlap F1 |", "|---|---|---|---|---|"]
    for key, c in block["spans"]["by_label"].items():
        low, high = c.get("exact_f1_ci95") or (None, None)
        interval = f" ({fmt(low)}–{fmt(high)})" if low is not None else ""
        exact, overlap = fmt(c["exact"]["f1"]) + interval, fmt(c["overlap"]["f1"])
        lines.append(f"| {key} | {c['gold']} | {c['predicted']} | {exact} | {overlap} |")
    return [*lines, ""]
