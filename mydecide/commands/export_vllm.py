"""`mydecide export-vllm`: an adapter as vLLM loads it, with what mydecide reads beside it (docs/serving.md)."""

from __future__ import annotations

from pathlib import Path

import typer

from mydecide.commands import fail, friendly_errors
from mydecide.commands.options import Adapter, Out, Temperatures

EXPORT_FILE = "mydecide_export.json"  # marks a directory export-vllm wrote: only such a one is replaced
TEMPERATURES_FILE = "temperatures.json"


def register(app: typer.Typer) -> None:
    @app.command("export-vllm")
    @friendly_errors
    def export_vllm(
        adapter: Adapter = None,
        out: Out = None,
        temperatures: Temperatures = None,
        overwrite: bool = typer.Option(False, help="Replace an earlier export in --out (nothing else)."),
    ) -> None:
        """Write the adapter's LoRA weights as vLLM loads them (no modules_to_save), its span head, render config
        and base record beside them, and the temperatures when given: for `vllm serve --lora-modules` or any engine
        that takes a plain LoRA. `mydecide serve --engine vllm --adapter` makes the same copy by itself."""
        if adapter is None:
            fail("missing --adapter: the LoRA adapter directory to export")
            return
        if out is None:
            fail("missing --out: the directory to write the vLLM copy to")
            return
        export(Path(adapter), Path(out), Path(temperatures) if temperatures else None, overwrite)


def export(adapter: Path, out: Path, temperatures: Path | None = None, overwrite: bool = False) -> dict[str, object]:
    """The export itself: checked first (the adapter, the temperatures, what --out holds), then written into a
    staging directory that replaces ``out`` whole."""
    import json
    import shutil

    from mydecide.adapters import ADAPTER_CONFIG, ADAPTER_WEIGHTS, BASE_FILE, check_adapter
    from mydecide.errors import UserError
    from mydecide.io import atomic_write_json, foreign_entries, holds, provenance, staged_directory, writing_tensors
    from mydecide.modeling import RENDER_CONFIG_FILE
    from mydecide.scoring.span_head import MERGED_FILE
    from mydecide.serving.vllm_engine import lora_rank_setting, write_vllm_lora

    check_adapter(adapter)  # a missing or damaged adapter fails first, naming its file
    if holds(out, adapter) or holds(adapter, out):
        raise UserError(f"--out {out}: holds or lies inside --adapter {adapter}, which export-vllm must not change")
    if holds(out, Path.cwd()):
        raise UserError(f"--out {out}: is the working directory or above it, which export-vllm would replace")
    if temperatures is not None:
        from mydecide.calibration.temperatures import load_temperatures

        load_temperatures(temperatures)  # a bad file fails now, in one line
    owned = {
        ADAPTER_CONFIG,
        ADAPTER_WEIGHTS,
        MERGED_FILE,
        RENDER_CONFIG_FILE,
        BASE_FILE,
        TEMPERATURES_FILE,
        EXPORT_FILE,
    }
    present = foreign_entries(out) if out.is_dir() else []
    if present and not (out / EXPORT_FILE).is_file():  # another adapter, say: only an earlier export is replaced
        raise UserError(
            f"{out}: holds {', '.join(present[:5])} but no {EXPORT_FILE} of an earlier export: not export-vllm's to "
            "replace; choose an empty or new --out"
        )
    if present and not overwrite:
        raise UserError(f"{out}: holds an earlier export; pass --overwrite to replace it, or choose another --out")
    with staged_directory(out, owned) as stage:
        with writing_tensors(out):
            written = write_vllm_lora(adapter, stage)
        for name in (RENDER_CONFIG_FILE, BASE_FILE):
            if (adapter / name).is_file():
                shutil.copyfile(adapter / name, stage / name)
        if temperatures is not None:
            shutil.copyfile(temperatures, stage / TEMPERATURES_FILE)
        record = {
            "adapter": str(adapter),
            **written,
            "temperatures": temperatures is not None,
            "provenance": provenance(),
        }
        atomic_write_json(stage / EXPORT_FILE, record)
    typer.echo(
        f"wrote {out}: {written['lora_tensors']} LoRA tensors of rank {written['rank']}"
        f"{', the span head (span_head.safetensors)' if written['span_head'] else ''}"
        f"{', temperatures.json' if temperatures is not None else ''}; for vLLM: --enable-lora --max-lora-rank "
        f"{lora_rank_setting(int(written['rank']))} --lora-modules NAME={out}",
        err=True,
    )
    return json.loads((out / EXPORT_FILE).read_text())
