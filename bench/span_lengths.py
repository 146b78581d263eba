"""Span F1 by document length: PII texts that a prepare run never used, scored alone and joined into documents
that fill several of the span scorer's windows, for the untuned base and a trained adapter (same run).

The bundled sample (``data_sources/samples/pii_spans.jsonl``, generated texts) has 800 texts; the demo keeps 120
of them. The texts whose ids are in none of ``--data``'s split files are unseen by the adapter; they are cut into
bands of disjoint texts, each band joined ``k`` texts per document by the ``pii`` converter's ``join`` option
(a blank line between texts, offsets shifted), and evaluated with ``mydecide evaluate`` (adapter and base model in
one report). Long documents cross window boundaries (``prompt.span.window_tokens``, 512 by default, with an overlap
of 128), so the long bands measure the window sequence as well as the reads. Each band of joined documents is also
scored text by text with the same adapter, so a long document's F1 is compared with the same texts read alone
(issue: at least 0.9 of it on documents of 2,000 tokens or more); documents are measured in the model's tokens.

    .venv/bin/python bench/span_lengths.py --adapter runs/demo/train/adapter --data runs/demo/data \\
        [--bands 1:40,5:8,40:2,80:2] [--labels PERSON,EMAIL,PHONE] [--model smollm2-135m]

``--bands k:n,...``: n documents of k texts each. Writes bench/results/span_lengths.json and prints a table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import RESULTS, ROOT


def seen_ids(data: Path) -> set[str]:
    """Ids of every record in the prepare output's split files (a joined document's id names its first text)."""
    ids: set[str] = set()
    for path in sorted(data.glob("*.jsonl")):
        if path.name in ("rejects.jsonl", "near_pairs.jsonl"):
            continue
        for line in path.read_text(encoding="utf-8").splitlines():
            ids.add(str(json.loads(line)["id"]).split("+")[0])
    return ids


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--adapter", type=Path, required=True, help="a trained adapter (runs/demo/train/adapter)")
    parser.add_argument("--data", type=Path, required=True, help="the prepare output it was trained on")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--bands", default="1:40,5:8,40:2,80:2", help="k:n,... n documents of k texts each")
    parser.add_argument("--labels", default="PERSON,EMAIL,PHONE")
    parser.add_argument("--out", type=Path, default=RESULTS / "span_lengths.json")
    args = parser.parse_args()

    from data_sources import pii

    bands = [tuple(int(x) for x in band.split(":")) for band in args.bands.split(",")]
    labels = args.labels.split(",")
    seen = seen_ids(args.data)
    unseen = [
        line
        for line in pii.SAMPLE.read_text(encoding="utf-8").splitlines()
        if json.loads(line)["id"] not in seen and json.loads(line)["kind"] != "none"
    ]
    needed = sum(k * n for k, n in bands)
    if needed > len(unseen):
        sys.exit(f"span_lengths: the bands need {needed} unseen texts, there are {len(unseen)}")
    print(f"{len(unseen)} unseen texts with personal data; bands (texts per document × documents): {bands}")
    from transformers import AutoTokenizer

    from mydecide.modeling import resolve_model_path

    path, kwargs = resolve_model_path(args.model)
    tokenizer = AutoTokenizer.from_pretrained(path, **kwargs)
    results, at = [], 0
    with tempfile.TemporaryDirectory() as tmp:
        for k, n in bands:
            sample = Path(tmp) / f"texts_{k}.jsonl"
            sample.write_text("\n".join(unseen[at : at + k * n]) + "\n", encoding="utf-8")
            at += k * n
            records = [
                {key: value for key, value in row.items() if key != "_where"}
                for row in pii.convert(str(sample), labels=labels, join=k)
            ]
            data = Path(tmp) / f"band_{k}.jsonl"
            data.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
            started = time.perf_counter()
            command = [sys.executable, "-m", "mydecide.cli", "evaluate", "--model", args.model]
            command += ["--adapter", str(args.adapter), "--data", str(data), "--out", str(Path(tmp) / f"eval_{k}")]
            subprocess.run([*command, "--permutations", "0"], cwd=ROOT, check=True)
            report = json.loads((Path(tmp) / f"eval_{k}" / "report.json").read_text())
            tuned, base = report["span"]["spans"], report["baselines"]["base_model"]["span"]["spans"]
            alone = None
            if k > 1:  # the same texts, each its own question, the same adapter
                single = Path(tmp) / f"alone_{k}.jsonl"
                single.write_text(
                    "".join(
                        json.dumps({key: v for key, v in row.items() if key != "_where"}, ensure_ascii=False) + "\n"
                        for row in pii.convert(str(sample), labels=labels, join=1)
                    ),
                    encoding="utf-8",
                )
                command = [sys.executable, "-m", "mydecide.cli", "evaluate", "recipes/eval/default.yaml"]
                command += ["--model", args.model, "--adapter", str(args.adapter), "--data", str(single)]
                command += ["--out", str(Path(tmp) / f"alone_{k}"), "permutations=0", "base=false"]
                subprocess.run(command, cwd=ROOT, check=True)
                alone = json.loads((Path(tmp) / f"alone_{k}" / "report.json").read_text())["span"]["spans"]
            results.append(
                {
                    "texts_per_document": k,
                    "documents": len(records),
                    "median_chars": statistics.median(len(r["state"]) for r in records),
                    "median_tokens": statistics.median(len(tokenizer(r["state"])["input_ids"]) for r in records),
                    "alone": None
                    if alone is None
                    else {"exact_f1": alone["exact"]["f1"], "overlap_f1": alone["overlap"]["f1"]},
                    "gold_spans": tuned["gold_spans"],
                    "base": {"exact_f1": base["exact"]["f1"], "overlap_f1": base["overlap"]["f1"]},
                    "tuned": {"exact_f1": tuned["exact"]["f1"], "overlap_f1": tuned["overlap"]["f1"]},
                    "seconds": round(time.perf_counter() - started, 1),
                }
            )
    print(
        "\n| texts per document | documents | median characters | median tokens | gold spans | exact F1 base → tuned "
        "| overlap F1 base → tuned | tuned exact F1, the same texts alone | ratio |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in results:
        alone = r["alone"]
        print(
            f"| {r['texts_per_document']} | {r['documents']} | {r['median_chars']:.0f} | {r['median_tokens']:.0f} | "
            f"{r['gold_spans']} | {r['base']['exact_f1']:.3f} → {r['tuned']['exact_f1']:.3f} | "
            f"{r['base']['overlap_f1']:.3f} → {r['tuned']['overlap_f1']:.3f} | "
            + (
                "— | — |"
                if alone is None
                else f"{alone['exact_f1']:.3f} | {r['tuned']['exact_f1'] / alone['exact_f1']:.3f} |"
            )
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "benchmark": "span_lengths",
                "what": "span F1 of unseen PII texts, alone and joined into long documents, base vs adapter",
                "model": args.model,
                "adapter": str(args.adapter),
                "labels": labels,
                "bands": results,
            },
            indent=2,
        )
        + "\n"
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
