"""`mydecide serve`: the Jev ``POST /v1/systemone`` server (uvicorn), one model instance per process."""

from __future__ import annotations

import ipaddress
import logging
from pathlib import Path
from typing import Any

import typer

from mydecide.commands import fail, friendly_errors
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
from mydecide.config import BatchOptions, Limits, ServeRecipe
from mydecide.errors import UserError

DEFAULT = ServeRecipe()  # the defaults the help shows: the recipe model's fields


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


HEADER_TIMEOUT_S = 10.0  # seconds a client has to send a request's line and headers (docs/wire.md, Connections)
BODY_TIMEOUT_S = 30.0  # seconds it then has to send the body


def server_config(
    app: Any,
    host: str,
    port: int,
    *,
    request_timeout_s: float,
    header_timeout_s: float = HEADER_TIMEOUT_S,
    body_timeout_s: float = BODY_TIMEOUT_S,
    log_level: str = "info",
) -> Any:
    """The uvicorn settings ``serve`` runs with.

    uvicorn bounds no read of a request (only the idle time between two), so its h11 protocol runs with the header
    and body deadlines of :class:`~mydecide.serving.app.RequestDeadlines`; ``body_timeout_s`` must be the app's own,
    whose 408 comes first. On SIGTERM / SIGINT uvicorn stops accepting connections and waits for the requests in
    flight; it cancels them (a 500) once ``timeout_graceful_shutdown`` has passed. A request answers within its body
    timeout plus its request timeout (a 408 / 503 at worst), so waiting that long, plus a margin, drains every one.
    """
    import uvicorn

    from mydecide.serving.app import RequestDeadlines

    return uvicorn.Config(
        app,
        host=host,
        port=port,
        http=RequestDeadlines.with_timeouts(header_timeout_s, body_timeout_s),
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
    @app.command("serve")
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
        recipe = recipe_from_command_line(ServeRecipe, args, options)
        if not is_loopback(recipe.host) and not api_key and not no_auth:
            fail(
                f"--host {recipe.host} exposes the server beyond this machine: set --api-key (or MYDECIDE_API_KEY), "
                "or pass --no-auth to serve without one"
            )
        from mydecide.serving.engines import engine_factory, require_engine

        require_engine(recipe.engine)  # an engine that cannot run here fails now, in one line
        from mydecide.modeling import check_model

        # a missing model, a damaged adapter or a form it was not trained with fail here in one line, not in the
        # server's startup
        adapter_dir = Path(recipe.adapter) if recipe.adapter is not None else None
        checked = check_model(recipe.model, adapter_dir, recipe.option_form, recipe.score_form)
        make_engine = engine_factory(
            recipe.engine, checked.path, checked.adapter, max_model_len=recipe.limits.max_prompt_tokens + 1
        )
        temperature = None
        if recipe.temperatures is not None:
            from mydecide.calibration.temperatures import load_temperatures

            temperature = load_temperatures(recipe.temperatures)  # read now: a bad file fails before the model loads
        logging.basicConfig(
            level=getattr(logging, recipe.log_level.upper()), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
        )

        from mydecide.modeling import load_model
        from mydecide.serving.app import create_app, public_name

        refused: list[str] = []  # why the model was not loaded (another base than the adapter's): one line at exit

        def loader():  # runs in the app's lifespan, after uvicorn has started
            try:
                return load_model(checked, device=recipe.device, allow_other_base=recipe.allow_other_base)
            except (FileNotFoundError, UserError) as err:  # the user's mistake: one line; a bug keeps its traceback
                refused.append(str(err))
                raise

        def build_engine(loaded: Any) -> Any:  # built in the app's lifespan, on the loaded model
            assert make_engine is not None
            try:
                return make_engine(loaded)
            except Exception as err:  # vLLM has logged its root cause: the exit says which engine, in one line
                refused.append(f"--engine {recipe.engine} did not start: {type(err).__name__}: {err}")
                raise

        server = create_app(
            loader,
            temperature=temperature,
            limits=recipe.limits,
            api_key=api_key,
            batching=BatchOptions.baseline() if baseline else recipe.batching,
            model_name=recipe.name or public_name(recipe.model),
            request_timeout_s=recipe.request_timeout_s,
            body_timeout_s=body_timeout,
            allowed_hosts=recipe.allowed_hosts or default_allowed_hosts(recipe.host, api_key),
            engine=build_engine if make_engine is not None else None,
        )
        typer.echo(
            f"mydecide serve: http://{recipe.host}:{recipe.port}/v1/systemone (model {recipe.model}"
            f"{', adapter ' + str(adapter_dir) if adapter_dir else ''}; auth {'on' if api_key else 'off'}"
            f"{'; baseline: no batching, no shared prefix' if baseline else ''})",
            err=True,
        )
        import uvicorn

        config = server_config(
            server,
            recipe.host,
            recipe.port,
            request_timeout_s=recipe.request_timeout_s,
            header_timeout_s=header_timeout,
            body_timeout_s=body_timeout,
            log_level=recipe.log_level,
        )
        # once the loader has refused, uvicorn's startup-failure log (a traceback) says nothing the one line does not
        logging.getLogger("uvicorn.error").addFilter(lambda record: not refused)
        try:
            uvicorn.Server(config).run()
        except SystemExit:
            if refused:
                fail(refused[0])
            raise
