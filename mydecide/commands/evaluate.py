"""`mydecide evaluate`: metrics, baselines, slices, order robustness and latency → report.json / .md / .png."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer

from mydecide.commands import friendly_errors
from mydecide.commands.options import (
    Adapter,
    AllowOtherBase,
    BatchSize,
    Limit,
    Model,
    OptionFormOption,
    Out,
    Quiet,
    ScoreFormOption,
    Temperatures,
    check_records_file,
    recipe_from_command_line,
)
from mydecide.config import COHERENCE_STATES, EvalRecipe
from mydecide.errors import UserError

ARGS_HELP = "[RECIPE.yaml] [KEY=VALUE ...] and more data files (--data a.jsonl b.jsonl works)."
SUMMARY_COLUMNS = (
    ("n", "n"),
    ("accuracy", "accuracy"),
    ("log_loss", "log loss"),
    ("ece", "ECE"),
    ("ece_band", "(calibrated: up to"),
)


def parse_costs(text: str) -> dict[str, float]:
    """``right=1,wrong=-3,escalate=-0.5`` → payoffs (keys not given keep their defaults)."""
    costs: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.partition("=")
        key = key.strip()
        if not sep or key not in ("right", "wrong", "escalate"):
            raise UserError(f"--costs {text!r}: expected right=…,wrong=…,escalate=… (got {part!r})")
        try:
            costs[key] = float(value)
        except ValueError:
            raise UserError(f"--costs {text!r}: {key} must be a number, got {value!r}") from None
    return costs


def summary(report: dict[str, Any]) -> list[str]:
    """What the terminal shows of report.json: accuracy, log loss and ECE overall and per type, beside the
    baselines, and the auto-act threshold with its coverage, accuracy and payoff (report.md has everything)."""

    def line(name: str, block: dict[str, Any]) -> str:
        cells = [f"{label} {_number(block.get(key))}" for key, label in SUMMARY_COLUMNS]
        return f"  {name:<28} " + "  ".join(cells) + ")"

    lines = ["overall"]
    names = ("all", "choice", "noul", "score", "set", "span")
    lines += [line(name, report[name]) for name in names if report.get(name, {}).get("n")]  # a type may be absent
    ordinal = report.get("score", {}).get("ordinal")
    if ordinal:
        lines.append(
            f"  score (ordinal)              MAE {_number(ordinal['mae'])}  ρ {_number(ordinal['spearman'])}  "
            f"within one {_number(ordinal['within_one'])}  RPS skill {_number(ordinal['rps_skill'])}  "
            f"threshold ECE {_number(ordinal['threshold_ece'])} (calibrated: up to "
            f"{_number(ordinal['threshold_ece_band'])})"
        )
    base = report.get("baselines", {}).get("base_model", {}).get("span", {})
    for name, spans in (("model", report.get("span", {}).get("spans")), ("base model", base.get("spans"))):
        if spans:
            lines.append(f"  span F1 ({name}) exact {spans['exact']['f1']:.3f}  overlap {spans['overlap']['f1']:.3f}")
    baselines = report.get("baselines", {})
    lines.append("baselines")
    if report.get("uncalibrated"):
        lines.append(line("model, T = 1", report["uncalibrated"]["all"]))
    if "base_model" in baselines:
        lines.append(line("base model (no adapter)", baselines["base_model"]["all"]))
    if "majority" in baselines:
        lines.append(
            line(f"majority ({Path(str(baselines['majority']['source'])).name})", baselines["majority"]["all"])
        )
    thresholds = report["thresholds"]
    costs = thresholds["costs"]
    chosen = next((row for row in thresholds["table"] if row["auto_act"]), None)
    lines.append(
        f"thresholds: payoffs right = {costs['right']:g}, wrong = {costs['wrong']:g}, escalate = "
        f"{costs['escalate']:g}: auto-act when p > {thresholds['auto_act_threshold']:.3f}, escalate otherwise"
        + (
            f" (coverage {_number(chosen['coverage'])}, accuracy {_number(chosen['accuracy'])}, "
            f"payoff {_number(chosen['payoff'])} per question)"
            if chosen
            else ""
        )
    )
    if report.get("coherence"):
        from mydecide.evaluation.coherence import coherence_lines

        lines += coherence_lines(report["coherence"])
    return lines


def _number(value: Any) -> str:
    if value is None:
        return "—"
    return str(value) if isinstance(value, int) else f"{value:.3f}"


def register(app: typer.Typer) -> None:
    @app.command("evaluate")
    @friendly_errors
    def evaluate(
        args: list[str] | None = typer.Argument(None, help=ARGS_HELP, show_default=False),
        model: Model = None,
        adapter: Adapter = None,
        allow_other_base: AllowOtherBase = False,
        temperatures: Temperatures = None,
        option_form: OptionFormOption = None,
        score_form: ScoreFormOption = None,
        data: list[str] | None = typer.Option(None, "--data", "-d", help="Decision-record JSONL file(s)."),
        out: Out = None,
        permutations: int | None = typer.Option(
            None, help="Random option orders per question, besides the reversed order (default 4)."
        ),
        costs: str | None = typer.Option(
            None,
            help="Payoffs, e.g. right=1,wrong=-3,escalate=-0.5: prints "
            "the auto-act threshold and its coverage / accuracy / payoff table.",
        ),
        coherence: bool | None = typer.Option(
            None,
            "--coherence/--no-coherence",
            help=f"Also run JevBench's coherence laws on {COHERENCE_STATES} states of the data (coherence=N for N).",
        ),
        no_base: bool = typer.Option(False, "--no-base", help="Skip the base model (adapter disabled)."),
        limit: Limit = None,
        batch_size: BatchSize = None,
        quiet: Quiet = False,
    ) -> None:
        """Score records and write predictions.jsonl, report.json, report.md and reliability.png."""
        from mydecide.evaluation.run import evaluate_files

        options: dict[str, Any] = {
            "model": model,
            "adapter": adapter,
            "allow_other_base": True if allow_other_base else None,
            "temperatures": temperatures,
            "option_form": option_form,
            "score_form": score_form,
            "data": list(data) if data else None,
            "out": out,
            "permutations": permutations,
            "coherence": None if coherence is None else COHERENCE_STATES if coherence else 0,
            "limit": limit,
            "batch_size": batch_size,
            "base": False if no_base else None,
        }
        if costs is not None:
            options.update({f"costs.{key}": value for key, value in parse_costs(costs).items()})
        recipe = recipe_from_command_line(EvalRecipe, args, options, data_files=True)
        for path in recipe.data:
            check_records_file(path)
        evaluate_files(recipe, progress=not quiet)
        report = json.loads((Path(recipe.out) / "report.json").read_text(encoding="utf-8"))
        typer.echo("\n".join(summary(report)))
        typer.echo(f"wrote {Path(recipe.out) / 'report.json'}, report.md, reliability.png, predictions.jsonl")
