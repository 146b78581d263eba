"""`mydecide merge`: merge a LoRA adapter into its base weights and verify it answers the same (a plain transformers
directory, with mydecide's render config and span head beside it)."""

from __future__ import annotations

from pathlib import Path

import typer

from mydecide.commands import fail, friendly_errors
from mydecide.commands.options import Adapter, AllowOtherBase, Device, Model, Out, RecipeArgs, recipe_from_command_line
from mydecide.config import MergeRecipe


def register(app: typer.Typer) -> None:
    @app.command("merge")
    @friendly_errors
    def merge(
        args: RecipeArgs = None,
        adapter: Adapter = None,
        allow_other_base: AllowOtherBase = False,
        out: Out = None,
        model: Model = None,
        dtype: str | None = typer.Option(
            None,
            help="Saved weight dtype: float32, bfloat16, float16, or auto (the base model's); default float32. "
            "The merge itself always runs in float32.",
        ),
        tolerance: float | None = typer.Option(
            None, min=0.0, help="Largest allowed gap between merged and unmerged option probabilities (default 1e-3)."
        ),
        check_data: str | None = typer.Option(
            None,
            help="A records JSONL whose first questions are used for the check (default: built-in sample questions).",
        ),
        check_n: int | None = typer.Option(None, min=1, help="How many records of --check-data to check (default 16)."),
        device: Device = None,
        overwrite: bool = typer.Option(False, help="Replace an earlier merge in --out (nothing else)."),
    ) -> None:
        """Merge the adapter in float32, save a plain transformers directory, and check it answers the same."""
        options = {
            "model": model,
            "adapter": adapter,
            "allow_other_base": True if allow_other_base else None,
            "out": out,
            "dtype": dtype,
            "tolerance": tolerance,
            "check_data": check_data,
            "check_n": check_n,
            "device": device,
            "overwrite": True if overwrite else None,
        }
        recipe = recipe_from_command_line(MergeRecipe, args, options)
        if recipe.adapter is None:
            fail("missing --adapter: the LoRA adapter directory to merge")
            return
        if recipe.out is None:
            fail("missing --out: the directory to write the merged model to")
            return
        from mydecide.merging import merge_adapter, sample_items

        items = sample_items(Path(recipe.check_data), recipe.check_n) if recipe.check_data is not None else None
        target = Path(recipe.out)
        report = merge_adapter(
            recipe.model,
            recipe.adapter,
            target,
            dtype=recipe.dtype,
            tolerance=recipe.tolerance,
            items=items,
            device=recipe.device,
            overwrite=recipe.overwrite,
            allow_other_base=recipe.allow_other_base,
        )
        summary = (
            f"{report.n_questions} questions, largest probability gap {report.max_abs_diff:.2e} "
            f"(tolerance {report.tolerance:g}, dtype {report.dtype})"
        )
        if not report.ok:
            fail(
                f"merged and unmerged probabilities disagree: {summary}, worst on {report.worst_question!r}; "
                f"the unverified model is in {target.with_name(target.name + '.unverified')}"
                + ("; try --dtype float32" if report.dtype != "float32" else ""),
                code=1,
            )
        typer.echo(f"merged {report.base} + {recipe.adapter} into {target}: verified on {summary}")
