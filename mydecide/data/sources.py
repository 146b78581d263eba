"""Converter discovery: the modules of the ``data_sources`` package are the sources (no list to keep in sync).

A source's name (its ``kind`` in a recipe) is its module name; its description is the first line of the
module's docstring. Listing reads the docstrings without importing the modules, so a converter with a heavy
or broken import does not break ``--list-sources``.
"""

from __future__ import annotations

import ast
import importlib
import pkgutil
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from mydecide.errors import UserError

PACKAGE = "data_sources"


class UnknownSourceError(UserError):
    """A recipe names a source kind that is not a module in ``data_sources/``."""


@dataclass(frozen=True)
class SourceInfo:
    name: str
    description: str
    path: Path


def _package_dirs() -> list[str]:
    package = importlib.import_module(PACKAGE)
    return list(package.__path__)


def available_sources() -> list[SourceInfo]:
    """Every public converter module (name without a leading underscore), sorted by name."""
    found: dict[str, SourceInfo] = {}
    for module in pkgutil.iter_modules(_package_dirs()):
        if module.name.startswith("_") or module.ispkg:
            continue
        spec = module.module_finder.find_spec(module.name, None)  # type: ignore[call-arg]
        if spec is None or spec.origin is None:
            continue
        path = Path(spec.origin)
        found.setdefault(module.name, SourceInfo(module.name, _first_doc_line(path), path))
    return [found[name] for name in sorted(found)]


def _first_doc_line(path: Path) -> str:
    try:
        doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")))
    except (OSError, SyntaxError, ValueError) as err:
        return f"(cannot read the docstring: {err})"
    if not doc:
        return "(no description)"
    return doc.strip().splitlines()[0].strip()


def source_names() -> list[str]:
    return [info.name for info in available_sources()]


def load_source(kind: str) -> ModuleType:
    """The converter module for ``kind``; an unknown kind is an error listing the known ones."""
    names = source_names()
    if kind not in names:
        raise UnknownSourceError(f"unknown source kind {kind!r}; known kinds: {', '.join(names)}")
    module = importlib.import_module(f"{PACKAGE}.{kind}")
    if not callable(getattr(module, "convert", None)):
        raise UnknownSourceError(f"source {kind!r} ({module.__file__}) has no convert() function")
    return module


def format_sources(infos: list[SourceInfo]) -> str:
    """The table printed by ``mydecide prepare --list-sources``."""
    width = max((len(info.name) for info in infos), default=0)
    return "\n".join(f"{info.name:<{width}}  {info.description}" for info in infos)
