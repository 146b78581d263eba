"""`mydecide export-gguf`: a letters-form adapter merged into its base as a decision GGUF that llama.cpp's
/v1/systemone answers (docs/serving.md#export-gguf)."""

from __future__ import annotations

import typer

from mydecide.commands import fail, friendly_errors
from mydecide.commands.options import Adapter, Model, Out, Temperatures


def register(app: typer.Typer) -> None:
    @app.command("export-gguf")
    @friendly_errors
    def export_gguf(
        adapter: Adapter = None,
        out: Out = None,
        temperatures: Temperatures = None,
        model: Model = None,
        gguf_type: str = typer.Option("f16", "--type", help="Tensor type: f16, q8_0 or f32 (norms stay f32)."),
    ) -> None:
        """Merge a letters-form adapter (prompt.option_form=letters prompt.score_form=letters) into its GGUF base
        and write one GGUF that `llama-server -m FILE` serves at /v1/systemone: the merged weights, the base's
        tokenizer, a `systemone` template that renders mydecide's prompt, and the temperatures (-t)."""
        if adapter is None:
            fail("missing --adapter: the letters-form LoRA adapter directory to export")
            return
        if out is None:
            fail("missing --out: the .gguf file to write")
            return
        from mydecide.gguf_export import export_gguf as export

        export(adapter, temperatures, out, gguf_type=gguf_type, model=model)
