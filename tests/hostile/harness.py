"""The hostile-input probe's harness: the case record, what a case expects, and running a command (in this
process with typer's CliRunner, or as a subprocess) with snapshots of every file around it. The category modules
build `Probe`s on it; probe.py runs them (its docstring says how)."""

from __future__ import annotations

import fnmatch
import hashlib
import os
import resource
import signal
import stat
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # mydecide is imported from this checkout

SMOKE = ROOT / "recipes" / "train" / "smoke.yaml"
CLI_TIMEOUT = 60.0

# worst first: a case's outcome is the first of its flags in this order
BAD_CLASSES = [
    "probe-error",
    "hang",
    "data-lost",
    "traceback",
    "5xx",
    "broken-output",
    "silent",
    "multi-line",
    "vague",
    "refused-valid",
]
CLASSES = ["handled", "accepted-ok", *[c for c in BAD_CLASSES if c != "probe-error"], "probe-error"]

CATEGORIES = {
    "prepare-inputs": "malformed data recipes, sources and rows given to `prepare`",
    "outputs": "--out pointed at inputs, the data / adapter / model directories, '.', '..', user files",
    "interrupts": "SIGINT / SIGTERM / SIGKILL of prepare, train, evaluate, calibrate, then a rerun",
    "concurrency": "two or three commands into one output directory at once",
    "resume-adapters": "train --resume on wrong runs; damaged adapters; another base; calibrate on train data",
    "serve": "hostile HTTP requests to `mydecide serve` on loopback; bad serve limits",
}


# ------------------------------------------------------------------------------------------------ the case record


@dataclass
class Case:
    id: str
    category: str
    did: str  # the command line, or the request
    expected: str
    outcome: str = "not-run"
    flags: list[str] = field(default_factory=list)
    code: int | None = None  # exit status, or HTTP status
    size: int | None = None  # HTTP: response body bytes
    seconds: float = 0.0
    output: str = ""  # the first 300 characters of what it printed / answered
    output_tail: str = ""  # and the last 300 (a summary line comes last)
    notes: list[str] = field(default_factory=list)

    def finish(self, flags: Iterable[str], good: str) -> None:
        self.flags = sorted(set(flags), key=BAD_CLASSES.index)
        self.outcome = self.flags[0] if self.flags else good


@dataclass
class Probe:
    case: Case
    run: Callable[[Case], None]


@dataclass
class Expect:
    """What a case should do. ``refuse``: a one-line refusal is right. ``accept(dir, run)``: exit 0 is right when it
    returns None (else the problem); None: exit 0 is wrong. ``names``: what the error line must contain.
    ``bad_input``: exit 0 with a failing check is 'silent' (the input was bad) rather than 'broken-output'."""

    text: str
    refuse: bool = True
    accept: Callable[[Path, Run], str | None] | None = None
    names: tuple[str, ...] = ()
    bad_input: bool = True


# ------------------------------------------------------------------------------------------------ running commands


@dataclass
class Run:
    code: int | None  # exit status; None when it did not end in time
    output: str  # stdout and stderr, interleaved
    seconds: float
    timed_out: bool = False


class CaseTimeout(BaseException):
    """Raised by SIGALRM inside an in-process command that runs past its timeout (BaseException: nothing catches it)."""


def _alarm(signum: int, frame: Any) -> None:
    raise CaseTimeout()


def cli(args: list[str], cwd: Path, timeout: float = CLI_TIMEOUT) -> Run:
    """``mydecide ARGS`` in this process (typer's CliRunner), in ``cwd``."""
    from typer.testing import CliRunner

    from mydecide.cli import app

    old = os.getcwd()
    os.chdir(cwd)
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, timeout)
    started = time.monotonic()
    try:
        result = CliRunner().invoke(app, [str(a) for a in args], catch_exceptions=True)
    except CaseTimeout:
        return Run(None, "", time.monotonic() - started, timed_out=True)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        os.chdir(old)
    text = result.output
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        text += "".join(traceback.format_exception(result.exception))
    return Run(result.exit_code, text, time.monotonic() - started)


class Proc:
    """``python -m mydecide.cli ARGS`` as a subprocess, its output (stdout + stderr) read line by line."""

    def __init__(self, args: list[str], cwd: Path, memory_gb: float | None = None, env: dict | None = None):
        def limits() -> None:
            if memory_gb:
                size = int(memory_gb * 2**30)
                resource.setrlimit(resource.RLIMIT_AS, (size, size))

        self.args = [str(a) for a in args]
        self.started = time.monotonic()
        self.popen = subprocess.Popen(
            [sys.executable, "-m", "mydecide.cli", *self.args],
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            errors="replace",
            start_new_session=True,  # our own Ctrl-C never reaches it; we signal it by pid only
            preexec_fn=limits if memory_gb else None,
            env=env,
        )
        self.lines: list[str] = []
        self._changed = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            with self._changed:
                self.lines.append(line)
                self._changed.notify_all()
        with self._changed:
            self._changed.notify_all()

    def wait_for(self, text: str | None, timeout: float) -> bool:
        """Until a line containing ``text`` (any line when None) was printed; False if it ended or timed out first."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                if any(text is None or text in line for line in self.lines):
                    return True
                if self.popen.poll() is not None and not self._reader.is_alive():
                    return False
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._changed.wait(min(left, 0.1))

    def send(self, sig: int) -> bool:
        if self.popen.poll() is None:
            os.kill(self.popen.pid, sig)
            return True
        return False

    def finish(self, timeout: float = CLI_TIMEOUT) -> Run:
        try:
            self.popen.wait(timeout)
            timed_out = False
        except subprocess.TimeoutExpired:
            os.kill(self.popen.pid, signal.SIGKILL)
            self.popen.wait()
            timed_out = True
        self._reader.join(5)
        code = None if timed_out else self.popen.returncode
        return Run(code, "".join(self.lines), time.monotonic() - self.started, timed_out)


def run_proc(args: list[str], cwd: Path, timeout: float = CLI_TIMEOUT, memory_gb: float | None = None) -> Run:
    return Proc(args, cwd, memory_gb=memory_gb).finish(timeout)


# ------------------------------------------------------------------------------------------------ file snapshots


def snapshot(root: Path) -> dict[str, str]:
    """relative path → mode and sha256 (a link: its target; unreadable: size and mtime) of everything under root."""
    seen: dict[str, str] = {}
    if not root.exists():
        return seen
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False, onerror=lambda e: None):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            rel = str(path.relative_to(root))
            try:
                st = os.lstat(path)
            except OSError:
                continue
            mode = f"{stat.S_IMODE(st.st_mode):o}"
            if stat.S_ISLNK(st.st_mode):
                seen[rel] = "link:" + os.readlink(path)
            elif stat.S_ISDIR(st.st_mode):
                seen[rel] = f"dir:{mode}"
            elif stat.S_ISREG(st.st_mode):
                try:
                    digest = hashlib.sha256(path.read_bytes()).hexdigest()
                except OSError:
                    digest = f"unreadable:{st.st_size}:{st.st_mtime_ns}"
                seen[rel] = f"file:{mode}:{digest}"
            else:
                seen[rel] = f"special:{mode}"
    return seen


def owned_by(rel: str, owned: Iterable[str]) -> bool:
    return any(rel == p or rel.startswith(p.rstrip("/") + "/") or fnmatch.fnmatch(rel, p) for p in owned)


def lost_files(before: dict[str, str], after: dict[str, str], owned: Iterable[str] = ()) -> list[str]:
    owned = list(owned)
    return [k for k, v in before.items() if not owned_by(k, owned) and after.get(k) != v]


def new_files(before: dict[str, str], after: dict[str, str], owned: Iterable[str] = ()) -> list[str]:
    owned = list(owned)
    return [k for k in after if k not in before and not owned_by(k, owned) and not k.endswith(".lock")]
