"""`mydecide calibrate`: fit one temperature per question type (optionally per option-count bucket) on dev data."""

from __future__ import annotations

from typing import Any

import typer

from mydecide.commands import friendly_errors
from mydecide.commands.evaluate import resolve


def register(app: typer.Typer) -> None:
    @app.command("calibrate")
    @friendly_errors
    def calibrate(
        args: list[str] | None = typer.Argument(None, help="[RECIPE.yaml] [KEY=VALUE ...]", show_default=False),
        model: str | None = typer.Option(
            None, "--model", "-m", help="Base model: HF dir, hub name, .gguf, or smollm2-135m (default)."
        ),
        adapter: str | None = typer.Option(None, "--adapter", "-a", help="A LoRA adapter directory."),
        data: str | None = typer.Option(None, "--data", "-d", help="Dev JSONL (never the training split)."),
        out: str | None = typer.Option(None, "--out", "-o", help="Where to write temperatures.json."),
        by_bucket: bool | None = typer.Option(
            None, "--by-bucket/--by-type", help="Also fit per (type, option-count bucket)."
        ),
        min_rows: int | None = typer.Option(
            None,
            help="Questions a type or bucket needs for its own "
            "temperature (default 30); smaller buckets use their type's.",
        ),
        limit: int | None = typer.Option(None, help="Only the first N records."),
        batch_size: int | None = typer.Option(None, help="Prompts per forward pass (default 16)."),
        force: bool = typer.Option(
            False, "--force", help="Fit even on a file that looks like a training or test split."
        ),
        quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar."),
    ) -> None:
        """Fit temperatures on dev data and write temperatures.json (read by evaluate, serve and predict)."""
        from mydecide.calibration.run import calibrate_file
        from mydecide.config import CalibrateRecipe

        cli: dict[str, Any] = {
            "model": model,
            "adapter": adapter,
            "data": data,
            "out": out,
            "by_bucket": by_bucket,
            "min_rows": min_rows,
            "limit": limit,
            "batch_size": batch_size,
        }
        recipe = resolve(CalibrateRecipe, args, cli)
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
        typer.echo(
            f"overall: log loss {o['log_loss_before']:.4f} → {o['log_loss_after']:.4f}, "
            f"ECE {o['ece_before']:.4f} → {o['ece_after']:.4f} on {o['n']} questions"
        )
        typer.echo(f"wrote {recipe.out}")
