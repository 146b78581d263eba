"""Write a finished demo run's results into README.md (a developer tool: `make demo` is what users run).

The demo (``python -m mydecide.demo``) writes its tables to ``<out>/summary.md`` and the reliability diagram of the
test split to ``<out>/eval_test/reliability.png``. This script puts ``summary.md`` between README.md's
``<!-- demo:start -->`` and ``<!-- demo:end -->`` markers, followed by the diagram, which it copies to
``docs/demo-reliability.png``. It reads the run and trains nothing:

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
README_START, README_END = "<!-- demo:start -->", "<!-- demo:end -->"
DIAGRAM = "docs/demo-reliability.png"  # relative to the repository root, as README.md links it


def readme_block(text: str) -> str:
    """What goes between (and includes) the markers: the demo's summary.md and the reliability diagram."""
    return f"{README_START}\n{text}\n![reliability diagram]({DIAGRAM})\n{README_END}"


def update_readme(out: Path, root: Path = ROOT) -> None:
    """Copy ``out``'s summary.md into ``root``/README.md and its reliability diagram to ``root``/docs/."""
    summary, diagram = out / "summary.md", out / "eval_test" / "reliability.png"
    for path in (summary, diagram):
        if not path.is_file():
            sys.exit(f"update_readme: no {path}: run the demo first (python -m mydecide.demo --out {out})")
    readme = root / "README.md"
    content = readme.read_text(encoding="utf-8")
    if README_START not in content or README_END not in content:
        sys.exit(f"update_readme: {readme} has no {README_START} ... {README_END} markers")
    (root / DIAGRAM).parent.mkdir(exist_ok=True)
    shutil.copy(diagram, root / DIAGRAM)
    start, end = content.index(README_START), content.index(README_END)
    block = readme_block(summary.read_text(encoding="utf-8"))
    atomic_write_text(readme, content[:start] + block + content[end + len(README_END) :])
    print(f"wrote {readme} and {root / DIAGRAM} from {out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "demo", help="The demo run (its --out).")
    parser.add_argument("--root", type=Path, default=ROOT, help="The repository whose README.md is rewritten.")
    args = parser.parse_args()
    update_readme(args.out, args.root)


if __name__ == "__main__":
    main()
