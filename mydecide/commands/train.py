"""`mydecide train`: LoRA fine-tuning with a proper scoring rule, RLCD or cross-entropy."""

from __future__ import annotations

import os
from typing import get_args

import typer

from mydecide.commands import fail, friendly_errors
from mydecide.commands.options import Model, Out, recipe_from_command_line, split_args
from mydecide.config import Objective, TrainRecipe

OBJECTIVE_KINDS = " | ".join(kind.model_fields["kind"].default for kind in get_args(Objective))


def register(app: typer.Typer) -> None:
    @app.command("train", context_settings={"allow_extra_args": False})
    @friendly_errors
    def train(
        args: list[str] | None = typer.Argument(
            None,
            help="A training recipe (e.g. recipes/train/demo.yaml) and dotted KEY=VALUE overrides, e.g. lora.r=16 "
            "optim.lr=1e-3.",
            show_default=False,
        ),
        data: str | None = typer.Option(None, "--data", "-d", help="A `mydecide prepare` output directory."),
        model: Model = None,
        objective: str | None = typer.Option(None, "--objective", help=f"objective.kind: {OBJECTIVE_KINDS}."),
        out: Out = None,
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
        if split_args(args)[0] is None:
            fail("missing RECIPE (a training recipe such as recipes/train/demo.yaml)")
            return
        from mydecide.training.loop import train as run_training

        # paths are taken as they are, never parsed as YAML (`--out "runs/exp #2"` is that directory)
        options = {"data": data, "model": model, "out": out, "objective.kind": objective}
        recipe = recipe_from_command_line(TrainRecipe, args, options)
        run = run_training(recipe, resume=resume, allow_change=allow_change)
        if os.environ.get("RANK", "0") == "0":  # under `accelerate launch`, print once
            typer.echo(str(run))
