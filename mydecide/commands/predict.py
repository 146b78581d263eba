"""`mydecide predict`: answer one /v1/systemone request file from the command line (same JSON as the server)."""

from __future__ import annotations

from pathlib import Path

import typer

from mydecide.commands import friendly_errors


def register(app: typer.Typer) -> None:
    @app.command("predict")
    @friendly_errors
    def predict(
        request: Path = typer.Argument(..., help="A JSON file with a /v1/systemone request body."),
        model: str = typer.Option(
            "smollm2-135m", "--model", "-m", help="Base model: HF dir, hub name, .gguf, or smollm2-135m."
        ),
        adapter: Path | None = typer.Option(None, "--adapter", "-a", help="A LoRA adapter directory."),
        temperatures: Path | None = typer.Option(
            None, "--temperatures", "-t", help="temperatures.json from `mydecide calibrate`."
        ),
        option_form: str | None = typer.Option(
            None,
            "--option-form",
            help="How choice options are scored: letters or per_option (default: as the adapter was trained).",
        ),
        no_shared_prefix: bool = typer.Option(
            False, "--no-shared-prefix", help="Score each question with its own full prompt."
        ),
    ) -> None:
        """Answer one request file and print the Jev-format response JSON on stdout."""
        import json

        from mydecide.modeling import load_model
        from mydecide.serving.wire import Limits, RequestError, answer_request, decode_body, parse_request

        if request.is_dir():
            raise IsADirectoryError(f"{request} is a directory; give a JSON file holding one /v1/systemone request")
        if not request.is_file():
            raise FileNotFoundError(f"{request}: no such request file")
        try:  # the server's checks, without its body-size limit
            parsed = parse_request(decode_body(request.read_bytes()), Limits(max_body_bytes=2**62))
        except RequestError as err:
            raise ValueError(f"{request}: {err}") from None
        temperature = None
        if temperatures is not None:
            from mydecide.calibration.temperatures import load_temperatures

            temperature = load_temperatures(temperatures)
        loaded = load_model(model, adapter, option_form=option_form)
        response = answer_request(loaded, parsed, temperature, shared_prefix=not no_shared_prefix)
        typer.echo(json.dumps(response, indent=2, ensure_ascii=False))
