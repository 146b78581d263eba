"""Category serve, part 1: hostile HTTP requests to one `mydecide serve` on loopback: methods, paths, bodies,
content types, encodings, headers. serve_fields.py holds the JSON fields; serve_connections.py the connections,
the bad serve limits and the server's start."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from typing import Any

from assets import Env
from harness import Case, Probe
from judge import (
    judge_http,
)
from wire import ENDPOINT, REQUEST_TIMEOUT, build, exchange


def q_noul(text: str = "Is a production system down?") -> dict[str, Any]:
    return {"type": "noul", "instructions": text}


def q_choice(options: Any = ("billing", "engineering", "support")) -> dict[str, Any]:
    return {
        "type": "choice",
        "instructions": "Which team should handle this ticket?",
        "criteria": list(options) if not isinstance(options, dict) else options,
    }


NORMAL = {
    "state": "Checkout returns HTTP 500 for every customer since 09:10. Call Anna Berg at anna@example.se.",
    "questions": {
        "down": q_noul(),
        "team": q_choice({"billing": "Charges", "engineering": "Bugs", "support": "How-to"}),
        "urgency": {
            "type": "score",
            "instructions": "How urgent is it?",
            "criteria": ["not urgent", "soon", "today", "blocking"],
        },
        "labels": {
            "type": "set",
            "instructions": "Which labels apply?",
            "criteria": {"bug": "Broken", "refund": "Money back"},
        },
        "pii": {
            "type": "span",
            "instructions": "Where is personal data?",
            "criteria": {"PERSON": "a name", "EMAIL": "an e-mail"},
        },
    },
}


def body_of(obj: Any) -> bytes:
    return json.dumps(obj).encode()


def answers_ok(request: dict[str, Any]) -> Callable[[dict[str, Any]], str | None]:
    """A 200 answer that has every question, each well formed for its type."""

    def check(answer: dict[str, Any]) -> str | None:
        got = answer.get("answers", {})
        if list(got) != list(request["questions"]):
            return f"answers {list(got)[:5]} != questions {list(request['questions'])[:5]}"
        for name, q in request["questions"].items():
            a = got[name]
            kind = q["type"]
            if kind == "noul" and not 0 <= a.get("noul", -1) <= 1:
                return f"{name}: noul {a.get('noul')}"
            if kind in ("choice", "score"):
                probs = a.get("probabilities", {})
                if abs(sum(probs.values()) - 1) > 1e-3:
                    return f"{name}: probabilities sum to {sum(probs.values())}"
            if kind == "set" and set(a.get("probabilities", {})) != set(q["criteria"]):
                return f"{name}: set labels {list(a.get('probabilities', {}))}"
            if kind == "span" and not isinstance(a.get("spans"), list):
                return f"{name}: no spans list"
        return None

    return check


def http_probe(
    env: Env,
    cid: str,
    what: str,
    make: Callable[[int], bytes],
    *,
    refuse_ok: bool = True,
    accept: Callable[[dict], str | None] | None = None,
    method: str = "POST",
    expected: str = "",
    closed_ok: bool = False,
    timeout: float = REQUEST_TIMEOUT,
) -> Probe:
    case = Case(
        f"srv-{cid}",
        "serve",
        what,
        expected or ('a 4xx {"error": ...} under 2 kB' if accept is None else "200, well formed"),
    )

    def go(case: Case) -> None:
        server = env.server
        assert server is not None
        offset = server.log_size()
        resp = exchange(server.port, make(server.port), method, timeout)
        time.sleep(0.05)
        judge_http(case, resp, refuse_ok=refuse_ok, accept=accept, server=server, log_from=offset, closed_ok=closed_ok)

    return Probe(case, go)


def post(
    obj: Any = None,
    raw: bytes | None = None,
    headers: Iterable[tuple[str, str]] = (),
    path: str = ENDPOINT,
    length: str | None = "auto",
) -> Callable[[int], bytes]:
    data = raw if raw is not None else body_of(obj)
    return lambda port: build("POST", path, data, headers, port=port, length=length)


def change(**top: Any) -> dict[str, Any]:
    return {**NORMAL, **top}


def one(q: Any, state: Any = "The checkout page fails.") -> dict[str, Any]:
    return {"state": state, "questions": {"q": q}}


def request_probes(env: Env) -> list[Probe]:
    """Methods, paths, /health and bodies."""
    P: list[Probe] = []
    ok = answers_ok

    def add(cid: str, what: str, make: Callable[[int], bytes], **kw: Any) -> None:
        P.append(http_probe(env, cid, what, make, **kw))

    def bad(cid: str, what: str, obj: Any) -> None:
        add(cid, what, post(obj))

    # methods and paths
    for method in ("GET", "PUT", "DELETE", "PATCH", "OPTIONS", "FOO"):
        add(
            f"method-{method.lower()}",
            f"{method} {ENDPOINT}",
            lambda port, m=method: build(m, ENDPOINT, b"", port=port),
            method=method,
        )
    add("method-head", f"HEAD {ENDPOINT}", lambda port: build("HEAD", ENDPOINT, None, port=port), method="HEAD")
    add(
        "trailing-slash",
        f"POST {ENDPOINT}/ (valid body)",
        post(NORMAL, path=ENDPOINT + "/"),
        accept=ok(NORMAL),
        refuse_ok=False,
    )
    add(
        "query-string",
        f"POST {ENDPOINT}?debug=1 (valid body)",
        post(NORMAL, path=ENDPOINT + "?debug=1"),
        accept=ok(NORMAL),
        refuse_ok=True,
        expected="200 (the query ignored) or a 4xx",
    )
    add("path-case", "POST /v1/SystemOne", post(NORMAL, path="/v1/SystemOne"))
    add("path-double-slash", f"POST {ENDPOINT}//", post(NORMAL, path=ENDPOINT + "//"))
    add("path-root", "POST /", post(NORMAL, path="/"))
    add(
        "path-traversal",
        "GET /../../etc/passwd",
        lambda port: build("GET", "/../../etc/passwd", b"", port=port),
        method="GET",
    )
    add("path-nul", "GET /%00", lambda port: build("GET", "/%00", b"", port=port), method="GET")
    add("path-10kb", "GET a 10 kB path", lambda port: build("GET", "/" + "a" * 10_000, b"", port=port), method="GET")
    add(
        "health",
        "GET /health",
        lambda port: build("GET", "/health", b"", port=port),
        method="GET",
        accept=lambda a: None if a.get("status") == "ok" else "status not ok",
        refuse_ok=False,
    )
    add("health-post", "POST /health", post({}, path="/health"))
    # bodies
    add(
        "no-body",
        "POST without a body or Content-Length",
        lambda port: build("POST", ENDPOINT, None, port=port, length=None),
    )
    add("empty-body", "POST with Content-Length: 0", post(raw=b""))
    add("not-json", "body 'hello'", post(raw=b"hello"))
    add("json-array", "body []", post([]))
    add("json-string", 'body "x"', post("x"))
    add("json-null", "body null", post(None, raw=b"null"))
    add("json-number", "body 1", post(1))
    add("truncated-json", "body '{\"state\": '", post(raw=b'{"state": '))
    add("huge-body", "a 2 MB body (limit 1 MB)", post(raw=b'{"state": "' + b"x" * 2_000_000 + b'"}'), expected="413")
    add(
        "declared-huge",
        "Content-Length: 10000000 with a small body",
        post(raw=b"{}", length="10000000"),
        expected="413",
    )
    add("length-abc", "Content-Length: abc", post(raw=b"{}", length="abc"), closed_ok=True)
    add("length-negative", "Content-Length: -1", post(raw=b"{}", length="-1"), closed_ok=True)
    add("deep-array", "100,000 '[' as the body", post(raw=b"[" * 100_000))
    add(
        "deep-state",
        "a state object nested 5,000 deep",
        post(
            raw=b'{"questions": {"q": {"type": "noul", "instructions": "x"}}, "state": '
            + b'{"a": ' * 5000
            + b'"x"'
            + b"}" * 5000
            + b"}"
        ),
    )
    add("utf16-body", "the normal body in UTF-16", post(raw=json.dumps(NORMAL).encode("utf-16")))
    add("utf8-bom-body", "the normal body with a UTF-8 BOM", post(raw=b"\xef\xbb\xbf" + body_of(NORMAL)))
    add(
        "latin1-body",
        "a body with a Latin-1 byte (invalid UTF-8)",
        post(raw=body_of(NORMAL).replace(b"Checkout", b"Ch\xe9ckout")),
    )
    return P


def header_probes(env: Env) -> list[Probe]:
    """Content types, encodings, Host and oversized headers, a garbage request line."""
    P: list[Probe] = []
    ok = answers_ok

    def add(cid: str, what: str, make: Callable[[int], bytes], **kw: Any) -> None:
        P.append(http_probe(env, cid, what, make, **kw))

    def bad(cid: str, what: str, obj: Any) -> None:
        add(cid, what, post(obj))

    add(  # issue 64: what a web page can send without a CORS preflight is not JSON to the server
        "content-type-text",
        "Content-Type: text/plain (valid body)",
        post(NORMAL, headers=[("Content-Type", "text/plain")]),
        expected="415",
    )
    add(
        "content-type-form",
        "Content-Type: application/x-www-form-urlencoded (valid body: curl -d without -H)",
        post(NORMAL, headers=[("Content-Type", "application/x-www-form-urlencoded")]),
        expected="415",
    )
    add(
        "origin-evil",
        "Origin: https://evil.example (a web page spending the server's CPU through its visitor's browser)",
        post(NORMAL, headers=[("Origin", "https://evil.example"), ("Content-Type", "application/json")]),
        expected="403",
    )
    add(
        "charset-latin1",
        "Content-Type: application/json; charset=latin-1",
        post(NORMAL, headers=[("Content-Type", "application/json; charset=latin-1")]),
        expected="415",
    )
    add(
        "charset-utf8-quoted",
        'Content-Type: application/json; charset="UTF-8"',
        post(NORMAL, headers=[("Content-Type", 'application/json; charset="UTF-8"')]),
        accept=ok(NORMAL),
        refuse_ok=False,
    )
    add(
        "gzip",
        "Content-Encoding: gzip (body not compressed)",
        post(NORMAL, headers=[("Content-Encoding", "gzip")]),
        expected="415",
    )
    add(
        "chunked",
        "Transfer-Encoding: chunked (valid body)",
        lambda port: build(
            "POST",
            ENDPOINT,
            b"%x\r\n%s\r\n0\r\n\r\n" % (len(body_of(NORMAL)), body_of(NORMAL)),
            [("Transfer-Encoding", "chunked")],
            port=port,
            length=None,
        ),
        accept=ok(NORMAL),
        refuse_ok=False,
    )
    add(
        "expect-continue",
        "Expect: 100-continue (valid body)",
        post(NORMAL, headers=[("Expect", "100-continue")]),
        accept=ok(NORMAL),
        refuse_ok=False,
    )
    add(
        "auth-header-unneeded",
        "an Authorization header to a server without a key",
        post(NORMAL, headers=[("Authorization", "Bearer x")]),
        accept=ok(NORMAL),
        refuse_ok=True,
        expected="200 (ignored) or 401",
    )
    add(
        "host-evil",
        "Host: evil.example (DNS rebinding)",
        lambda port: build("POST", ENDPOINT, body_of(NORMAL), port=port, host="evil.example"),
        expected="400",
    )
    add(
        "host-missing-http10",
        "HTTP/1.0 request without a Host header",
        lambda port: build("POST", ENDPOINT, body_of(NORMAL), port=port, host="", version="HTTP/1.0"),
        accept=ok(NORMAL),
        expected="400 (no allowed Host) or 200",
    )
    add(
        "header-100kb",
        "a 100 kB header value (tolerable either way)",
        post(NORMAL, headers=[("X-Big", "a" * 100_000)]),
        closed_ok=True,
        accept=ok(NORMAL),
        expected="431 / 400, or 200",
    )
    add(
        "headers-4mb",
        "4 MB of headers (64 x 64 kB; the body limit is 1 MB)",
        post(NORMAL, headers=[(f"X-Big-{i}", "a" * 65_536) for i in range(64)]),
        closed_ok=True,
        expected="431 / 400 or closed",
    )
    add(
        "headers-1000",
        "1,000 headers",
        post(NORMAL, headers=[(f"X-H{i}", "v") for i in range(1000)]),
        closed_ok=True,
        accept=ok(NORMAL),
        expected="431/400, or 200",
    )
    add("request-line-garbage", "a request line of garbage", lambda port: b"GARBAGE\r\n\r\n", closed_ok=True)
    return P
