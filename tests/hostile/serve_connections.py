"""Category serve, part 3: the server itself (started once for the category, with two slow clients in the
background), bad `serve` limits, and connection abuse: 50 at once, idle, disconnects, pipelining, slow drips."""

from __future__ import annotations

import contextlib
import http.client
import json
import select
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from assets import Env
from harness import Case, Expect, Probe, Proc, Run
from judge import (
    judge_cli,
    warned,
)
from serve import NORMAL, answers_ok, body_of, q_noul
from wire import ENDPOINT, REQUEST_TIMEOUT, Resp, Server, build, exchange, http_request

SLOW_LIMIT = 40.0  # a slow-drip client must be cut off within this (the server's longest timeout, 30 s, + margin)


def custom_probe(
    env: Env, cid: str, what: str, expected: str, fn: Callable[[Case, Server], tuple[list[str], str]]
) -> Probe:
    """A server case with its own logic: ``fn`` returns (flags, good outcome)."""
    case = Case(f"srv-{cid}", "serve", what, expected)

    def go(case: Case) -> None:
        server = env.server
        assert server is not None
        offset = server.log_size()
        started = time.monotonic()
        flags, good = fn(case, server)
        case.seconds = case.seconds or round(time.monotonic() - started, 2)
        time.sleep(0.05)
        log = server.log_since(offset)
        if "Traceback" in log:
            flags.append("traceback")
            case.notes.append("Traceback in the server log: " + log[log.find("Traceback") :][:200].replace("\n", " | "))
        if server.popen.poll() is not None:
            flags.append("5xx")
            case.notes.append("the server exited")
        case.finish(flags, good)

    return Probe(case, go)


def normal_after(case: Case, server: Server) -> list[str]:
    """A normal request must still get a correct 200."""
    resp = exchange(server.port, build(body=body_of(NORMAL), port=server.port), "POST")
    if resp.error == "timeout":
        case.notes.append("the normal request after it timed out")
        return ["hang"]
    if resp.status != 200:
        case.notes.append(f"the normal request after it got {resp.status} {resp.error}")
        return ["5xx"] if resp.status is None or resp.status >= 500 else ["broken-output"]
    problem = answers_ok(NORMAL)(json.loads(resp.body))
    if problem:
        case.notes.append(f"the normal request after it: {problem}")
        return ["broken-output"]
    return []


def connection_probes(env: Env) -> list[Probe]:
    """Bad serve limits (separate processes), then connection abuse."""
    P: list[Probe] = []
    # bad serve limits (separate processes)
    for cid, extra, names in [
        ("limit-negative", ["--limit", "max_questions=-1"], ("max_questions",)),
        ("limit-float", ["--limit", "max_questions=1.5"], ("max_questions",)),
        ("limit-zero", ["--max-questions", "0"], ("max-questions",)),
        ("limit-unknown", ["--limit", "nosuch=1"], ("nosuch",)),
        ("limit-no-value", ["--limit", "max_questions"], ("max_questions",)),
        ("limit-override-negative", ["limits.max_state_chars=-5"], ("max_state_chars",)),
        ("request-timeout-0", ["--request-timeout", "0"], ("request-timeout",)),
        ("port-70000", ["--port", "70000"], ("port",)),
        ("temperatures-missing", ["--temperatures", "nosuch.json"], ("nosuch.json",)),
        ("host-public-no-key", ["--host", "0.0.0.0"], ("api-key",)),
        ("limit-huge", ["--limit", "max_questions=" + "9" * 30], ()),
        # issue 64: settings under which every request fails, a key no client can send, a device torch lacks
        ("queue-0", ["batching.max_pending=0"], ("max_pending",)),
        ("choice-window-inverted", ["limits.min_choice_options=5", "limits.max_choice_options=4"], ("min_choice",)),
        ("api-key-non-ascii", ["--api-key", "clé-secrète"], ("api-key",)),
        ("device-bogus", ["--device", "bogus"], ("bogus",)),
        ("api-key-space", ["--api-key", "my key"], ("api-key",)),  # "Bearer my key" splits: no header matches
    ]:
        P.append(serve_start_probe(env, cid, extra, names, tolerable=cid == "limit-huge"))
    P.append(  # issue 64: the key on the command line is in every local user's `ps`
        serve_start_probe(
            env,
            "api-key-on-command-line",
            ["--api-key", "s3cret-key-1234"],
            ("MYDECIDE_API_KEY",),
            accept=warned("MYDECIDE_API_KEY"),
            expected="serves, with a warning pointing at MYDECIDE_API_KEY",
        )
    )
    # connections
    P.append(custom_probe(env, "concurrent-50", "50 concurrent valid requests", "all 200", _concurrent_50))
    P.append(
        custom_probe(
            env,
            "idle-50",
            "50 idle connections held open, then a normal request",
            "the normal request answers 200",
            _idle_50,
        )
    )
    P.append(
        custom_probe(
            env,
            "disconnect-mid-body",
            "a client sends half its body and disconnects, then a normal request",
            "no 5xx / traceback; the normal request answers 200",
            _disconnect_mid_body,
        )
    )
    P.append(
        custom_probe(
            env,
            "disconnect-before-answer",
            "a client sends a request and closes before the answer (x5), then a normal request",
            "no traceback; the normal request answers 200",
            _disconnect_before_answer,
        )
    )
    P.append(
        custom_probe(
            env,
            "abandoned-queue",
            "40 clients each send 8 questions and reset while some wait in the queue (issue 64: still scored minutes "
            "later), then a normal request",
            "the requests still waiting are not scored (GET /health's count); the normal request answers 200",
            _abandoned_queue,
        )
    )
    P.append(
        custom_probe(env, "pipelined", "two requests in one write (HTTP pipelining)", "both answered 200", _pipelined)
    )
    P.append(
        custom_probe(
            env,
            "slow-drip-headers",
            "a header line every 2 s (background)",
            f"disconnected within {SLOW_LIMIT:g} s",
            lambda c, s: _background_result(env, "slow-drip-headers", c),
        )
    )
    P.append(
        custom_probe(
            env,
            "slow-body",
            "Content-Length 200, one body byte every 2 s (background)",
            f"a 408 within {SLOW_LIMIT:g} s",
            lambda c, s: _background_result(env, "slow-body", c),
        )
    )
    P.append(
        custom_probe(
            env,
            "final-normal",
            "a normal request after everything",
            "200, well formed",
            lambda c, s: (normal_after(c, s), "accepted-ok"),
        )
    )
    return P


def serve_start_probe(
    env: Env,
    cid: str,
    extra: list[str],
    names: tuple[str, ...],
    tolerable: bool = False,
    accept: Callable[[Path, Run], str | None] | None = None,
    expected: str = "",
) -> Probe:
    """``mydecide serve`` with a bad option: it must stop before loading the model, in one line naming it (or, with
    ``accept``, start and pass that check of its output)."""
    args = ["serve", "--model", str(env.llama), "--port", "0", "--device", "cpu", *extra]
    case = Case(
        f"srv-start-{cid}",
        "serve",
        "mydecide serve --model LLAMA --port 0 " + " ".join(extra),
        expected
        or f"refused with one line naming {', '.join(names)}" + (" (or started: tolerable)" if tolerable else ""),
    )
    if tolerable:
        accept = lambda w, r: None  # noqa: E731

    def go(case: Case) -> None:
        env.need("models")
        where = env.case_dir(case.id)
        proc = Proc(args, where)
        started = proc.wait_for("mydecide serve: http", 60)
        if started:  # it accepted the option: stop it (that run counts as exit 0)
            time.sleep(0.5)
            proc.send(signal.SIGINT)
        run = proc.finish(60)
        if started:
            run = Run(0, run.output, run.seconds)
            case.notes.append("it started serving")
        judge_cli(case, run, Expect(case.expected, names=names, accept=accept), where, [])

    return Probe(case, go)


def _concurrent_50(case: Case, server: Server) -> tuple[list[str], str]:
    results: list[Resp] = []
    lock = threading.Lock()

    def one() -> None:
        resp = exchange(server.port, build(body=body_of(NORMAL), port=server.port), "POST", timeout=60)
        with lock:
            results.append(resp)

    threads = [threading.Thread(target=one) for _ in range(50)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    statuses = sorted(str(r.status if r.status is not None else r.error) for r in results)
    case.code = 200 if all(r.status == 200 for r in results) else None
    counts = {s: statuses.count(s) for s in set(statuses)}
    case.output = f"statuses: {counts}; slowest {max(r.seconds for r in results):.2f}s"
    flags = []
    if any(r.error == "timeout" for r in results) or len(results) < 50:
        flags.append("hang")
    if any((r.status is None and r.error != "timeout") or (r.status or 0) >= 500 for r in results):
        flags.append("5xx")
    bad = [r for r in results if r.status == 200 and answers_ok(NORMAL)(json.loads(r.body))]
    if bad:
        flags.append("broken-output")
    return flags + normal_after(case, server), "accepted-ok"


def _idle_50(case: Case, server: Server) -> tuple[list[str], str]:
    socks = [socket.create_connection(("127.0.0.1", server.port), timeout=5) for _ in range(50)]
    try:
        flags = normal_after(case, server)
        case.output = "normal request while 50 idle connections were open: " + ("200" if not flags else str(flags))
    finally:
        for s in socks:
            s.close()
    return flags, "accepted-ok"


def _disconnect_mid_body(case: Case, server: Server) -> tuple[list[str], str]:
    data = build(body=body_of(NORMAL), port=server.port)
    for _ in range(3):
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as s:
            s.sendall(data[: len(data) - 40])
        time.sleep(0.1)
    time.sleep(0.5)
    flags = normal_after(case, server)
    case.output = "3 clients left mid-body; then the normal request: " + ("200" if not flags else str(flags))
    return flags, "accepted-ok"


def _disconnect_before_answer(case: Case, server: Server) -> tuple[list[str], str]:
    data = build(body=body_of(NORMAL), port=server.port)
    for _ in range(5):
        s = socket.create_connection(("127.0.0.1", server.port), timeout=5)
        s.sendall(data)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")  # RST on close
        s.close()
    time.sleep(1.5)
    flags = normal_after(case, server)
    case.output = "5 clients reset before the answer; then the normal request: " + ("200" if not flags else str(flags))
    return flags, "accepted-ok"


def _health(server: Server) -> dict[str, Any]:
    return dict(json.loads(http_request(server.port, "GET", "/health").body))


def _abandoned_queue(case: Case, server: Server) -> tuple[list[str], str]:
    """40 heavy requests; once some wait in the queue (GET /health's pending), every client resets. A request still
    waiting then must not be scored: fewer are scored after the reset than were waiting. When the server was quick
    enough to have nothing waiting, the case cannot judge and says so (a fast server is no fault)."""
    state = " ".join([NORMAL["state"]] * 12)
    heavy = {"state": state, "questions": {f"q{i}": q_noul() for i in range(8)}}
    data = build(body=body_of(heavy), port=server.port)
    before = _health(server)["stats"]["requests"]
    socks = [socket.create_connection(("127.0.0.1", server.port), timeout=5) for _ in range(40)]
    for s in socks:
        s.sendall(data)
    waiting, deadline = 0, time.monotonic() + 5
    while time.monotonic() < deadline and waiting < 10:
        health = _health(server)
        waiting = health["pending"]
    taken = health["stats"]["requests"] - before  # taken into a batch before the clients left
    for s in socks:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")  # RST on close
        s.close()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and _health(server)["pending"]:
        time.sleep(0.1)
    later = _health(server)["stats"]["requests"] - before - taken
    flags = normal_after(case, server)
    case.output = f"40 abandoned: {taken} scored before their clients reset, {waiting} waiting then, {later} after"
    if waiting == 0:
        case.notes.append("nothing was waiting in the queue when the clients left: not judged")
    elif later >= waiting:
        case.notes.append("every request still waiting when its client left was scored")
        flags.append("silent")
    return flags, "accepted-ok"


def _pipelined(case: Case, server: Server) -> tuple[list[str], str]:
    small = {"state": "a", "questions": {"q": q_noul()}}
    one = build(body=body_of(small), port=server.port).replace(b"Connection: close\r\n", b"")
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=REQUEST_TIMEOUT)
    statuses = []
    try:
        sock.sendall(one + one)
        for _ in range(2):
            response = http.client.HTTPResponse(sock, method="POST")
            response.begin()
            response.read()
            statuses.append(response.status)
    except TimeoutError:
        statuses.append("timeout")
    except (http.client.HTTPException, OSError) as err:
        statuses.append(type(err).__name__)
    finally:
        sock.close()
    case.output = f"statuses {statuses}"
    case.code = statuses[-1] if statuses and isinstance(statuses[-1], int) else None
    flags = []
    if "timeout" in statuses:
        flags.append("hang")
    elif statuses != [200, 200]:
        flags.append("5xx" if any(isinstance(s, int) and s >= 500 for s in statuses) else "broken-output")
    return flags + normal_after(case, server), "accepted-ok"


def _slow_drip_headers(port: int) -> dict[str, Any]:
    """Send a request line, then one header line every 2 s; report when the server cut us off."""
    started = time.monotonic()
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    sock.sendall(f"POST {ENDPOINT} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n".encode())
    i = 0
    try:
        while time.monotonic() - started < SLOW_LIMIT + 5:
            readable, _, _ = select.select([sock], [], [], 2.0)
            if readable:
                data = sock.recv(4096)
                return {"cut_after": time.monotonic() - started, "answer": data[:200].decode("latin-1")}
            try:
                sock.sendall(f"X-Drip-{i}: a\r\n".encode())
            except OSError as err:
                return {"cut_after": time.monotonic() - started, "answer": f"send failed: {type(err).__name__}"}
            i += 1
        return {
            "cut_after": None,
            "answer": f"still connected after {time.monotonic() - started:.0f} s ({i} header lines)",
        }
    finally:
        sock.close()


def _slow_body(port: int) -> dict[str, Any]:
    started = time.monotonic()
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    sock.sendall(f"POST {ENDPOINT} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: 200\r\n\r\n".encode())
    sent = 0
    try:
        while time.monotonic() - started < SLOW_LIMIT + 5:
            readable, _, _ = select.select([sock], [], [], 2.0)
            if readable:
                data = sock.recv(4096)
                return {"cut_after": time.monotonic() - started, "answer": data[:300].decode("latin-1")}
            try:
                sock.sendall(b"{" if sent == 0 else b" ")
            except OSError as err:
                return {"cut_after": time.monotonic() - started, "answer": f"send failed: {type(err).__name__}"}
            sent += 1
        return {"cut_after": None, "answer": f"still connected after {time.monotonic() - started:.0f} s ({sent} bytes)"}
    finally:
        sock.close()


def _background_result(env: Env, name: str, case: Case) -> tuple[list[str], str]:
    thread = env.background.get(name)
    if thread is not None:
        thread.join(SLOW_LIMIT + 15)
    result = env.background_results.get(name, {"cut_after": None, "answer": "did not report"})
    case.output = f"{result['answer']}"[:300]
    case.seconds = round(result["cut_after"] or 0.0, 1)
    if result["cut_after"] is None or result["cut_after"] > SLOW_LIMIT:
        case.notes.append(f"not cut off within {SLOW_LIMIT:g} s: {result['answer']}")
        return ["hang"], "handled"
    status = result["answer"].split(" ")[1] if result["answer"].startswith("HTTP/") else None
    case.code = int(status) if status and status.isdigit() else None
    if case.code and case.code >= 500:
        return ["5xx"], "handled"
    case.notes.append(f"cut off after {result['cut_after']:.1f} s")
    return [], "handled"


@contextlib.contextmanager
def serving(env: Env) -> Iterator[None]:
    env.need("models", "data", "run")
    where = env.root / "server"
    where.mkdir(exist_ok=True)
    started = time.monotonic()
    env.server = Server(env.llama, env.adapter, env.temps, where)
    print(f"[setup] {env.server.command} healthy in {time.monotonic() - started:.1f}s", flush=True)
    for name, fn in (("slow-drip-headers", _slow_drip_headers), ("slow-body", _slow_body)):

        def target(name: str = name, fn: Callable[[int], dict[str, Any]] = fn) -> None:
            try:
                env.background_results[name] = fn(env.server.port)  # type: ignore[union-attr]
            except Exception as err:
                env.background_results[name] = {"cut_after": None, "answer": f"probe error {err!r}"}

        env.background[name] = threading.Thread(target=target, daemon=True)
        env.background[name].start()
    try:
        yield
    finally:
        code = env.server.stop()
        log = env.server.log_path.read_text(errors="replace")
        env.setup_log.append(f"server exit {code}; log {len(log)} bytes, {log.count('Traceback')} Traceback(s)")
        print(f"[setup] server stopped (exit {code}); {log.count('Traceback')} Traceback(s) in its log", flush=True)
