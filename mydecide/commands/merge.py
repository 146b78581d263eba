"""`mydecide merge`: merge a LoRA adapter into its base weights for vLLM / SGLang / llama.cpp, and verify it."""

from __future__ import annotations

from pathlib import Path

import typer

from mydecide.commands import fail, friendly_errors
from mydecide.commands.options import Adapter, Device, Model


def register(app: typer.Typer) -> None:
    @app.command("merge")
    @friendly_errors
    def merge(
        adapter: Adapter = None,
        out: Path = typer.Option(..., "--out", "-o", help="Where to write the merged model directory."),
        model: Model = None,
        dtype: str = typer.Option(
            "float32",
            help="Saved weight dtype: float32, bfloat16, float16, or auto "
            "(the base model's). The merge itself always runs in float32.",
        ),
        tolerance: float = typer.Option(
            1e-3, min=0.0, help="Largest allowed gap between merged and unmerged option probabilities."
        ),
        check_data: Path | None = typer.Option(
            None,
            help="A records JSONL whose first questions are used for the check (default: built-in sample questions).",
        ),
        check_n: int = typer.Option(16, min=1, help="How many records of --check-data to check."),
        device: Device = None,
        overwrite: bool = typer.Option(False, help="Replace a non-empty --out."),
    ) -> None:
        """Merge the adapter in float32, save a plain transformers directory, and check it answers the same."""
        if adapter is None:
            fail("missing --adapter: the LoRA adapter directory to merge")
            return
        from mydecide.merging import merge_adapter, sample_items

        items = sample_items(check_data, check_n) if check_data is not None else None
        report = merge_adapter(
            model, adapter, out, dtype=dtype, tolerance=tolerance, items=items, device=device, overwrite=overwrite
        )
        summary = (
            f"{report.n_questions} questions, largest probability gap {report.max_abs_diff:.2e} "
            f"(tolerance {report.tolerance:g}, dtype {report.dtype})"
        )
        if not report.ok:
            fail(
                f"merged and unmerged probabilities disagree: {summary}, worst on {report.worst_question!r}; "
                f"the unverified model is in {out.with_name(out.name + '.unverified')}"
                + ("; try --dtype float32" if report.dtype != "float32" else ""),
                code=1,
            )
        typer.echo(f"merged {report.base} + {adapter} into {out}: verified on {summary}")
