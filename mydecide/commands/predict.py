"""`mydecide predict`: answer one /v1/systemone request file from the command line (same JSON as the server)."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from mydecide.commands import friendly_errors
from mydecide.commands.options import (
    Adapter,
    AllowOtherBase,
    Device,
    Model,
    OptionFormOption,
    ScoreFormOption,
    Temperatures,
    recipe_from_command_line,
)
from mydecide.config import ServeRecipe
from mydecide.errors import UserError


def register(app: typer.Typer) -> None:
    @app.command("predict")
    @friendly_errors
    def predict(
        request: Path = typer.Argument(..., help="A JSON file with a /v1/systemone request body."),
        args: list[str] | None = typer.Argument(
            None, help="[RECIPE.yaml] [KEY=VALUE ...]: a serve recipe (model, adapter, …).", show_default=False
        ),
        model: Model = None,
        adapter: Adapter = None,
        allow_other_base: AllowOtherBase = False,
        temperatures: Temperatures = None,
        option_form: OptionFormOption = None,
        score_form: ScoreFormOption = None,
        no_shared_prefix: bool = typer.Option(
            False, "--no-shared-prefix", help="Score each question with its own full prompt."
        ),
        device: Device = None,
    ) -> None:
        """Answer one request file and print the Jev-format response JSON on stdout."""
        options = {
            "model": model,
            "adapter": adapter,
            "allow_other_base": True if allow_other_base else None,
            "temperatures": temperatures,
            "option_form": option_form,
            "score_form": score_form,
            "shared_prefix": False if no_shared_prefix else None,
            "device": device,
        }
        recipe = recipe_from_command_line(ServeRecipe, args, options)
        from mydecide.modeling import load_model
        from mydecide.serving.request import RequestError, decode_body, parse_request
        from mydecide.serving.response import answer_request

        if request.is_dir():
            raise IsADirectoryError(f"{request} is a directory; give a JSON file holding one /v1/systemone request")
        if not request.is_file():
            raise FileNotFoundError(f"{request}: no such request file")
        limit = recipe.limits.max_body_bytes  # the server's limit (limits.max_body_bytes=N raises it)
        with open(request, "rb") as handle:
            raw = handle.read(limit + 1)  # never more: the file may be huge, or endless (a device, a pipe)
        if len(raw) > limit:
            raise UserError(
                f"{request}: larger than the limit of {limit} bytes a request body may have; raise it with "
                "limits.max_body_bytes=N"
            )
        try:  # the server's checks
            parsed = parse_request(decode_body(raw), recipe.limits)
        except RequestError as err:
            raise UserError(f"{request}: {err}") from None
        temperature = None
        if recipe.temperatures is not None:
            from mydecide.calibration.temperatures import load_temperatures

            temperature = load_temperatures(recipe.temperatures)
        loaded = load_model(
            recipe.model,
            recipe.adapter,
            device=recipe.device,
            option_form=recipe.option_form,
            score_form=recipe.score_form,
            allow_other_base=recipe.allow_other_base,
        )
        response = answer_request(loaded, parsed, temperature, shared_prefix=recipe.shared_prefix)
        typer.echo(json.dumps(response, indent=2, ensure_ascii=False))
