"""Micro-batching: the one thread that runs the model, scoring many concurrent requests per forward pass.

Requests are queued by the HTTP handlers. The worker takes the first waiting request, keeps collecting for a
short window (``window_ms``) or until a batch is full, renders all of their prompts and scores them in one
call of its engine (``serving/engines.py``; the default torch engine runs ``score_packed`` where the model allows
it, else ``score_prompts``): questions on one state share the
state's prefix computation, and different requests fill the batch (a choice with more than 26 options adds
a second round, ``many_options``: the final rounds of the batch's requests are scored together too). While
the model is busy new requests pile
up in the queue, so under load batches fill without any waiting. Every answer depends only on its own request
(each question continues from its own state's prefix, padding is masked), which the tests check.

One large request cannot hold small ones back for long: a batch of more than ``slice_tokens`` tokens is scored in
slices of at most that many, and between two slices the worker answers the requests that arrived meanwhile and fit
in one slice. A small request therefore waits for one slice at most, not for the whole large request; the large one
pays for it with its state prefix computed once per slice instead of once.

One model instance per process: only this thread touches the model.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from mydecide.config import BatchOptions, Limits
from mydecide.scoring.packed import tree_tokens
from mydecide.scoring.plan import prompt_count, score_plans
from mydecide.scoring.probabilities import TemperatureLookup
from mydecide.serving.engines import LogitsEngine, TorchEngine, check_served, prompt_scorer
from mydecide.serving.request import Request, RequestError
from mydecide.serving.response import build_response, render_request, score_spans

if TYPE_CHECKING:
    import numpy as np

    from mydecide.scoring.model import LoadedModel
    from mydecide.scoring.render import Prompt
    from mydecide.serving.response import RenderedRequest

log = logging.getLogger("mydecide.serve")


@dataclass
class BatchStats:
    """Counters for /health and the tests."""

    batches: int = 0
    requests: int = 0
    prompts: int = 0
    largest_batch: int = 0
    failures: int = 0

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


@dataclass
class _Job:
    request: Request
    future: Future[dict[str, Any]]
    n_prompts: int
    rendered: RenderedRequest | None = field(default=None)


_STOP = object()


def token_slices(prompts: list[Prompt], budget: int) -> list[list[int]]:
    """Cut prompt indices into slices of at most ``budget`` tokens (as ``scoring.packed.tree_tokens`` counts them; one
    prompt longer than the budget is a slice of its own), keeping the prompts of one state together as far as the
    budget allows."""
    by_root: dict[tuple[int, ...], list[int]] = {}
    for i, p in enumerate(prompts):
        by_root.setdefault(p.root, []).append(i)
    slices: list[list[int]] = []
    current: list[int] = []
    size = 0
    roots: set[tuple[int, ...]] = set()  # the states and the questions' prefixes already in the current slice
    prefixes: set[tuple[int, ...]] = set()
    for members in by_root.values():
        for i in members:
            p = prompts[i]
            cost = len(p.suffix) + (0 if p.root in roots else len(p.root))
            cost += 0 if p.prefix in prefixes else len(p.prefix) - len(p.root)
            if current and size + cost > budget:
                slices.append(current)
                current, size, roots, prefixes = [], 0, set(), set()
                cost = len(p)
            current.append(i)
            size += cost
            roots.add(p.root)
            prefixes.add(p.prefix)
    if current:
        slices.append(current)
    return slices


class Scorer:
    """Owns the model, its engine and its worker thread; ``submit`` returns a future with the Jev response.

    ``engine`` (default: :class:`~mydecide.serving.engines.TorchEngine` on ``model``) reads the rendered prompts'
    label logits; ``model`` renders the requests (and reads span questions when the engine serves them)."""

    def __init__(
        self,
        model: LoadedModel,
        options: BatchOptions = BatchOptions(),
        temperature: TemperatureLookup | None = None,
        model_name: str | None = None,
        limits: Limits | None = None,
        engine: LogitsEngine | None = None,
    ):
        self.model = model
        self.engine = engine if engine is not None else TorchEngine(model, options)
        self._score_prompts = prompt_scorer(self.engine)
        self.options = options
        self.limits = limits  # the token limits are checked once a request is tokenised (render_request)
        self.temperature = temperature
        self.model_name = model_name or model.name
        self.stats = BatchStats()
        self.packed = False  # the torch engine's choice in start(): packing only where it reproduces score_prompts
        self._queue: queue.Queue[Any] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._backlog: deque[Any] = deque()  # jobs taken from the queue that start the next batches, oldest first
        self._interleaving = False  # answering small requests between two slices of a large batch

    # -- lifecycle ---------------------------------------------------------------------------------------------
    def start(self) -> Scorer:
        self.engine.start()
        self.packed = bool(getattr(self.engine, "packed", False))
        self._thread = threading.Thread(target=self._loop, name="mydecide-scorer", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        if self._thread is None:
            return
        self._queue.put(_STOP)
        self._thread.join(timeout)
        self._thread = None

    def score(self, prompts: list[Prompt]) -> list[np.ndarray]:
        """Option logits for prompts of any number of requests (the worker's forward passes): in one go, or in
        slices of ``slice_tokens`` with the requests that arrived meanwhile answered between two slices."""
        if self._interleaving or tree_tokens(prompts) <= self.options.slice_tokens:
            return self._score_now(prompts)
        out: list[np.ndarray | None] = [None] * len(prompts)
        for part in token_slices(prompts, self.options.slice_tokens):
            for i, row in zip(part, self._score_now([prompts[i] for i in part]), strict=True):
                out[i] = row
            self._answer_waiting()
        return out  # type: ignore[return-value]

    def _score_now(self, prompts: list[Prompt]) -> list[np.ndarray]:
        return self._score_prompts(prompts)  # the engine's label logits, in each question's canonical order

    def _answer_waiting(self) -> None:
        """Between two slices of a large batch: answer the requests queued since that fit in one slice (the
        others wait in the backlog for the next batch)."""
        waiting: list[_Job] = []
        while True:
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                break
            if job is _STOP:
                self._backlog.append(job)
                break
            waiting.append(job)
        if not waiting:
            return
        small: list[tuple[_Job, int]] = []
        for job in self._render(waiting):
            assert job.rendered is not None
            tokens = job.rendered.plan.tokens()
            if tokens <= self.options.slice_tokens:
                small.append((job, tokens))
            else:
                self._backlog.append(job)
        self._interleaving = True
        try:
            part: list[_Job] = []
            size = 0
            for job, tokens in small:  # in slices too: a crowd of small requests is scored in bounded passes
                if part and size + tokens > self.options.slice_tokens:
                    self._score_and_answer(part)
                    part, size = [], 0
                part.append(job)
                size += tokens
            self._score_and_answer(part)
        finally:
            self._interleaving = False

    @property
    def pending(self) -> int:
        return self._queue.qsize() + len(self._backlog)

    def submit(self, request: Request) -> Future[dict[str, Any]]:
        """Queue one parsed request; the future resolves to its response (or the scoring error). A question the
        engine cannot read is refused here, before the queue (:func:`~mydecide.serving.engines.check_served`)."""
        check_served(request, self.engine)  # a span question the engine cannot read: the client's 422
        future: Future[dict[str, Any]] = Future()
        n_prompts = sum(prompt_count(q, self.model.renderer.form(q)) for q in request.questions.values())
        self._queue.put(_Job(request, future, n_prompts))
        return future

    def answer(self, request: Request, timeout: float | None = None) -> dict[str, Any]:
        """Submit and wait (for callers outside an event loop: tests, warm-up)."""
        return self.submit(request).result(timeout)

    # -- worker ------------------------------------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            first = self._backlog.popleft() if self._backlog else self._queue.get()
            if first is _STOP:
                return
            jobs = self._collect(first)
            stop = jobs and jobs[-1] is _STOP
            if stop:
                jobs.pop()
            if jobs:
                self._run(jobs)
            if stop:
                return

    def _collect(self, first: _Job) -> list[Any]:
        """The first job plus whatever arrives within the window, up to the batch limits."""
        jobs: list[Any] = [first]
        opts = self.options
        if not opts.batching:
            return jobs
        n_prompts = first.n_prompts
        deadline = time.monotonic() + opts.window_ms / 1000.0
        while len(jobs) < opts.max_requests:
            if self._backlog:
                job = self._backlog.popleft()
            else:
                wait = deadline - time.monotonic()
                try:
                    job = self._queue.get(timeout=wait) if wait > 0 else self._queue.get_nowait()
                except queue.Empty:
                    break
            if job is _STOP:
                jobs.append(job)
                break
            if n_prompts + job.n_prompts > opts.max_prompts:
                self._backlog.appendleft(job)  # starts the next batch
                break
            jobs.append(job)
            n_prompts += job.n_prompts
        return jobs

    def _run(self, jobs: list[_Job]) -> None:
        """Render, score and answer a micro-batch; a failure is confined to the request that caused it."""
        self._score_and_answer(self._render(jobs))

    def _render(self, jobs: list[_Job]) -> list[_Job]:
        """Tokenise each job's prompts (once: a job from the backlog already is); the jobs that can be scored."""
        live = []
        for job in jobs:
            if job.rendered is not None:
                live.append(job)
                continue
            if not job.future.set_running_or_notify_cancel():
                continue  # the client went away while it waited
            try:
                job.rendered = render_request(
                    self.model, job.request, shared_prefix=self.options.shared_prefix, limits=self.limits
                )
            except RequestError as err:  # over a limit: the client's 422, not a scoring failure
                job.future.set_exception(err)
                continue
            except Exception as err:  # reported to that request only
                self._fail(job, err)
                continue
            live.append(job)
        return live

    def _score_and_answer(self, live: list[_Job]) -> None:
        if not live:
            return
        try:  # one forward call per round over every request's pending prompts, then their span questions' sequences
            n_prompts = score_plans([job.rendered.plan for job in live], self.score)  # type: ignore[union-attr]
            score_spans(self.model, [job.rendered for job in live if job.rendered is not None])
        except Exception as err:
            if len(live) == 1:
                self._fail(live[0], err)
                return
            log.warning("a batch of %d requests failed (%s); scoring them one by one", len(live), err)
            for job in live:
                self._run_alone(job)
            return
        self._count(live, n_prompts)
        for job in live:
            self._answer(job)

    def _run_alone(self, job: _Job) -> None:
        assert job.rendered is not None
        job.rendered.plan.reset()  # the failed batch may have read a round already
        try:
            n_prompts = score_plans([job.rendered.plan], self.score)
        except Exception as err:
            self._fail(job, err)
            return
        self._count([job], n_prompts)
        self._answer(job)

    def _answer(self, job: _Job) -> None:
        assert job.rendered is not None
        try:
            score_spans(self.model, job.rendered)  # read with the batch already; after a failed batch, read here alone
            job.future.set_result(build_response(job.rendered, self.temperature, self.model_name))
        except Exception as err:
            self._fail(job, err)

    def _count(self, jobs: list[_Job], n_prompts: int) -> None:
        self.stats.batches += 1
        self.stats.requests += len(jobs)
        self.stats.prompts += n_prompts
        self.stats.largest_batch = max(self.stats.largest_batch, len(jobs))

    def _fail(self, job: _Job, err: Exception) -> None:
        self.stats.failures += 1
        log.error("scoring failed: %s: %s", type(err).__name__, err)
        job.future.set_exception(err)
