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
        limit: Limit = None,
        batch_size: BatchSize = None,
        force: bool = typer.Option(
            False, "--force", help="Fit even on a file that looks like a training or test split."
        ),
        quiet: Quiet = False,
    ) -> None:
        """Fit temperatures on dev data and write temperatures.json (read by evaluate, serve and predict)."""
        from mydecide.calibration.run import calibrate_file

        options = {
            "model": model,
            "adapter": adapter,
            "allow_other_base": True if allow_other_base else None,
            "option_form": option_form,
            "data": data,
            "out": out,
            "by_bucket": by_bucket,
            "min_rows": min_rows,
            "limit": limit,
            "batch_size": batch_size,
        }
        recipe = recipe_from_command_line(CalibrateRecipe, args, options)
        check_records_file(recipe.data)
        document = calibrate_file(recipe, force=force, progress=not quiet)
        typer.echo(f"{'type':<8} {'bucket':<7} {'n':>6} {'T':>7}  log loss before → after   ECE before → after")
        rows = [(t, "all", s) for t, s in document["types"].items()]
        rows += [(t, b, s) for t, bs in document["buckets"].items() for b, s in bs.items()]
        for qtype, bucket, s in rows:
            note = "  (fallback)" if "fallback" in s else "  (at the search bound)" if s["at_bound"] else ""
            typer.echo(
                f"{qtype:<8} {bucket:<7} {s['n']:>6} {s['temperature']:>7.3f}  "
                f"{s['log_loss_before']:>8.4f} → {s['log_loss_after']:<8.4f}   "
                f"{s['ece_before']:.4f} → {s['ece_after']:.4f}{note}"
            )
        o = document["overall"]
        apart = o["n"] < sum(s["n"] for s in document["types"].values())  # span questions left to their own row
        typer.echo(
            f"overall: log loss {o['log_loss_before']:.4f} → {o['log_loss_after']:.4f}, "
            f"ECE {o['ece_before']:.4f} → {o['ece_after']:.4f} on {o['n']} questions"
            + (" (span questions: their own row above)" if apart else "")
        )
        typer.echo(f"wrote {recipe.out}")
