"""`mydecide train`: LoRA fine-tuning with a proper scoring rule, RLCD or cross-entropy."""

from __future__ import annotations

from pathlib import Path

import typer

from mydecide.commands import friendly_errors


def register(app: typer.Typer) -> None:
    @app.command("train", context_settings={"allow_extra_args": False})
    @friendly_errors
    def train(
        recipe: Path = typer.Argument(..., help="A training recipe, e.g. recipes/train/demo.yaml."),
        overrides: list[str] = typer.Argument(None, help="Dotted KEY=VALUE overrides, e.g. lora.r=16 optim.lr=1e-3."),
        data: Path | None = typer.Option(None, "--data", help="A `mydecide prepare` output directory."),
        model: str | None = typer.Option(
            None, "--model", "-m", help="Base model (HF dir, hub name, .gguf, smollm2-135m)."
        ),
        objective: str | None = typer.Option(None, "--objective", help="proper | rlcd | ce | ce_then_proper."),
        out: Path | None = typer.Option(None, "--out", help="Run directory (adapter/, last/, checkpoints/, …)."),
        resume: bool = typer.Option(
            False,
            "--resume",
            help="Continue the run in --out from its newest readable "
            "checkpoint; refused if the recipe or the data changed.",
        ),
        allow_change: list[str] = typer.Option(
            [],
            "--allow-change",
            metavar="KEY",
            help="With --resume: a recipe key that may differ from the run's "
            "(optim.max_steps, optim.epochs, eval_every, save_every, "
            "keep_checkpoints, eval_batch_size, collapse_after, report_to).",
        ),
    ) -> None:
        """Train a LoRA adapter; keeps the best adapter on dev (RUN/adapter) and the last (RUN/last)."""
        from mydecide.config import TrainRecipe, load_recipe, validate_recipe
        from mydecide.training.loop import train as run_training

        extra = list(overrides or [])
        if objective is not None:
            extra.append(f"objective.kind={objective}")
        loaded = load_recipe(recipe, extra, model=TrainRecipe)
        # paths are taken as they are, never parsed as YAML (`--out "runs/exp #2"` is that directory)
        given = {"data": data, "model": model, "out": out}
        paths = {key: str(value) for key, value in given.items() if value is not None}
        if paths:
            loaded = validate_recipe(TrainRecipe, {**loaded.model_dump(), **paths})
        import os

        run = run_training(loaded, resume=resume, allow_change=allow_change)
        if os.environ.get("RANK", "0") == "0":  # under `accelerate launch`, print once
            typer.echo(str(run))
