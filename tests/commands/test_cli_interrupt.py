"""Ctrl-C is one line, ``interrupted``, and exit status 130, never a traceback: while the command line starts (its
imports), while a command imports torch, and in a running command. SIGINT is sent at a known point, never after a
sleep: a ``sitecustomize`` hook sends it from inside the import of a named module, and a running prepare gets it
while it waits to read its source, a named pipe this test holds open."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from mydecide.cli import INTERRUPTED

EXE = Path(sys.executable).parent / "mydecide"
ENTRY_POINTS = {
    "console script": [str(EXE)],
    "python -m mydecide.cli": [sys.executable, "-m", "mydecide.cli"],
}

# sends SIGINT to its own process when the module named by $INTERRUPT_AT is first imported, and notes that it did
HOOK = """
import os, signal, sys

class InterruptAt:
    def find_spec(self, name, path=None, target=None):
        if name == os.environ.get("INTERRUPT_AT"):
            sys.meta_path.remove(self)
            open(os.environ["INTERRUPT_LOG"], "w").write(name)
            os.kill(os.getpid(), signal.SIGINT)
        return None

sys.meta_path.insert(0, InterruptAt())
"""


def interrupted_at(module: str, command: list[str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """Run ``command`` with SIGINT sent from inside the first import of ``module``; the hook must have fired."""
    (tmp_path / "hook").mkdir(exist_ok=True)
    (tmp_path / "hook" / "sitecustomize.py").write_text(HOOK)
    log = tmp_path / "interrupted_at.txt"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tmp_path / "hook"), os.environ.get("PYTHONPATH", "")]),
        "INTERRUPT_AT": module,
        "INTERRUPT_LOG": str(log),
        "HF_HUB_OFFLINE": "1",
    }
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert log.read_text() == module, result.stderr  # SIGINT did land inside that import
    return result


def assert_interrupted(result: subprocess.CompletedProcess[str]) -> None:
    assert "Traceback" not in result.stderr, result.stderr
    assert (result.returncode, result.stderr) == (INTERRUPTED, "interrupted\n")


@pytest.mark.parametrize("entry", list(ENTRY_POINTS))
@pytest.mark.parametrize("module", ["typer", "pydantic", "mydecide.commands.prepare"])
def test_ctrl_c_while_the_command_line_starts_is_one_line_and_130(entry: str, module: str, tmp_path: Path) -> None:
    if entry == "console script" and not EXE.is_file():
        pytest.skip("the mydecide entry point is not installed next to this interpreter")
    assert_interrupted(interrupted_at(module, [*ENTRY_POINTS[entry], "prepare", "--help"], tmp_path))


def test_ctrl_c_while_a_command_imports_torch_is_one_line_and_130(tmp_path: Path) -> None:
    request = tmp_path / "request.json"
    request.write_text(json.dumps({"state": "s", "questions": {"q": {"type": "noul", "instructions": "Ok?"}}}))
    assert_interrupted(
        interrupted_at("torch", [*ENTRY_POINTS["python -m mydecide.cli"], "predict", str(request)], tmp_path)
    )


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs named pipes")
def test_ctrl_c_in_a_running_prepare_is_one_line_and_130(tmp_path: Path) -> None:
    source = tmp_path / "rows.jsonl"
    os.mkfifo(source)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({"sources": [{"kind": "jsonl", "path": str(source)}]}))
    command = [*ENTRY_POINTS["python -m mydecide.cli"], "prepare", str(recipe), "--out", str(tmp_path / "out")]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    writer = None
    try:
        while writer is None and proc.poll() is None:  # wait for the event: prepare opened its source to read it
            try:
                writer = os.open(source, os.O_WRONLY | os.O_NONBLOCK)
            except OSError:  # ENXIO: no reader yet
                time.sleep(0.01)
        assert writer is not None, proc.communicate()
        proc.send_signal(signal.SIGINT)  # prepare is inside its command now, waiting on the pipe held open here
        _, stderr = proc.communicate(timeout=60)
    finally:
        if writer is not None:
            os.close(writer)
        if proc.poll() is None:
            proc.kill()
    assert "Traceback" not in stderr, stderr
    notice = f"[mydecide] {source} is a named pipe: waiting for its writer (Ctrl-C stops)\n"
    assert (proc.returncode, stderr) == (INTERRUPTED, notice + "interrupted\n")
    assert not (tmp_path / "out").exists()
