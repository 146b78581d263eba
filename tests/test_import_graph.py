"""The import graph of mydecide: no cycle among its modules, and no lower layer importing a higher one.

Every module under mydecide/ is parsed with ``ast``; its imports of mydecide modules are collected wherever they
stand (module level and inside functions: a function-local import is still a dependency, only a later one). No
cycle is allowed even through imports under ``if TYPE_CHECKING:``: a reader cannot read two modules that name each
other's types in order either. The layer check leaves those out: they never run, and annotations may name any
layer's types.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "mydecide"

LAYERS: list[tuple[str, ...]] = [
    # 0. foundations: files, JSONL, the manifest, numbers
    ("mydecide", "mydecide.io", "mydecide.jsonl", "mydecide.manifest", "mydecide.metrics"),
    # 1. the record format
    ("mydecide.records", "mydecide.record_files", "mydecide.spans"),
    # 2. the recipes: how a question is shown (the prompt section, a RenderConfig) and every command's recipe
    ("mydecide.prompt", "mydecide.data_recipe", "mydecide.config", "mydecide.recipe_loading", "mydecide.recipe_docs"),
    # 3. prepare: sources, dedup, splits
    ("mydecide.data",),
    # 4. the scoring layer, on a loaded model (scoring.model.LoadedModel)
    ("mydecide.scoring",),
    # 5. loading that model: a base, a tokenizer and an adapter
    ("mydecide.modeling", "mydecide.hub"),
    # 6. what is built on scoring: temperatures, evaluation, merging an adapter (and exporting it as a GGUF)
    (
        "mydecide.calibration",
        "mydecide.evaluation",
        "mydecide.merging",
        "mydecide.gguf_export",
        "mydecide.gguf_tensors",
    ),
    # 7. training (its dev metrics use evaluation's majority baseline)
    ("mydecide.training",),
    # 8. the server
    ("mydecide.serving",),
    # 9. the command line
    ("mydecide.commands", "mydecide.cli", "mydecide.demo", "mydecide.api"),
]
"""Lowest first. A module belongs to the layer of its longest listed prefix (``mydecide.records`` is not
``mydecide``'s); a module may import its own layer and the layers below."""

HEAVY = ("torch", "transformers", "peft", "scipy", "matplotlib")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def all_modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST, type_checking: bool) -> list[ast.Import | ast.ImportFrom]:
    """The import statements of ``tree``; those under ``if TYPE_CHECKING:`` only with ``type_checking``."""
    found: list[ast.Import | ast.ImportFrom] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node) and not type_checking:
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def imports_of(name: str, path: Path, modules: dict[str, Path], type_checking: bool = False) -> set[str]:
    """The mydecide modules ``name`` imports at run time, and with ``type_checking`` also under ``if TYPE_CHECKING:``
    (``from a import b`` counts a.b when b is a module)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in _imports(ast.parse(path.read_text(encoding="utf-8")), type_checking):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
        for target in targets:
            while target and target not in modules:  # `import mydecide.x.y` names a module; strip attributes
                target = target.rpartition(".")[0]
            if target.startswith("mydecide") and target != name:
                out.add(target)
    return out


def import_graph(type_checking: bool = False) -> dict[str, set[str]]:
    modules = all_modules()
    return {name: imports_of(name, path, modules, type_checking) for name, path in modules.items()}


def layer_of(name: str) -> int:
    best, layer = -1, -1
    for n, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if (name == prefix or name.startswith(prefix + ".")) and len(prefix) > best:
                best, layer = len(prefix), n
    if layer < 0:
        raise AssertionError(f"{name}: in no layer of tests/test_import_graph.py's LAYERS; add it there")
    return layer


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return found


def test_the_graph_is_read_from_the_code(tmp_path: Path) -> None:
    graph = import_graph()
    assert "mydecide.scoring.engine" in graph["mydecide.evaluation.run"]
    assert {"mydecide.scoring.plan", "mydecide.scoring.forward"} <= graph["mydecide.scoring.engine"]
    # function-local imports count, TYPE_CHECKING ones do not, `from package import module` names the module
    source = tmp_path / "probe.py"
    source.write_text(
        "from typing import TYPE_CHECKING\n"
        "from mydecide import metrics\n"
        "if TYPE_CHECKING:\n"
        "    from mydecide.modeling import LoadedModel\n"
        "def f():\n"
        "    from mydecide.scoring.forward import score_prompts\n"
        "    import mydecide.records\n"
    )
    found = imports_of("mydecide.probe", source, all_modules())
    assert found == {"mydecide.metrics", "mydecide.scoring.forward", "mydecide.records"}
    typed = imports_of("mydecide.probe", source, all_modules(), type_checking=True)
    assert typed == found | {"mydecide.modeling"}


def test_cycle_detection_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_among_mydecide_modules() -> None:
    found = cycles(import_graph(type_checking=True))  # a cycle through annotations only is a cycle too
    assert not found, "import cycles: " + "; ".join(" ⇄ ".join(c) for c in found)


def test_no_lower_layer_imports_a_higher_one() -> None:
    upward = [
        f"{name} (layer {layer_of(name)}) imports {target} (layer {layer_of(target)})"
        for name, targets in sorted(import_graph().items())
        for target in sorted(targets)
        if layer_of(target) > layer_of(name)
    ]
    assert not upward, "upward imports:\n" + "\n".join(upward)


@pytest.mark.parametrize("modules", ["mydecide.commands.prepare, mydecide.data.prepare", "mydecide.config"])
def test_the_prepare_path_imports_no_heavy_package(modules: str) -> None:
    # `mydecide --help` has its own test (tests/commands/test_cli.py); prepare and recipe validation must stay light too
    script = f"import sys\nimport {modules}\nprint(sorted(m for m in {HEAVY!r} if m in sys.modules))\n"
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
