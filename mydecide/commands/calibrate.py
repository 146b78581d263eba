"""`mydecide calibrate`: fit one temperature per question type (optionally per option-count bucket) on dev data."""

from __future__ import annotations

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
    RecipeArgs,
    ScoreFormOption,
    check_records_file,
    recipe_from_command_line,
)
from mydecide.config import CalibrateRecipe


def register(app: typer.Typer) -> None:
    @app.command("calibrate")
    @friendly_errors
    def calibrate(
        args: RecipeArgs = None,
        model: Model = None,
        adapter: Adapter = None,
        allow_other_base: AllowOtherBase = False,
        option_form: OptionFormOption = None,
        score_form: ScoreFormOption = None,
        data: str | None = typer.Option(None, "--data", "-d", help="Dev JSONL (never the training split)."),
        out: Out = None,
        by_bucket: bool | None = typer.Option(
            None, "--by-bucket/--by-type", help="Also fit per (type, option-count bucket)."
        ),
        min_rows: int | None = typer.Option(
            None,
            help="Questions a type or bucket needs for its own temperature (default 30); smaller buckets use their "
            "type's.",
        ),
        keep_fit: bool | None = typer.Option(
            None,
            "--keep-fit/--check-fit",
            help="Keep a fitted temperature even where it does not lower the dev log loss (default: check, and keep "
            "T = 1 there, saying so).",
        ),
        level_maps: bool | None = typer.Option(
            None,
            "--level-maps/--no-level-maps",
            help="Score questions: also fit a level map per K after the temperature where dev holds enough of them "
            "and it lowers the held-out log loss (default: on; docs/calibration.md#level-maps).",
        ),
        alpha: float | None = typer.Option(
            None,
            "--alpha",
            help="Also fit conformal answer sets that miss the gold answer at most this often (e.g. 0.1; "
            "docs/guarantees.md).",
        ),
        max_risk: float | None = typer.Option(
            None,
            "--max-risk",
            help="Also fit the auto-act threshold whose error rate among answered questions is at most this, with "
            "probability at least 1 − delta (Learn then Test; docs/guarantees.md).",
        ),
        delta: float | None = typer.Option(None, "--delta", help="With --max-risk: the chance of failing (0.1)."),
        limit: Limit = None,
        batch_size: BatchSize = None,
        force: bool = typer.Option(
            False, "--force", help="Fit even on a file that looks like a training or test split."
        ),
        quiet: Quiet = False,
    ) -> None:
        """Fit temperatures on dev data and write temperatures.json (read by evaluate, serve and predict)."""
        from mydecide.calibration.run import calibrate_file, fit_report

        options = {
            "model": model,
            "adapter": adapter,
            "allow_other_base": True if allow_other_base else None,
            "option_form": option_form,
            "score_form": score_form,
            "data": data,
            "out": out,
            "by_bucket": by_bucket,
            "min_rows": min_rows,
            "keep_fit": keep_fit,
            "level_maps": level_maps,
            "alpha": alpha,
            "max_risk": max_risk,
            "delta": delta,
            "limit": limit,
            "batch_size": batch_size,
        }
        recipe = recipe_from_command_line(CalibrateRecipe, args, options)
        check_records_file(recipe.data)
        document = calibrate_file(recipe, force=force, progress=not quiet)
        for line in fit_report(document):
            typer.echo(line)
        typer.echo(f"wrote {recipe.out}")
