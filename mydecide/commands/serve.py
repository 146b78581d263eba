"""`mydecide serve`: the Jev ``POST /v1/systemone`` server (uvicorn), one model instance per process."""

from __future__ import annotations

import dataclasses
import ipaddress
from pathlib import Path
from typing import Any

import typer

from mydecide.commands import fail, friendly_errors
from mydecide.serving.batching import BatchOptions
from mydecide.serving.wire import Limits

DEFAULT_LIMITS = Limits()
DEFAULT_BATCHING = BatchOptions()


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def server_config(
    app: Any, host: str, port: int, *, request_timeout_s: float, body_timeout_s: float = 30.0, log_level: str = "info"
) -> Any:
    """The uvicorn settings ``serve`` runs with.

    On SIGTERM / SIGINT uvicorn stops accepting connections and waits for the requests in flight; it cancels them
    (a 500) once ``timeout_graceful_shutdown`` has passed. A request answers within its body timeout plus its
    request timeout (a 408 / 503 at worst), so waiting that long, plus a margin, drains every one of them.
    """
    import uvicorn

    return uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level.lower(),
        access_log=False,
        timeout_keep_alive=5,
        timeout_graceful_shutdown=int(body_timeout_s + request_timeout_s) + 5,
    )


LOOPBACK_NAMES = ["localhost", "127.0.0.1", "::1"]


def default_allowed_hosts(host: str, api_key: str | None) -> list[str]:
    """The Host headers answered by default: any with an API key; else the loopback names and the bound address
    (not a wildcard one), so a web page cannot reach a keyless server through DNS rebinding."""
    if api_key:
        return ["*"]
    extra = [] if host in ("0.0.0.0", "::", "") or host in LOOPBACK_NAMES else [host]
    return LOOPBACK_NAMES + extra


def parse_limits(overrides: list[str], **flags: int) -> Limits:
    """``Limits`` from the dedicated flags (``max_questions=…``) and ``--limit NAME=VALUE`` overrides, which win."""
    names = [f.name for f in dataclasses.fields(Limits)]
    values = dict(flags)
    for item in overrides:
        name, sep, value = item.partition("=")
        name = name.strip().replace("-", "_")
        if not sep or name not in names:
            raise ValueError(f"--limit {item!r}: use NAME=VALUE with NAME one of {', '.join(names)}")
        if not value.strip().isdigit() or int(value) < 1:
            raise ValueError(f"--limit {item!r}: the value must be a whole number ≥ 1")
        values[name] = int(value)
    return Limits(**values)


def register(app: typer.Typer) -> None:
    @app.command("serve")
    @friendly_errors
    def serve(
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
        host: str = typer.Option("127.0.0.1", help="Interface to bind (loopback by default)."),
        port: int = typer.Option(8741, min=0, max=65535, help="TCP port."),
        api_key: str | None = typer.Option(
            None,
            "--api-key",
            envvar="MYDECIDE_API_KEY",
            show_envvar=True,
            help="Require 'Authorization: Bearer KEY' on /v1/systemone.",
        ),
        no_auth: bool = typer.Option(False, "--no-auth", help="Allow a non-loopback --host without an API key."),
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
        max_questions: int = typer.Option(DEFAULT_LIMITS.max_questions, min=1, help="Questions per request."),
        max_prompts: int = typer.Option(
            DEFAULT_LIMITS.max_prompts, min=1, help="Scored prompts per request (a set question counts one per label)."
        ),
        max_state_chars: int = typer.Option(
            DEFAULT_LIMITS.max_state_chars, min=1, help="Characters of state per request."
        ),
        max_body_bytes: int = typer.Option(DEFAULT_LIMITS.max_body_bytes, min=1, help="Request body size in bytes."),
        limit: list[str] = typer.Option(
            [],
            "--limit",
            help="Any request limit as NAME=VALUE (repeatable): "
            + ", ".join(f"{f.name}={getattr(DEFAULT_LIMITS, f.name)}" for f in dataclasses.fields(Limits))
            + " (docs/wire.md).",
        ),
        batch_window_ms: float = typer.Option(
            5.0, min=0.0, help="How long a request waits for others to share its forward pass."
        ),
        max_batch_requests: int = typer.Option(16, min=1, help="Requests per micro-batch."),
        max_pending: int = typer.Option(256, min=1, help="Queued requests beyond which the server answers 503."),
        slice_tokens: int = typer.Option(
            DEFAULT_BATCHING.slice_tokens,
            min=256,
            help="Tokens scored in one go "
            "while other requests wait: a larger batch is scored in slices, and "
            "requests that arrive meanwhile are answered between two slices.",
        ),
        request_timeout: float = typer.Option(
            120.0, min=0.1, help="Seconds a request may wait for its answer before a 503."
        ),
        baseline: bool = typer.Option(
            False,
            "--baseline",
            help="Turn off micro-batching and shared-prefix "
            "scoring: one prompt and one forward pass per question (for benchmarks).",
        ),
        device: str | None = typer.Option(None, help="cpu, cuda, cuda:1 … (default: cuda when available)."),
        log_level: str = typer.Option("info", help="debug, info, warning or error."),
    ) -> None:
        """Serve a decision model: POST /v1/systemone (Jev format) and GET /health."""
        import logging

        if not is_loopback(host) and not api_key and not no_auth:
            fail(
                f"--host {host} exposes the server beyond this machine: set --api-key (or MYDECIDE_API_KEY), "
                "or pass --no-auth to serve without one"
            )
        from mydecide.modeling import check_option_form, resolve_model_path

        path, _ = resolve_model_path(model)  # a missing model fails here with one line, not in the server's startup
        if adapter is not None and not (adapter / "adapter_config.json").is_file():
            raise FileNotFoundError(f"{adapter}: not a LoRA adapter directory (no adapter_config.json)")
        check_option_form(path, adapter, option_form)  # so does a form the adapter was not trained with
        temperature = None
        if temperatures is not None:
            from mydecide.calibration.temperatures import load_temperatures

            temperature = load_temperatures(temperatures)  # read now: a bad file fails before the model loads
        limits = parse_limits(
            limit,
            max_questions=max_questions,
            max_prompts=max_prompts,
            max_state_chars=max_state_chars,
            max_body_bytes=max_body_bytes,
        )
        options = (
            BatchOptions.baseline()
            if baseline
            else BatchOptions(
                window_ms=batch_window_ms,
                max_requests=max_batch_requests,
                max_pending=max_pending,
                slice_tokens=slice_tokens,
            )
        )
        level = getattr(logging, log_level.upper(), None)
        if not isinstance(level, int):
            raise ValueError(f"--log-level {log_level!r}: use debug, info, warning or error")
        logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

        from mydecide.modeling import load_model
        from mydecide.serving.app import create_app

        def loader():  # runs in the app's lifespan, after uvicorn has started
            return load_model(model, adapter, device=device, option_form=option_form)

        from mydecide.serving.app import public_name

        server = create_app(
            loader,
            temperature=temperature,
            limits=limits,
            api_key=api_key,
            batching=options,
            model_name=name or public_name(model),
            request_timeout_s=request_timeout,
            allowed_hosts=allowed_hosts or default_allowed_hosts(host, api_key),
        )
        typer.echo(
            f"mydecide serve: http://{host}:{port}/v1/systemone (model {model}"
            f"{', adapter ' + str(adapter) if adapter else ''}; auth {'on' if api_key else 'off'}"
            f"{'; baseline: no batching, no shared prefix' if baseline else ''})",
            err=True,
        )
        import uvicorn

        uvicorn.Server(server_config(server, host, port, request_timeout_s=request_timeout, log_level=log_level)).run()
