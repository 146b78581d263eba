"""The connection deadlines ``serve`` runs uvicorn with: :class:`RequestDeadlines` bounds how long a client may take to
send a request's line, headers and body (docs/wire.md, Connections)."""

from __future__ import annotations

import asyncio
import json

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

BODY_GRACE_S = 1.0
"""How long after the body timeout :class:`RequestDeadlines` closes a connection whose body is still coming: time for
the app's own 408 to go out first."""


class RequestDeadlines(H11Protocol):
    """uvicorn's h11 protocol with deadlines on reading a request, which uvicorn does not set.

    uvicorn (0.54) closes a connection that stays idle ``timeout_keep_alive`` seconds after an answer, and nothing
    else: every byte received cancels that timer, and none runs before the first request, so a client that sends one
    header line every few seconds holds its connection (and a task's memory) for ever, and so does one that trickles
    a request body after the app has answered without reading it. Here:

    - a request's line and headers must be complete ``header_timeout_s`` after the connection opened, or after the
      previous answer on a kept-alive connection; then the connection is closed, after a 408 when part of a request
      has come (a client mid-request waits for an answer; an idle one is closed without one, as by keep-alive);
    - its body must be complete ``body_timeout_s`` + :data:`BODY_GRACE_S` after its headers, or the connection is
      closed. A body the app is reading gets its 408 (and the connection its close) at ``body_timeout_s`` from
      ``serving.app.read_body``; this closes the connections answered without the body (a 401, 404, 413) it keeps
      coming on.

    While the app is working on a complete request no deadline runs: ``request_timeout_s`` bounds that.
    """

    header_timeout_s: float  # set by with_timeouts
    body_timeout_s: float

    @classmethod
    def with_timeouts(cls, header_timeout_s: float, body_timeout_s: float) -> type[RequestDeadlines]:
        """This protocol with its timeouts set, for ``uvicorn.Config(http=...)`` (which builds one per connection)."""
        return type(cls.__name__, (cls,), {"header_timeout_s": header_timeout_s, "body_timeout_s": body_timeout_s})

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._waiting_for: str | None = None
        self._deadline: asyncio.TimerHandle | None = None
        super().connection_made(transport)
        self._watch()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._watch()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._watch()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        super().connection_lost(exc)

    def _watch(self) -> None:
        """Run the deadline of what the connection now waits for from the client: a request's head, the rest of its
        body, or nothing. It starts when the wait does, so bytes trickling in do not move it."""
        state = self.conn.their_state
        waiting_for = "head" if state is h11.IDLE else "body" if state is h11.SEND_BODY else None
        if waiting_for == self._waiting_for:
            return
        if self._deadline is not None:
            self._deadline.cancel()
        self._waiting_for, self._deadline = waiting_for, None
        if waiting_for is not None:
            delay = self.header_timeout_s if waiting_for == "head" else self.body_timeout_s + BODY_GRACE_S
            self._deadline = self.loop.call_later(delay, self._expire)

    def _expire(self) -> None:
        if self.transport.is_closing():
            return
        if self._waiting_for == "head" and self.conn.trailing_data[0]:
            self._answer_408(f"the request line and headers did not arrive within {self.header_timeout_s:g} s")
        self.transport.close()

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to bytes that are not HTTP (a Content-Length of ``abc``, headers past h11's limit, a
        garbage request line), in the app's own form: a JSON ``{"error": ...}`` body, then the connection closed."""
        self._answer(400, b"Bad Request", f"not a well-formed HTTP/1.1 request ({msg.rstrip('.').lower()})")
        self.transport.close()

    def _answer_408(self, message: str) -> None:
        self._answer(408, b"Request Timeout", message)

    def _answer(self, status: int, reason: bytes, message: str) -> None:
        body = json.dumps({"error": message}).encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", b"%d" % len(body)),
            (b"connection", b"close"),
        ]
        try:
            for event in (
                h11.Response(status_code=status, headers=headers, reason=reason),
                h11.Data(data=body),
                h11.EndOfMessage(),
            ):
                self.transport.write(self.conn.send(event) or b"")
        except h11.LocalProtocolError:  # an answer already begun: closing is all that is left
            pass
