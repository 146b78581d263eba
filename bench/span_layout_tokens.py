"""Tokens per span question in the two span-head layouts (``prompt.span.layout: own | shared``), counted with the
model's tokenizer on a prepare output (no forward pass, no weights read).

    .venv/bin/mydecide prepare recipes/data/demo.yaml --out /tmp/demo-data
    .venv/bin/python bench/span_layout_tokens.py --data /tmp/demo-data [--split test] [--model smollm2-135m]

For every span question of the split, rendered as the demo's training recipe renders it (``recipes/train/demo.yaml``'s
``prompt`` section, the span head's read):

* ``alone``: the tokens the question costs scored alone. ``own``: its sequences (template head, question, label
  lines, text) over every window. ``shared``: its state's prefix (template head + state) once, then its blocks.
* ``extra``: the tokens it adds when its state is shared with other questions (whose prefix is already paid):
  ``own`` shares nothing, so all of ``alone``; ``shared`` only its blocks.

``shared`` is counted at the demo's ``max_state_tokens`` (a text longer than the cap is not wholly in the prefix, so
its block carries the window's own first copy) and at the default cap (3000). (The labels are read at their lines'
last tokens; the arms that read them over their lines are gone with that read, their counts in docs/LOG.md.) Writes
bench/results/span_layout_tokens.json and prints a table.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

from _common import RESULTS, ROOT

TARGET_ALONE = 270  # issue 32: a demo span question scored alone


def summary(values: list[int], target: bool = False) -> dict[str, Any]:
    """Mean, median and max of token counts; with ``target``, the share within the issue's 270 tokens."""
    out: dict[str, Any] = {"mean": round(statistics.fmean(values), 1), "median": statistics.median(values)}
    out["max"] = max(values)
    if target:
        out["share_at_most_270"] = round(sum(v <= TARGET_ALONE for v in values) / len(values), 3)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, required=True, help="a prepare output (mydecide prepare ... --out DIR)")
    parser.add_argument("--split", default="test")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--recipe", type=Path, default=ROOT / "recipes" / "train" / "demo.yaml")
    parser.add_argument("--out", type=Path, default=RESULTS / "span_layout_tokens.json")
    args = parser.parse_args()

    from transformers import AutoTokenizer

    from mydecide.config import TrainRecipe
    from mydecide.modeling import resolve_model_path
    from mydecide.recipe_loading import load_recipe
    from mydecide.record_files import load_records
    from mydecide.scoring.plan import ScoringPlan
    from mydecide.scoring.render import Renderer
    from mydecide.scoring.span_layout import span_layout

    path, kwargs = resolve_model_path(args.model)
    tokenizer = AutoTokenizer.from_pretrained(path, **kwargs)
    prompt = load_recipe(args.recipe, [], model=TrainRecipe).prompt
    records = load_records(args.data / f"{args.split}.jsonl")
    spans = [r for r in records if r.question.type == "span"]
    if not spans:
        raise SystemExit(f"{args.data / args.split}.jsonl has no span questions")

    def renderer(**span: Any) -> Renderer:
        config = prompt.model_copy(update={k: v for k, v in span.items() if k == "max_state_tokens"})
        fields = {k: v for k, v in span.items() if k != "max_state_tokens"}
        config = config.model_copy(update={"span": config.span.model_copy(update={"read": "head", **fields})})
        return Renderer(tokenizer, config)

    arms = {
        "own": renderer(layout="own"),
        "shared": renderer(layout="shared"),
        "shared, max_state_tokens 3000": renderer(layout="shared", max_state_tokens=3000),
    }
    results: dict[str, Any] = {}
    for name, r in arms.items():
        alone, extra, windows, cut = [], [], [], 0
        for record in spans:
            layout = span_layout(r, record.state, record.question)
            blocks = sum(len(s.ids) - s.root for s in layout.sequences)
            root = layout.sequences[0].root if layout.sequences else 0
            alone.append(root + blocks)
            extra.append(blocks)
            windows.append(len(layout.sequences))
            cut += r.encode_state(record.state)[1]
        results[name] = {
            "max_state_tokens": r.config.max_state_tokens,
            "alone": summary(alone, target=True),
            "extra_over_the_state": summary(extra),
            "states_cut": cut,
            "windows": sum(windows),
        }
    # what one question of another type adds to its state in the same split (its stem and reads): the yardstick
    other = renderer(layout="own")
    others = [r for r in records if r.question.type != "span"]
    plan = ScoringPlan(other, [(r.state, r.question) for r in others])
    extra_other: dict[int, int] = {}
    stems: set[tuple[int, tuple[int, ...]]] = set()
    for owner, p in zip(plan.owner, plan.prompts, strict=True):
        if (owner, p.prefix) not in stems:  # a question's stem once, every read's suffix
            stems.add((owner, p.prefix))
            extra_other[owner] = extra_other.get(owner, 0) + p.stem
        extra_other[owner] = extra_other.get(owner, 0) + len(p.suffix)
    state_tokens = [len(other.encode_state(r.state)[0]) for r in spans]
    out = {
        "command": f"bench/span_layout_tokens.py --data {args.data} --split {args.split} --model {args.model}",
        "model": args.model,
        "recipe": str(args.recipe.relative_to(ROOT)) if args.recipe.is_relative_to(ROOT) else str(args.recipe),
        "split": args.split,
        "span_questions": len(spans),
        "span_state_tokens": summary(state_tokens),
        "other_question_extra_over_the_state": summary(list(extra_other.values())),
        "layouts": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(f"{len(spans)} span questions of {args.data / args.split}.jsonl, {args.model}'s tokenizer")
    print(f"{'layout':40} {'alone mean/median/max':>24} {'<=270':>6} {'extra mean/median/max':>24} {'cut':>4}")
    for name, row in results.items():
        a, e = row["alone"], row["extra_over_the_state"]
        print(
            f"{name:40} {a['mean']:>10} {a['median']:>6} {a['max']:>6} {a['share_at_most_270']:>6} "
            f"{e['mean']:>10} {e['median']:>6} {e['max']:>6} {row['states_cut']:>4}"
        )
    o = out["other_question_extra_over_the_state"]
    print(f"another question of the split adds {o['mean']} tokens to its state on average (median {o['median']})")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
