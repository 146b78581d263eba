"""Write a demo run's results into docs/demo.md and README.md (a developer tool: `make demo` is what users run).

The demo (``python -m mydecide.demo``) writes its tables to ``<out>/summary.md`` and the reliability diagram of the
test split to ``<out>/eval_test/reliability.png``. This script puts all of ``summary.md`` between docs/demo.md's
``<!-- demo:start -->`` and ``<!-- demo:end -->`` markers, followed by the diagram, which it copies to
``docs/demo-reliability.png``, and the first table alone (the test split of the trained tasks: base, tuned,
tuned + calibrated, majority) between README.md's markers. It reads the run and trains nothing:

    python -m mydecide.demo                    # ~30 minutes on 2 CPU cores; writes runs/demo/
    python scripts/update_readme.py            # [--out runs/demo]
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from mydecide.io import atomic_write_text

ROOT = Path(__file__).resolve().parent.parent
START, END = "<!-- demo:start -->", "<!-- demo:end -->"
DEMO_PAGE = "docs/demo.md"  # relative to the repository root
DIAGRAM = "docs/demo-reliability.png"  # docs/demo.md links it as demo-reliability.png


def demo_block(summary: str) -> str:
    """What goes between (and includes) docs/demo.md's markers: the demo's summary.md and the reliability diagram."""
    return f"{START}\n{summary}\n![reliability diagram]({Path(DIAGRAM).name})\n{END}"


def readme_block(summary: str) -> str:
    """What goes between (and includes) README.md's markers: summary.md up to the end of its first table."""
    paragraphs = summary.strip("\n").split("\n\n")
    table = next((i for i, text in enumerate(paragraphs) if text.startswith("|")), None)
    if table is None:
        sys.exit("update_readme: the demo's summary.md has no table")
    return f"{START}\n" + "\n\n".join(paragraphs[: table + 1]) + f"\n{END}"


def replace_block(path: Path, block: str) -> str:
    """``path``'s text with the block between its markers (markers included) replaced by ``block``."""
    content = path.read_text(encoding="utf-8") if path.is_file() else ""
    if START not in content or END not in content:
        sys.exit(f"update_readme: {path} has no {START} ... {END} markers")
    start, end = content.index(START), content.index(END)
    return content[:start] + block + content[end + len(END) :]


def update_readme(out: Path, root: Path = ROOT) -> None:
    """Copy ``out``'s summary.md into ``root``/docs/demo.md (all of it) and README.md (its first table), and its
    reliability diagram to ``root``/docs/."""
    summary, diagram = out / "summary.md", out / "eval_test" / "reliability.png"
    for path in (summary, diagram):
        if not path.is_file():
            sys.exit(f"update_readme: no {path}: run the demo first (python -m mydecide.demo --out {out})")
    text = summary.read_text(encoding="utf-8")
    page, readme = root / DEMO_PAGE, root / "README.md"
    new_page, new_readme = replace_block(page, demo_block(text)), replace_block(readme, readme_block(text))
    shutil.copy(diagram, root / DIAGRAM)
    atomic_write_text(page, new_page)
    atomic_write_text(readme, new_readme)
    print(f"wrote {page}, {readme} and {root / DIAGRAM} from {out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "demo", help="The demo run (its --out).")
    parser.add_argument("--root", type=Path, default=ROOT, help="The repository whose pages are rewritten.")
    args = parser.parse_args()
    update_readme(args.out, args.root)


if __name__ == "__main__":
    main()
