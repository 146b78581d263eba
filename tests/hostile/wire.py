"""Raw HTTP on loopback for the serve cases: `mydecide serve` as a subprocess, requests built byte by byte, and one
answer read back."""

from __future__ import annotations

import contextlib
import http.client
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

ENDPOINT = "/v1/systemone"
REQUEST_TIMEOUT = 10.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """``mydecide serve`` of a model, an adapter and temperatures on a free loopback port; its log in ``where``."""

    def __init__(self, model: Path, adapter: Path, temperatures: Path, where: Path):
        self.port = free_port()
        self.log_path = where / "serve.log"
        self.log = open(self.log_path, "w")  # noqa: SIM115
        args = [
            "serve",
            "--model",
            model,
            "--adapter",
            adapter,
            "--temperatures",
            temperatures,
            "--port",
            str(self.port),
            "--device",
            "cpu",
            "--request-timeout",
            "10",
            "--log-level",
            "info",
        ]
        self.command = "mydecide " + " ".join(str(a) for a in args)
        self.popen = subprocess.Popen(
            [sys.executable, "-m", "mydecide.cli", *map(str, args)],
            cwd=where,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        deadline = time.monotonic() + 180
        while True:
            if self.popen.poll() is not None:
                raise RuntimeError(
                    f"mydecide serve exited {self.popen.returncode}: {self.log_path.read_text()[-2000:]}"
                )
            try:
                if http_request(self.port, "GET", "/health", timeout=2).status == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("mydecide serve did not become healthy in 180 s")
            time.sleep(0.3)

    def log_size(self) -> int:
        self.log.flush()
        return self.log_path.stat().st_size

    def log_since(self, offset: int) -> str:
        with open(self.log_path, errors="replace") as f:
            f.seek(offset)
            return f.read()

    def stop(self) -> int | None:
        if self.popen.poll() is None:
            os.kill(self.popen.pid, signal.SIGINT)
            try:
                self.popen.wait(30)
            except subprocess.TimeoutExpired:
                os.kill(self.popen.pid, signal.SIGKILL)
                self.popen.wait()
        self.log.close()
        return self.popen.returncode


@dataclass
class Resp:
    status: int | None  # None: the connection closed without an answer
    body: bytes
    seconds: float
    error: str = ""


def raw_exchange(port: int, data: bytes, method: str = "POST", timeout: float = REQUEST_TIMEOUT) -> Resp:
    """Send ``data`` as it is and read one HTTP answer."""
    started = time.monotonic()
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        # the server may answer (413) and close before the whole body is sent
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(data)
        response = http.client.HTTPResponse(sock, method=method)
        try:
            response.begin()
            body = response.read()
        except (http.client.RemoteDisconnected, ConnectionResetError, http.client.IncompleteRead) as err:
            return Resp(None, b"", time.monotonic() - started, type(err).__name__)
        return Resp(response.status, body, time.monotonic() - started)
    finally:
        sock.close()


def build(
    method: str = "POST",
    path: str = ENDPOINT,
    body: bytes | None = b"",
    headers: Iterable[tuple[str, str]] = (),
    port: int = 0,
    host: str | None = None,
    length: str | None = "auto",
    version: str = "HTTP/1.1",
) -> bytes:
    lines = [f"{method} {path} {version}"]
    if host != "":
        lines.append(f"Host: {host or f'127.0.0.1:{port}'}")
    for name, value in headers:
        lines.append(f"{name}: {value}")
    if length == "auto" and body is not None:
        lines.append(f"Content-Length: {len(body)}")
    elif length not in ("auto", None):
        lines.append(f"Content-Length: {length}")
    lines.append("Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (body or b"")


def http_request(
    port: int,
    method: str,
    path: str,
    body: bytes | None = None,
    headers: Iterable[tuple[str, str]] = (),
    timeout: float = REQUEST_TIMEOUT,
) -> Resp:
    return raw_exchange(port, build(method, path, body, headers, port=port), method, timeout)


def exchange(port: int, data: bytes, method: str, timeout: float = REQUEST_TIMEOUT) -> Resp:
    try:
        return raw_exchange(port, data, method, timeout)
    except TimeoutError:
        return Resp(None, b"", timeout, "timeout")
    except ConnectionRefusedError:
        return Resp(None, b"", 0.0, "connection refused")
