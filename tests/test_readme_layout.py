"""README's Layout section matches the tree: it names every top-level folder and every module and package of
mydecide/, every path it names exists, and it stays within MAX_LINES (folders plus mydecide/'s modules, not every
file). A new module gets its line, a moved one is not left behind."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
MAX_LINES = 70


def layout_section(readme: str) -> str:
    """The Layout section: from its heading up to the next one, trailing blank lines left out."""
    after = readme.split("\n## Layout\n", 1)[1]
    return ("## Layout\n" + re.split(r"^## ", after, maxsplit=1, flags=re.M)[0]).rstrip("\n")


def layout_paths(readme: str) -> list[str]:
    """The paths the tree in the Layout section names, folders ending in '/'.

    A line is NAMES, two or more spaces, a description; NAMES is one name or several on one line (related modules
    that share a description). Two spaces of indentation per level; a line holding one folder opens that level.
    """
    block = layout_section(readme).split("```", 2)[1]
    paths: list[str] = []
    stack: list[str] = []
    for line in block.splitlines():
        if not line.strip():
            continue
        depth = (len(line) - len(line.lstrip(" "))) // 2
        assert depth <= len(stack), f"README layout: {line.strip()!r} is indented deeper than its folder"
        assert re.search(r"\S\s{2,}\S", line), (
            f"README layout: {line.strip()!r} needs two spaces before its description"
        )
        names = re.split(r"\s{2,}", line.strip(), maxsplit=1)[0].split(" ")
        parents = stack[:depth]
        for name in names:
            paths.append("/".join([*parents, name.rstrip("/")]) + ("/" if name.endswith("/") else ""))
        stack = [*parents, names[0].rstrip("/")] if len(names) == 1 and names[0].endswith("/") else parents
    return paths


def layout_problems(readme: str, files: set[str]) -> list[str]:
    """What is wrong with README's layout against the repository's files (paths relative to its root)."""
    problems = []
    lines = layout_section(readme).count("\n") + 1
    if lines > MAX_LINES:
        problems.append(
            f"the Layout section is {lines} lines, more than {MAX_LINES}: list folders, not their files, "
            "and put related mydecide/ modules on one line"
        )
    named = layout_paths(readme)
    problems += [f"{path} is listed twice" for path in sorted({p for p in named if named.count(p) > 1})]
    folders = {str(parent) + "/" for path in files for parent in Path(path).parents if str(parent) != "."}
    problems += [f"{path} is listed but does not exist" for path in named if path not in files | folders]
    modules = {path for path in files if path.startswith("mydecide/") and path.endswith(".py")}
    wanted = {path for path in modules if not path.endswith("/__init__.py")}
    wanted |= {path.removesuffix("__init__.py") for path in modules if path.endswith("/__init__.py")}
    wanted |= {path.split("/", 1)[0] + "/" for path in files if "/" in path}
    problems += [f"{path} has no line in the layout" for path in sorted(wanted - set(named))]
    return problems


def repository_files() -> set[str]:
    """Tracked files and new files git does not ignore, that are on disk."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        pytest.skip("not a git checkout")
    return {path for path in out.splitlines() if (REPO / path).is_file()}


@pytest.fixture(scope="module")
def readme() -> str:
    return (REPO / "README.md").read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def files() -> set[str]:
    return repository_files()


def test_the_layout_matches_the_tree(readme: str, files: set[str]) -> None:
    assert layout_problems(readme, files) == []


def test_a_module_or_folder_without_a_line_is_caught(readme: str, files: set[str]) -> None:
    added = files | {"mydecide/training/model_new.py", "mydecide/newpkg/__init__.py", "tools/make_thing.py"}
    assert layout_problems(readme, added) == [
        "mydecide/newpkg/ has no line in the layout",
        "mydecide/training/model_new.py has no line in the layout",
        "tools/ has no line in the layout",
    ]
    without_rows = "\n".join(line for line in readme.splitlines() if not line.startswith("    rows.py "))
    assert layout_problems(without_rows, files) == ["mydecide/evaluation/rows.py has no line in the layout"]
    grouped = readme.replace("    objectives.py scoring_rules.py  ", "    objectives.py  ")
    assert layout_problems(grouped, files) == ["mydecide/training/scoring_rules.py has no line in the layout"]


def test_a_line_for_a_path_that_is_gone_is_caught(readme: str, files: set[str]) -> None:
    assert layout_problems(readme, files - {"mydecide/demo.py"}) == ["mydecide/demo.py is listed but does not exist"]
    moved = readme.replace("\n  merging.py ", "\n  serving/merging.py ", 1)
    assert "mydecide/serving/merging.py is listed but does not exist" in layout_problems(moved, files)


def test_the_section_stays_short(readme: str, files: set[str]) -> None:
    assert layout_section(readme).count("\n") + 1 <= MAX_LINES
    longer = readme.replace("## Layout\n", "## Layout\n" + "a line of prose\n" * 10, 1)
    assert any("more than 70" in problem for problem in layout_problems(longer, files))
