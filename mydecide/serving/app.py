"""The HTTP server: ``POST /v1/systemone`` (the Jev contract, docs/wire.md) and ``GET /health``, each with or without
a trailing slash (never a redirect).

``create_app`` builds a FastAPI app around one model, loaded in the app's lifespan (never at import), and one
:class:`~mydecide.serving.batching.Scorer` thread that runs it through an engine (``serving/engines.py``; default the
torch forward pass). A request goes through, in order:

0. the Host header must be one of ``allowed_hosts`` (when given; against DNS rebinding) → 400, on every path;
1. a browser's Origin header that is not one of ``allowed_origins`` → 403 (a web page cannot spend the server's
   CPU through its visitors); bearer-token check (when an API key is set; exactly one Authorization header;
   constant-time compare) → 401;
2. body size: the Content-Length header, then the bytes actually received → 413; a Content-Type other than
   ``application/json``, a compressed body or a charset other than UTF-8 → 415;
3. strict JSON decoding (UTF-8 only) → 400; the wire-format rules and limits → 422 naming the question and the rule;
   a question type the engine does not serve (span questions without a span path) → 422 naming it;
4. the scorer queue (503 when it is full or an answer takes longer than ``request_timeout_s``); a request whose
   client closes the connection meanwhile is taken off the queue (499) unless it is already being scored.

Every error answer is ``{"error": "<message>"}``. Each request is logged (method, path, status, latency,
number of questions), never the state or the questions' text. Before any of it,
:class:`~mydecide.serving.connections.RequestDeadlines` (the uvicorn protocol ``serve`` runs) bounds how long a client
may take to send a request's headers and body.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import Future
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from mydecide.config import Limits
from mydecide.scoring.probabilities import TemperatureLookup
from mydecide.serving.batching import BatchOptions, Scorer
from mydecide.serving.decisions import decisions_response, parse_decisions, systemone_body, with_noul_detail
from mydecide.serving.engines import LogitsEngine, served_types
from mydecide.serving.request import RequestError, check_span_floor, decode_body, parse_request, shorten
from mydecide.serving.schemas import DecisionsResponse, ErrorBody, ModelList, SystemOneResponse, openapi_schema

if TYPE_CHECKING:
    from mydecide.scoring.model import LoadedModel

log = logging.getLogger("mydecide.serve")

ENDPOINT = "/v1/systemone"
DECISIONS = "/v1/decisions"
WARMUP_REQUEST = {
    "state": "Warm-up.",
    "questions": {
        "q": {"type": "noul", "instructions": "Ready?"},
        "r": {"type": "choice", "instructions": "Which?", "criteria": ["a", "b"]},
    },
}


class ApiError(Exception):
    """An answer other than 200, with the message the client sees."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers


def error_response(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    """Every error answer: ``{"error": message}``, the message cut to 300 characters whoever wrote it."""
    return JSONResponse({"error": shorten(message)}, status_code=status, headers=headers)


def public_name(name: str) -> str:
    """A model name fit to show anyone: a local path becomes its last part (``/srv/models/m`` → ``m``)."""
    from pathlib import Path

    return Path(name).name if ("/" in name or "\\" in name) and Path(name).exists() else name


def host_of(header: str) -> str:
    """The host name of a Host header, without its port: ``[::1]:8741`` → ``::1``, ``Localhost:80`` → ``localhost``."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1:].partition("]")[0]
    return header.rpartition(":")[0] if header.count(":") == 1 else header


def check_host(header: str | None, allowed: Sequence[str]) -> None:
    if "*" in allowed:
        return
    host = host_of(header or "")
    if not host or host not in {a.lower() for a in allowed}:
        shown = (header or "")[:60]
        raise ApiError(
            400,
            f"Host header {shown!r} is not allowed; this server answers {', '.join(allowed)} "
            f"(start it with --allowed-hosts to add a name)",
        )


def check_bearer(headers: list[str], api_key: str) -> None:
    """Require exactly one ``Authorization: Bearer <api_key>`` header; compare in constant time."""
    challenge = {"WWW-Authenticate": "Bearer"}
    if len(headers) > 1:  # proxies and frameworks disagree on which one counts: trust none
        raise ApiError(401, f"send one Authorization header, not {len(headers)}", challenge)
    header = headers[0] if headers else None
    if not header:
        raise ApiError(401, "missing Authorization header: send 'Authorization: Bearer <api key>'", challenge)
    scheme, _, token = header.strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise ApiError(401, "the Authorization header must be 'Bearer <api key>'", challenge)
    if not hmac.compare_digest(token.strip().encode("utf-8"), api_key.encode("utf-8")):
        raise ApiError(401, "invalid API key", challenge)


def check_origin(origin: str | None, allowed: Sequence[str]) -> None:
    """Refuse (403) a request a browser sends for a web page of another origin, unless ``allowed`` names it (``*``:
    any); clients other than browsers send no Origin header."""
    if origin is not None and origin not in allowed and "*" not in allowed:
        shown = origin if len(origin) <= 80 else origin[:79] + "…"
        raise ApiError(403, f"requests from the web page origin {shown!r} are not allowed (serve --allow-origin)")


def check_charset(content_type: str | None) -> None:
    """Refuse (415) a body declared as anything but ``application/json`` (a form or text/plain is what a web page can
    send unasked), or with a charset other than UTF-8: the body is read as UTF-8 JSON whatever the header says. No
    header is fine (a browser page sends an Origin, refused by :func:`check_origin`)."""
    media = (content_type or "").split(";")[0].strip().lower()
    if content_type is not None and media != "application/json":
        raise ApiError(415, f"Content-Type {media[:40]!r} is not accepted: send the body as application/json")
    for parameter in (content_type or "").split(";")[1:]:
        name, _, value = parameter.partition("=")
        charset = value.strip().strip('"')
        if name.strip().lower() == "charset" and charset.lower() != "utf-8":
            raise ApiError(415, f"Content-Type charset {charset[:40]!r} is not accepted: send the JSON body as UTF-8")


async def client_gone(request: Request) -> None:
    """Return once the client has closed its connection (the body is read by then: what comes next is the end)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def unless_gone(request: Request, future: Future[dict[str, Any]], timeout_s: float) -> dict[str, Any]:
    """The scorer's answer, within ``timeout_s`` (TimeoutError); a request whose client has gone is cancelled, so the
    scorer skips it unless it is already being scored, and is answered 499 (which no one reads)."""
    answer, gone = asyncio.wrap_future(future), asyncio.ensure_future(client_gone(request))
    both: set[asyncio.Future[Any]] = {answer, gone}
    try:
        done, _ = await asyncio.wait(both, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not answer.done():
            answer.cancel()  # cancels ``future`` too: the scorer drops a request it has not started
    if answer in done:
        result: dict[str, Any] = answer.result()
        return result
    if gone in done:
        raise ApiError(499, "the client closed the connection before its answer")
    raise TimeoutError


async def read_body(request: Request, limit: int, timeout_s: float) -> bytes:
    """The request body, refused (413) as soon as it exceeds ``limit`` bytes, declared or received, and (415) when
    its headers say it is compressed or not UTF-8."""
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.strip().isdigit():
            raise ApiError(400, f"invalid Content-Length header {declared[:40]!r}")
        if int(declared) > limit:
            raise ApiError(413, f"the body of {int(declared)} bytes exceeds the limit of {limit} bytes")

    encoding = request.headers.get("content-encoding", "identity").strip().lower()
    if encoding != "identity":
        raise ApiError(415, f"Content-Encoding {encoding[:40]!r} is not accepted: send the JSON body uncompressed")
    check_charset(request.headers.get("content-type"))

    async def receive() -> bytes:
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > limit:
                raise ApiError(413, f"the body exceeds the limit of {limit} bytes")
        return bytes(body)

    try:
        return await asyncio.wait_for(receive(), timeout_s)
    except TimeoutError:  # the rest of the body is never read: the connection cannot carry another request
        raise ApiError(408, f"the body did not arrive within {timeout_s:g} s", {"Connection": "close"}) from None
    except ClientDisconnect:  # nobody will read the answer, but the log shows a client error, not an internal one
        raise ApiError(400, "the client closed the connection before sending the whole body") from None


async def api_error(_: Request, err: ApiError) -> JSONResponse:
    return error_response(err.status, err.message, err.headers)


async def http_error(request: Request, err: StarletteHTTPException) -> JSONResponse:
    path = request.url.path if len(request.url.path) <= 100 else request.url.path[:100] + "…"
    message = {
        404: f"no route {path}; the endpoints are POST {ENDPOINT}, POST {DECISIONS}, GET /v1/models, GET /health and "
        "GET /openapi.json",
        405: f"method {request.method[:20]} is not allowed on {path}",
    }.get(err.status_code, str(err.detail))
    return error_response(err.status_code, message, getattr(err, "headers", None))


async def validation_error(_: Request, err: RequestValidationError) -> JSONResponse:
    """FastAPI's own answer would list every error with the input it got (a 100 kB value, echoed whole)."""
    first = err.errors()[0] if err.errors() else {}
    where = ".".join(str(part) for part in first.get("loc", ()))
    return error_response(422, f"invalid request: {where}: {first.get('msg', 'invalid')}")


async def internal_error(_: Request, err: Exception) -> JSONResponse:
    log.exception("internal error: %s", type(err).__name__)
    return error_response(500, "internal error while scoring (see the server log)")


async def log_requests(request: Request, call_next: Callable[[Request], Any]) -> Any:
    """Log every request (method, path, status, latency, number of questions), after the Host header check (a 400
    on every path when ``app.state.allowed_hosts`` is set and the header is not one of them)."""
    started = time.perf_counter()
    request.state.questions = 0
    status = 500
    try:
        allowed_hosts = request.app.state.allowed_hosts
        if allowed_hosts is not None:
            try:
                check_host(request.headers.get("host"), allowed_hosts)
            except ApiError as err:
                status = err.status
                return error_response(err.status, err.message)
        response = await call_next(request)
        status = response.status_code
        return response
    finally:
        log.info(
            "%s %s %d %.1fms questions=%d",
            request.method,
            request.url.path,
            status,
            (time.perf_counter() - started) * 1000,
            request.state.questions,
        )


async def health(request: Request) -> dict[str, Any]:
    """GET /health: the model, the queue, the engine and the question types it serves."""
    scorer: Scorer = request.app.state.scorer
    return {
        "status": "ok",
        "model": public_name(scorer.model_name),
        "pending": scorer.pending,
        "packed": scorer.packed,
        "batching": scorer.options.batching,
        "engine": scorer.engine.name,
        "question_types": served_types(scorer.engine, scorer.model.renderer),
        "stats": scorer.stats.as_dict(),
    }


async def models(request: Request) -> JSONResponse:
    """GET /v1/models: the one served model, in the OpenAI list shape (the API key is asked for when one is set)."""
    if request.app.state.api_key:
        check_bearer(request.headers.getlist("authorization"), request.app.state.api_key)
    scorer: Scorer = request.app.state.scorer
    model = {"id": public_name(scorer.model_name), "object": "model", "created": request.app.state.started}
    return JSONResponse({"object": "list", "data": [model | {"owned_by": "mydecide"}]})


def create_app(
    model: LoadedModel | Callable[[], LoadedModel],
    *,
    temperature: TemperatureLookup | None = None,
    limits: Limits = Limits(),
    api_key: str | None = None,
    batching: BatchOptions = BatchOptions(),
    model_name: str | None = None,
    request_timeout_s: float = 120.0,
    body_timeout_s: float = 30.0,
    warm_up: bool = True,
    allowed_hosts: Sequence[str] | None = None,
    allowed_origins: Sequence[str] = (),
    engine: Callable[[LoadedModel], LogitsEngine] | None = None,
    noul_detail: bool = False,
) -> FastAPI:
    """Build the app. ``model`` is a loaded model or a function that loads one (called at startup).

    ``model_name`` is reported when a request names no model (default: the model's name, a path cut to its last
    part); ``api_key`` (when set) is required as a bearer token on ``/v1/systemone``. ``batching`` chooses
    micro-batching and shared-prefix scoring. ``allowed_hosts`` (host names, ``*`` for any; ``None``: no check) are
    the Host headers answered; ``serving.server.serve`` passes the loopback names when there is no API key;
    ``allowed_origins`` the browser origins (``https://app.example``, ``*``) whose pages may call it. ``engine``
    builds the scoring engine from the loaded model at startup (default: the torch engine on it). ``noul_detail``
    adds ``probabilities`` and ``confidence`` to ``/v1/systemone``'s noul answers, as vLLM's carry them.
    """

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        loaded = model if not callable(model) else await asyncio.to_thread(model)
        scorer = Scorer(
            loaded,
            batching,
            temperature,
            model_name or public_name(loaded.name),
            engine=engine(loaded) if engine is not None else None,
        ).start()
        if warm_up:  # the first forward pass is slow (allocations, kernel choice): pay it before serving
            await asyncio.to_thread(scorer.answer, parse_request(WARMUP_REQUEST))  # whatever the limits
        scorer.limits = limits
        app.state.scorer = scorer
        log.info(
            "serving %s (engine=%s, batching=%s, shared_prefix=%s, auth=%s; %s)",
            scorer.model_name,
            scorer.engine.name,
            batching.batching,
            batching.shared_prefix,
            "on" if api_key else "off",
            ", ".join(f"{t} {v['path']}" for t, v in served_types(scorer.engine, loaded.renderer).items()),
        )
        try:
            yield
        finally:
            await asyncio.to_thread(scorer.stop)

    # every route answers with and without a trailing slash; no redirect: a client following a 307 for a POST must
    # send its body again, and many do not (or turn it into a GET)
    app = FastAPI(
        title="mydecide",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url="/openapi.json",
        redirect_slashes=False,
    )

    app.state.allowed_hosts = allowed_hosts
    app.add_exception_handler(ApiError, api_error)  # type: ignore[arg-type]
    app.add_exception_handler(StarletteHTTPException, http_error)  # type: ignore[arg-type]
    app.add_exception_handler(RequestValidationError, validation_error)  # type: ignore[arg-type]
    app.add_exception_handler(Exception, internal_error)
    app.middleware("http")(log_requests)

    app.state.api_key, app.state.started = api_key, int(time.time())
    app.get("/health")(health)
    app.get("/health/", include_in_schema=False)(health)

    async def scored(request: Request, decisions: bool) -> dict[str, Any]:
        """The System One answer to a request's body (a Decisions body translated first): every check, then the
        scorer's queue."""
        check_origin(request.headers.get("origin"), allowed_origins)
        if api_key:
            check_bearer(request.headers.getlist("authorization"), api_key)
        raw = await read_body(request, limits.max_body_bytes, body_timeout_s)
        try:
            body = decode_body(raw)
        except RequestError as err:
            raise ApiError(400, str(err)) from None
        scorer: Scorer = request.app.state.scorer
        renderer = scorer.model.renderer
        try:
            if decisions:
                request.state.decisions = parse_decisions(body)
                body = systemone_body(request.state.decisions)
            parsed = parse_request(body, limits, renderer.form)
            check_span_floor(parsed, renderer.config.span, limits)  # here, so it never waits in the scorer's queue
        except RequestError as err:
            raise ApiError(422, str(err)) from None
        request.state.questions = len(parsed.questions)
        served = public_name(scorer.model_name)
        if parsed.model and parsed.model not in (served, scorer.model_name):  # never another model's answers
            raise ApiError(
                404, f"model {parsed.model!r} is not served here; this server serves {served!r} (serve --name sets it)"
            )
        if scorer.pending >= batching.max_pending:
            raise ApiError(503, "the server is busy; retry shortly", {"Retry-After": "1"})
        try:
            answer: dict[str, Any] = await unless_gone(request, scorer.submit(parsed), request_timeout_s)
        except TimeoutError:
            raise ApiError(
                503, f"no answer within {request_timeout_s:g} s; the server is overloaded", {"Retry-After": "5"}
            ) from None
        except RequestError as err:  # a question the engine cannot read, a limit only the tokenised prompts show
            raise ApiError(422, str(err)) from None
        return answer

    errors: dict[int | str, dict[str, Any]] = {s: {"model": ErrorBody} for s in (400, 401, 404, 413, 415, 422, 503)}

    @app.post(ENDPOINT, responses={200: {"model": SystemOneResponse}, **errors})
    @app.post(ENDPOINT + "/", include_in_schema=False)
    async def systemone(request: Request) -> JSONResponse:
        answer = await scored(request, decisions=False)
        return JSONResponse(with_noul_detail(answer) if noul_detail else answer)

    @app.post(DECISIONS, responses={200: {"model": DecisionsResponse}, **errors})
    @app.post(DECISIONS + "/", include_in_schema=False)
    async def decisions(request: Request) -> JSONResponse:
        answer = await scored(request, decisions=True)
        return JSONResponse(decisions_response(request.state.decisions, answer))

    app.get("/v1/models", responses={200: {"model": ModelList}, 401: {"model": ErrorBody}})(models)
    app.get("/v1/models/", include_in_schema=False)(models)

    def published_schema() -> dict[str, Any]:  # built once, on the first GET /openapi.json
        if app.openapi_schema is None:
            app.openapi_schema = openapi_schema(app)
        return app.openapi_schema

    app.openapi = published_schema  # type: ignore[method-assign]
    return app
