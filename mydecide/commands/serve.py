"""`mydecide serve`: the Jev ``POST /v1/systemone`` server (uvicorn), one model instance per process.

The options and one call: ``serving.server.serve`` holds the host policy, the checks before the model loads, the
startup and uvicorn's configuration."""

from __future__ import annotations

import os
from typing import Any

import typer

from mydecide.commands import friendly_errors
from mydecide.commands.options import (
    Adapter,
    AllowOtherBase,
    Device,
    Model,
    OptionFormOption,
    RecipeArgs,
    ScoreFormOption,
    Temperatures,
    recipe_from_command_line,
)
from mydecide.config import Limits, ServeRecipe
from mydecide.errors import UserError
from mydecide.serving.server import BODY_TIMEOUT_S, HEADER_TIMEOUT_S

DEFAULT = ServeRecipe()  # the defaults the help shows: the recipe model's fields

SERVE_EXAMPLES = """Examples:

  mydecide serve --adapter runs/demo/train/adapter --temperatures runs/demo/temperatures.json

  mydecide serve recipes/serve/default.yaml port=9000 --limit max_input_tokens=4000

  mydecide serve --host 0.0.0.0 --api-key KEY --adapter A    (any other host needs a key)

  mydecide serve --engine vllm --model BASE_DIR --adapter A    (docs/serving.md)
"""


def limit_values(items: list[str]) -> dict[str, int]:
    """``--limit NAME=VALUE`` items → {name: value} (a dash in NAME may stand for an underscore)."""
    names = list(Limits.model_fields)
    values = {}
    for item in items:
        name, sep, value = item.partition("=")
        name = name.strip().replace("-", "_")
        if not sep or name not in names:
            raise UserError(f"--limit {item!r}: use NAME=VALUE with NAME one of {', '.join(names)}")
        if not value.strip().isdigit() or int(value) < 1:
            raise UserError(f"--limit {item!r}: the value must be a whole number ≥ 1")
        values[name] = int(value)
    return values


def register(app: typer.Typer) -> None:
    @app.command("serve", epilog=SERVE_EXAMPLES)
    @friendly_errors
    def serve(
        args: RecipeArgs = None,
        model: Model = None,
        adapter: Adapter = None,
        allow_other_base: AllowOtherBase = False,
        temperatures: Temperatures = None,
        option_form: OptionFormOption = None,
        score_form: ScoreFormOption = None,
        host: str | None = typer.Option(None, help=f"Interface to bind (default {DEFAULT.host}, loopback)."),
        port: int | None = typer.Option(None, min=0, max=65535, help=f"TCP port (default {DEFAULT.port})."),
        api_key: str | None = typer.Option(
            None,
            "--api-key",
            envvar="MYDECIDE_API_KEY",
            show_envvar=True,
            help="Require 'Authorization: Bearer KEY' on /v1/systemone.",
        ),
        no_auth: bool = typer.Option(False, "--no-auth", help="Allow a non-loopback --host without an API key."),
        allow_origin: list[str] | None = typer.Option(
            None,
            "--allow-origin",
            help="A browser origin (https://app.example, or * for any) whose web pages may call the server; "
            "repeat for more. Requests from other pages are refused (403).",
        ),
        name: str | None = typer.Option(
            None,
            help="Model name reported when a request names none (default: --model, a local path cut to its last part).",
        ),
        allowed_hosts: list[str] = typer.Option(
            [],
            "--allowed-hosts",
            help="A Host header name to answer "
            "(repeatable; '*' for any). Default: any with an API key, else "
            "localhost, 127.0.0.1, ::1 and --host.",
        ),
        max_questions: int | None = typer.Option(
            None, min=1, help=f"Questions per request (default {DEFAULT.limits.max_questions})."
        ),
        max_prompts: int | None = typer.Option(
            None,
            min=1,
            help=f"Scored prompts per request, a set question counting one per label (default "
            f"{DEFAULT.limits.max_prompts}).",
        ),
        max_state_chars: int | None = typer.Option(
            None, min=1, help=f"Characters of state per request (default {DEFAULT.limits.max_state_chars})."
        ),
        max_body_bytes: int | None = typer.Option(
            None, min=1, help=f"Request body size in bytes (default {DEFAULT.limits.max_body_bytes})."
        ),
        limit: list[str] = typer.Option(
            [],
            "--limit",
            help="Any request limit as NAME=VALUE (repeatable): "
            + ", ".join(f"{key}={value}" for key, value in DEFAULT.limits.model_dump().items())
            + " (docs/wire.md).",
        ),
        batch_window_ms: float | None = typer.Option(
            None,
            min=0.0,
            help=f"How long a request waits for others to share its forward pass (default "
            f"{DEFAULT.batching.window_ms:g}).",
        ),
        max_batch_requests: int | None = typer.Option(
            None, min=1, help=f"Requests per micro-batch (default {DEFAULT.batching.max_requests})."
        ),
        max_pending: int | None = typer.Option(
            None,
            min=1,
            help=f"Queued requests beyond which the server answers 503 (default {DEFAULT.batching.max_pending}).",
        ),
        slice_tokens: int | None = typer.Option(
            None,
            min=256,
            help="Tokens scored in one go while other requests wait: a larger batch is scored in slices, and "
            f"requests that arrive meanwhile are answered between two slices (default "
            f"{DEFAULT.batching.slice_tokens}).",
        ),
        request_timeout: float | None = typer.Option(
            None,
            min=0.1,
            help=f"Seconds a request may wait for its answer before a 503 (default {DEFAULT.request_timeout_s:g}).",
        ),
        header_timeout: float = typer.Option(
            HEADER_TIMEOUT_S,
            min=0.1,
            help="Seconds a client has to send a request's line and headers, from the connection opening or the "
            "previous answer; then the connection is closed (a 408 when part of a request came).",
        ),
        body_timeout: float = typer.Option(
            BODY_TIMEOUT_S,
            min=0.1,
            help="Seconds a client then has to send the request body; then a 408 and the connection is closed.",
        ),
        baseline: bool = typer.Option(
            False,
            "--baseline",
            help="Turn off micro-batching and shared-prefix "
            "scoring: one prompt and one forward pass per question (for benchmarks).",
        ),
        engine: str | None = typer.Option(
            None,
            "--engine",
            help=f"What runs the forward passes: torch or vllm (default {DEFAULT.engine}; vllm: a local base with "
            "--adapter as a per-request LoRA, or a merged model; no span questions; docs/serving.md).",
        ),
        device: Device = None,
        log_level: str | None = typer.Option(None, help="debug, info, warning or error (default info)."),
    ) -> None:
        """Serve a decision model: POST /v1/systemone (Jev format) and GET /health."""
        options: dict[str, Any] = {
            "model": model,
            "adapter": adapter,
            "allow_other_base": True if allow_other_base else None,
            "temperatures": temperatures,
            "option_form": option_form,
            "score_form": score_form,
            "host": host,
            "port": port,
            "name": name,
            "allowed_hosts": allowed_hosts or None,
            "limits.max_questions": max_questions,
            "limits.max_prompts": max_prompts,
            "limits.max_state_chars": max_state_chars,
            "limits.max_body_bytes": max_body_bytes,
            **{f"limits.{key}": value for key, value in limit_values(limit).items()},
            "batching.window_ms": batch_window_ms,
            "batching.max_requests": max_batch_requests,
            "batching.max_pending": max_pending,
            "batching.slice_tokens": slice_tokens,
            "request_timeout_s": request_timeout,
            "engine": engine,
            "device": device,
            "log_level": log_level.lower() if log_level else None,
        }
        if api_key is not None and os.environ.get("MYDECIDE_API_KEY") != api_key:
            typer.echo(
                "[mydecide] warning: --api-key shows the key to every local user (ps, /proc); set MYDECIDE_API_KEY "
                "instead",
                err=True,
            )
        recipe = recipe_from_command_line(ServeRecipe, args, options)
        from mydecide.serving.server import serve as run_server

        run_server(
            recipe,
            api_key=api_key,
            no_auth=no_auth,
            allowed_origins=allow_origin or (),
            baseline=baseline,
            header_timeout_s=header_timeout,
            body_timeout_s=body_timeout,
        )
