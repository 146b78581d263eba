"""README's layout tree has one line per file of mydecide/, data_sources/ and bench/, and names no file that is
gone: a new module gets its line, a moved one is not left behind."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
TREES = ("mydecide", "data_sources", "bench")


def layout_paths() -> list[str]:
    """The paths the tree in README's Layout section names (two spaces of indentation per level)."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    block = text.split("## Layout", 1)[1].split("```", 2)[1]
    paths: list[str] = []
    stack: list[str] = []
    for line in block.splitlines():
        if not line.strip():
            continue
        depth = (len(line) - len(line.lstrip(" "))) // 2
        name = line.split()[0]
        stack = [*stack[:depth], name.rstrip("/")]
        if not name.endswith("/"):
            paths.append("/".join(stack))
    return paths


def tracked_files() -> list[str]:
    try:
        out = subprocess.run(
            ["git", "ls-files", *TREES], cwd=REPO, capture_output=True, text=True, timeout=30, check=True
        ).stdout
    except (OSError, subprocess.SubprocessError):
        pytest.skip("not a git checkout")
    return [path for path in out.splitlines() if (REPO / path).is_file()]


def test_every_file_has_its_line_and_every_line_its_file() -> None:
    named = layout_paths()
    assert len(named) == len(set(named)), "a file is listed twice"
    missing = sorted(set(tracked_files()) - set(named))
    assert not missing, f"README's layout tree lacks {missing}"
    gone = sorted(p for p in named if p.startswith(tuple(f"{t}/" for t in TREES)) and not (REPO / p).exists())
    assert not gone, f"README's layout tree names files that do not exist: {gone}"
