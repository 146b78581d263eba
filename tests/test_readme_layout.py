"""README's layout: its first screen is the set-up commands and the link to the manual (docs/guide.md), the demo's
tables live in docs/demo.md (the README keeps one short table and the link), and its Layout section matches the
tree: it names every top-level folder and every module and package of mydecide/, every path it names exists, and it
stays within MAX_LINES (folders plus mydecide/'s modules, not every file). A new module gets its line, a moved one is
not left behind."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
MAX_LINES = 70
FIRST_SCREEN = 15  # lines
SETUP = ["make install && make demo", "make test"]
MAX_TABLE_ROWS = 5


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


def front_problems(readme: str) -> list[str]:
    """What is wrong with the README's front: the set-up commands first, the manual named on the first screen, no
    table longer than MAX_TABLE_ROWS (the demo's tables are in docs/demo.md, which the README links)."""
    problems = []
    screen = readme.splitlines()[:FIRST_SCREEN]
    fences = [i for i, line in enumerate(screen) if line.startswith("```")]
    commands = [line.split("#", 1)[0].strip() for line in screen[fences[0] + 1 : fences[1]]] if len(fences) > 1 else []
    if commands != SETUP:
        problems.append(f"the first code block is not {' then '.join(SETUP)}: {commands}")
    guide = [i for i, line in enumerate(screen) if "[docs/guide.md](docs/guide.md)" in line]
    if not guide:
        problems.append(f"the first {FIRST_SCREEN} lines do not link docs/guide.md")
    elif fences and guide[0] < fences[0]:
        problems.append("docs/guide.md is linked before the set-up commands")
    rows = 0
    for line in [*readme.splitlines(), ""]:
        if line.startswith("|"):
            rows += 1
        elif rows:
            if rows - 2 > MAX_TABLE_ROWS:  # the header and its separator are not rows
                problems.append(f"a table of {rows - 2} rows: more than {MAX_TABLE_ROWS} belong in docs/demo.md")
            rows = 0
    if "[docs/demo.md](docs/demo.md)" not in readme:
        problems.append("the README does not link docs/demo.md")
    return problems


def repository_files() -> set[str]:
    """Tracked files and new files git does not ignore, that are on disk (a link counts as a file: recipes)."""
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
    return {path for path in out.splitlines() if (REPO / path).is_file() or (REPO / path).is_symlink()}


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


def test_the_front_is_the_set_up_and_the_manual(readme: str) -> None:
    assert front_problems(readme) == []


def test_a_front_that_buries_the_manual_or_the_set_up_is_caught(readme: str) -> None:
    guide = "Start with [docs/guide.md](docs/guide.md): your own data through every command.\n"
    assert guide in readme
    buried = readme.replace(guide, "", 1).replace("## The command line", guide + "\n## The command line", 1)
    assert front_problems(buried) == [f"the first {FIRST_SCREEN} lines do not link docs/guide.md"]
    swapped = readme.replace("make install && make demo   #", "make all   #", 1)
    assert front_problems(swapped) == [
        "the first code block is not make install && make demo then make test: ['make all', 'make test']"
    ]
    first = readme.index("```bash")
    before = readme[:first] + guide + readme[first:]
    assert front_problems(before) == ["docs/guide.md is linked before the set-up commands"]


def test_the_demo_tables_stay_in_their_page(readme: str) -> None:
    row = next(line + "\n" for line in readme.splitlines() if line.startswith("| tuned | "))  # the demo's own row
    longer = readme.replace(row, row * 3, 1)
    assert front_problems(longer) == [f"a table of 6 rows: more than {MAX_TABLE_ROWS} belong in docs/demo.md"]
    unlinked = readme.replace("[docs/demo.md](docs/demo.md)", "docs/demo.md")
    assert front_problems(unlinked) == ["the README does not link docs/demo.md"]
