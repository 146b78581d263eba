"""Atomic file writes and run provenance (resolved recipe, package versions, git commit)."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from importlib import metadata
from pathlib import Path
from typing import Any

TRACKED_PACKAGES = ("mydecide", "torch", "transformers", "peft", "accelerate", "datasets", "datasketch")


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` so that readers never see a half-written file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)  # mkstemp creates 0600; outputs get the usual permissions
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_json(path: str | Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, ensure_ascii=False, default=str) + "\n")


def package_versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {}
    for name in TRACKED_PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def git_commit() -> str | None:
    """The commit of the checkout this package runs from (None outside a git checkout)."""
    here = Path(__file__).resolve().parent
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def provenance() -> dict[str, Any]:
    return {"versions": package_versions(), "git_commit": git_commit()}
