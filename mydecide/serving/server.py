"""Running the server: ``serve(recipe, ...)`` checks what it can before anything loads, builds the app and runs it
under uvicorn until SIGTERM / SIGINT (``mydecide serve`` is its command line; docs/serving.md).

Before the model loads, one line refuses (a :class:`UserError`): a non-loopback host without an API key
(:func:`check_exposure`), an engine that cannot run here, a missing model, a damaged adapter or a form it was not
trained with, an adapter the vLLM engine cannot apply, an unreadable temperatures file. The model and the engine are
then built in the app's lifespan, after uvicorn has started; if either refuses there, the process still exits with
that one line, not uvicorn's traceback.

Nothing heavy is imported here at module level: ``mydecide --help`` reads this module's defaults.
"""

from __future__ import annotations

import ipaddress
import logging
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mydecide.config import BatchOptions, ServeRecipe
from mydecide.errors import UserError

if TYPE_CHECKING:
    from mydecide.scoring.model import LoadedModel
    from mydecide.serving.engines import LogitsEngine

HEADER_TIMEOUT_S = 10.0  # seconds a client has to send a request's line and headers (docs/wire.md, Connections)
BODY_TIMEOUT_S = 30.0  # seconds it then has to send the body
LOOPBACK_NAMES = ["localhost", "127.0.0.1", "::1"]


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_exposure(host: str, api_key: str | None, no_auth: bool) -> None:
    """Refuse to bind a non-loopback ``host`` without an API key, unless ``no_auth`` says so, and a key that no
    client can send (empty, or not printable ASCII without spaces: an HTTP header cannot carry it as written)."""
    if api_key is not None and not api_key:
        raise UserError("--api-key (or MYDECIDE_API_KEY) is empty: set a key, or pass --no-auth to serve without one")
    if api_key and not (api_key.isascii() and api_key.isprintable() and not any(c.isspace() for c in api_key)):
        raise UserError(
            "--api-key (or MYDECIDE_API_KEY) holds a character that no client can send in an Authorization header: "
            "use printable ASCII without spaces"
        )
    if not is_loopback(host) and not api_key and not no_auth:
        raise UserError(
            f"--host {host} exposes the server beyond this machine: set --api-key (or MYDECIDE_API_KEY), "
            "or pass --no-auth to serve without one"
        )


def check_settings(recipe: ServeRecipe) -> None:
    """Refuse settings under which every request would fail (a UserError naming the keys): a queue of 0, or a
    question-size window whose least is above its most."""
    limits, problems = recipe.limits, []
    if recipe.batching.max_pending < 1:
        problems.append("batching.max_pending is 0: every request would be answered 503 (busy)")
    for low, high in (("min_choice_options", "max_choice_options"), ("min_score_levels", "max_score_levels")):
        if getattr(limits, low) > getattr(limits, high):
            problems.append(
                f"limits.{low} {getattr(limits, low)} is above limits.{high} {getattr(limits, high)}: every "
                f"{low.split('_')[1]} question would be refused"
            )
    if problems:
        raise UserError(f"serve: {'; '.join(problems)}")


def default_allowed_hosts(host: str, api_key: str | None) -> list[str]:
    """The Host headers answered by default: any with an API key; else the loopback names and the bound address
    (not a wildcard one), so a web page cannot reach a keyless server through DNS rebinding."""
    if api_key:
        return ["*"]
    extra = [] if host in ("0.0.0.0", "::", "") or host in LOOPBACK_NAMES else [host]
    return LOOPBACK_NAMES + extra


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
    and body deadlines of :class:`~mydecide.serving.connections.RequestDeadlines`; ``body_timeout_s`` must be the
    app's own, whose 408 comes first. On SIGTERM / SIGINT uvicorn stops accepting connections and waits for the
    requests in flight; it cancels them (a 500) once ``timeout_graceful_shutdown`` has passed. A request answers within
    its body timeout plus its request timeout (a 408 / 503 at worst), so waiting that long, plus a margin, drains
    every one.
    """
    import uvicorn

    from mydecide.serving.connections import RequestDeadlines

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


def engine_factory(
    name: str, model_path: str | None = None, adapter: str | Path | None = None, **engine_args: Any
) -> Callable[[LoadedModel], LogitsEngine] | None:
    """The engine ``--engine NAME`` runs, as a function of the loaded model (None: the torch engine, which the scorer
    builds itself); a :class:`UserError` (one line, at startup) when it cannot run here. ``model_path`` and
    ``adapter``: what the engine loads (vLLM: :func:`~mydecide.serving.vllm_engine.vllm_factory`)."""
    from mydecide.serving.engines import require_engine

    require_engine(name)
    if name == "torch":
        return None
    from mydecide.serving.vllm_engine import vllm_factory

    return vllm_factory(model_path, adapter, **engine_args)


def serve(
    recipe: ServeRecipe,
    *,
    api_key: str | None = None,
    no_auth: bool = False,
    allowed_origins: Sequence[str] = (),
    baseline: bool = False,
    header_timeout_s: float = HEADER_TIMEOUT_S,
    body_timeout_s: float = BODY_TIMEOUT_S,
) -> None:
    """Serve ``recipe``'s model until SIGTERM / SIGINT: ``POST /v1/systemone`` (with ``api_key`` as a bearer token
    when given) and ``GET /health``; ``allowed_origins``: the browser origins whose web pages may call it.
    ``baseline`` turns off micro-batching and shared-prefix scoring (benchmarks);
    ``header_timeout_s`` / ``body_timeout_s`` bound how long a client may take to send a request's head and body.
    A :class:`UserError` (one line) for whatever the user can fix, before the model loads where it can be told then.
    """
    check_exposure(recipe.host, api_key, no_auth)
    check_settings(recipe)
    from mydecide.modeling import check_device, check_model
    from mydecide.serving.engines import require_engine

    if recipe.device is not None:
        check_device(recipe.device)  # now, in one line: the model loads after the server has started

    require_engine(recipe.engine)  # an engine that cannot run here fails now, in one line
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

    refused: list[str] = []  # why the model or the engine did not start: one line at exit

    def loader() -> LoadedModel:  # runs in the app's lifespan, after uvicorn has started
        try:
            return load_model(checked, device=recipe.device, allow_other_base=recipe.allow_other_base)
        except (FileNotFoundError, UserError) as err:  # the user's mistake: one line; a bug keeps its traceback
            refused.append(str(err))
            raise

    def build_engine(loaded: LoadedModel) -> LogitsEngine:  # built in the app's lifespan, on the loaded model
        assert make_engine is not None
        try:
            return make_engine(loaded)
        except Exception as err:  # vLLM has logged its root cause: the exit says which engine, in one line
            refused.append(f"--engine {recipe.engine} did not start: {type(err).__name__}: {err}")
            raise

    app = create_app(
        loader,
        temperature=temperature,
        limits=recipe.limits,
        api_key=api_key,
        batching=BatchOptions.baseline() if baseline else recipe.batching,
        model_name=recipe.name or public_name(recipe.model),
        request_timeout_s=recipe.request_timeout_s,
        body_timeout_s=body_timeout_s,
        allowed_hosts=recipe.allowed_hosts or default_allowed_hosts(recipe.host, api_key),
        allowed_origins=allowed_origins,
        engine=build_engine if make_engine is not None else None,
        noul_detail=recipe.noul_detail,
    )
    print(
        f"mydecide serve: http://{recipe.host}:{recipe.port}/v1/systemone (model {recipe.model}"
        f"{', adapter ' + str(adapter_dir) if adapter_dir else ''}; auth {'on' if api_key else 'off'}"
        f"{'; baseline: no batching, no shared prefix' if baseline else ''})",
        file=sys.stderr,
        flush=True,
    )
    run_server(app, recipe, header_timeout_s, body_timeout_s, refused)


def run_server(
    app: Any, recipe: ServeRecipe, header_timeout_s: float, body_timeout_s: float, refused: list[str]
) -> None:
    """Run ``app`` under uvicorn; when the startup failed for a reason in ``refused``, a :class:`UserError` with it."""
    import uvicorn

    config = server_config(
        app,
        recipe.host,
        recipe.port,
        request_timeout_s=recipe.request_timeout_s,
        header_timeout_s=header_timeout_s,
        body_timeout_s=body_timeout_s,
        log_level=recipe.log_level,
    )
    # once the loader has refused, uvicorn's startup-failure log (a traceback) says nothing the one line does not
    logging.getLogger("uvicorn.error").addFilter(lambda record: not refused)
    try:
        uvicorn.Server(config).run()
    except SystemExit:
        if refused:
            raise UserError(refused[0]) from None
        raise
