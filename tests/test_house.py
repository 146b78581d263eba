"""The house's rules that numbers can hold (docs/contributing.md): no module of the package over 450 lines, no
function outside mydecide/commands/ over 160 lines, at most 185 recipe keys, and none of the keys that lost their
measurement back in the recipes (docs/LOG.md keeps their runs and the commits that removed them)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "mydecide"
MODULE_LINES, FUNCTION_LINES, RECIPE_KEYS = 450, 160, 185
REMOVED_KEYS = (
    "prompt.continuation",
    "prompt.answer_format",
    "prompt.wording",
    "prompt.list_options",
    "prompt.show_option_ids",
    "prompt.label_form",
    "prompt.span.echo",
    "prompt.span.prior",
    "prompt.span.label_read",
    "prompt.span.label_order",
    "prompt.span.word_read",
    "shuffle_fraction",
    "orders_per_record",
    "shuffle_start",
    "objective.ce_fraction",
    "ray.streaming",
)


def module_lines(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def long_functions(path: Path, limit: int) -> list[str]:
    """``path:line name (N lines)`` of every function or method in ``path`` longer than ``limit`` lines."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [
        f"{path.name}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and node.end_lineno is not None
        and node.end_lineno - node.lineno + 1 > limit
    ]


def recipe_keys(page: str) -> list[str]:
    """The leaf keys of docs/recipes.md's tables (a ``section`` row is not a key of its own)."""
    keys = []
    for line in page.splitlines():
        cells = line.split("|")
        if line.startswith("| `") and len(cells) > 3 and "section" not in cells[2]:
            keys.append(cells[1].strip().strip("`"))
    return keys


def test_no_module_is_over_450_lines() -> None:
    over = [f"{p.relative_to(ROOT)} ({n})" for p in sorted(PACKAGE.rglob("*.py")) if (n := module_lines(p)) > 450]
    assert not over, "split these modules: " + ", ".join(over)


def test_no_function_outside_the_commands_is_over_160_lines() -> None:
    over = [
        found
        for p in sorted(PACKAGE.rglob("*.py"))
        if "commands" not in p.relative_to(PACKAGE).parts
        for found in long_functions(p, FUNCTION_LINES)
    ]
    assert not over, "shorten these functions: " + ", ".join(over)


def test_the_length_checks_see_a_long_function(tmp_path: Path) -> None:
    source = tmp_path / "long.py"
    source.write_text("class A:\n    def f(self):\n" + "        x = 1\n" * 160 + "def g():\n    pass\n")
    assert long_functions(source, FUNCTION_LINES) == ["long.py:2 f (161 lines)"]
    assert module_lines(source) == 164


def test_the_recipes_have_at_most_185_keys() -> None:
    keys = recipe_keys((ROOT / "docs" / "recipes.md").read_text(encoding="utf-8"))
    assert 100 < len(keys) <= RECIPE_KEYS, f"{len(keys)} recipe keys: a key stays only as a default or a trade-off"


@pytest.mark.parametrize("key", REMOVED_KEYS)
def test_a_key_that_lost_is_not_back(key: str) -> None:
    assert key not in recipe_keys((ROOT / "docs" / "recipes.md").read_text(encoding="utf-8"))


def test_recipe_keys_reads_leaf_rows_only() -> None:
    page = "| key | type |\n|---|---|\n| `a` | section |  | x |\n| `a.b` | int | 1 | y |\n| `c` | bool | true | z |\n"
    assert recipe_keys(page) == ["a.b", "c"]
