"""Benchmark of dedup and decontamination quality on what users meet: mixed lengths, typical edits, look-alikes.

Run: ``.venv/bin/python bench/bench_dedup.py`` (``--base N`` for another corpus size, ``--out`` for another
results file). The corpus is built from the real texts shipped in ``data_sources/samples/`` (VADER tweets and
snippets, Rotten Tomatoes reviews and plots, 2012 convention speeches, SpamAssassin mail), from text generated
by a word-bigram chain trained on them, from real sentences joined into long documents, and from short
templated requests (``"set an alarm for 7 am"``). Lengths run from 3 to 3,000 words, short-heavy (40% under 15
words). Into it are planted:

- **near-duplicates**: one copy of an original, made by one edit kind (one word changed / inserted / deleted,
  two or three such edits, a typo, case and punctuation, whitespace and quotes, a greeting or signature added,
  a sentence dropped) or an exact copy;
- **distinct-but-similar pairs** that must both stay: the same template with another slot value ("set an alarm
  for 7 am" / "set an alarm for 9 pm") or the same question about another entity;
- **contaminated rows**: copies of items of an eval file made by the same edits (and an eval text embedded in a
  longer one), plus look-alikes of eval items (same template, other slot) that must stay.

Everything goes through ``mydecide.data.prepare.prepare`` with the **default recipe** (only the source and the
eval file set), and is scored from ``rejects.jsonl``: recall by edit kind, by length band (words of the original)
and by character-5-gram Jaccard band (of the case-folded, whitespace-collapsed texts), precision, and how many
look-alike pairs were kept. Writes ``bench/results/dedup.json``.

The corpus and what is planted in it (both fixtures) are built by ``bench/dedup_corpus.py``; this script is the
bench: its arguments, the runs through ``prepare()``, the scoring, the printed tables and the results file.
"""

from __future__ import annotations

import argparse
import itertools
import json
import re
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _common import RESULTS
from dedup_corpus import (
    EDIT_KINDS,
    GENERIC_STATES,
    LENGTH_BANDS,
    Corpus,
    Planted,
    QuestionPlanted,
    band_of,
    build,
    build_questions,
)

from mydecide.config import DataRecipe
from mydecide.data.prepare import prepare

JACCARD_BANDS = [0.0, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0]  # last band: exactly 1.0
QUESTION = {"type": "noul", "instructions": "Does this text ask for something?"}
TARGETS = {"near_recall_j70_every_band": 0.95, "exact_recall": 1.0, "contamination_recall": 0.95, "distinct_kept": 0.98}


# --------------------------------------------------------------------------------------------------- scoring


def jaccard_band(j: float) -> str:
    if j >= 1.0:
        return "1.0"
    for lo, hi in itertools.pairwise(JACCARD_BANDS):
        if j < hi:
            return f"{lo:.1f}-{hi:.1f}"
    return "1.0"


def rate(hits: list[bool]) -> dict[str, Any]:
    return {"n": len(hits), "recall": round(sum(hits) / len(hits), 4) if hits else None}


def breakdown(cases: list[dict[str, Any]], hit: Callable[[dict[str, Any]], bool], min_j: float = 0.0) -> dict:
    """Recall over all cases, and by edit kind, length band and Jaccard band (kind/band: cases with J ≥ min_j)."""
    by: dict[str, dict[str, list[bool]]] = {
        "kind": defaultdict(list),
        "kind_all": defaultdict(list),
        "length": defaultdict(list),
        "jaccard": defaultdict(list),
    }
    for case in cases:
        h = hit(case)
        by["jaccard"][jaccard_band(case["jaccard"])].append(h)
        by["kind_all"][case.get("kind", "-")].append(h)
        if case["jaccard"] >= min_j:
            by["kind"][case.get("kind", "-")].append(h)
            by["length"][case["band"]].append(h)
    length_order = [f"{lo}-{hi}" for lo, hi in LENGTH_BANDS]
    jaccard_order = [f"{lo:.1f}-{hi:.1f}" for lo, hi in itertools.pairwise(JACCARD_BANDS)]
    return {
        "all": rate([hit(c) for c in cases]),
        f"j>={min_j}": rate([hit(c) for c in cases if c["jaccard"] >= min_j]),
        "by_kind": {k: rate(by["kind"][k]) for k in [*EDIT_KINDS, "embedded"] if by["kind"][k]},
        "by_kind_all": {k: rate(by["kind_all"][k]) for k in [*EDIT_KINDS, "embedded"] if by["kind_all"][k]},
        "by_length": {k: rate(by["length"][k]) for k in length_order if by["length"][k]},
        "by_jaccard": {k: rate(by["jaccard"][k]) for k in [*jaccard_order, "1.0"] if by["jaccard"][k]},
    }


def score(planted: Planted, rejects: list[dict[str, Any]], ids: dict[str, int]) -> dict[str, Any]:
    dedup_removed: dict[int, int] = {}  # row → row it matched
    decontaminated: set[int] = set()
    matched_item: dict[int, int] = {}  # decontaminated row → the eval item it matched
    near_sims: list[float] = []
    for r in rejects:
        row = ids[r["id"]]
        if r["step"] in ("exact_dedup", "near_dedup"):
            dedup_removed[row] = ids[r["matched"]["id"]]
            if r["step"] == "near_dedup":
                near_sims.append(r["matched"].get("similarity", 0.0))
        elif r["step"] == "decontaminate":
            decontaminated.add(row)
            matched_item[row] = int(r["matched"]["eval_id"][1:])

    def merged(a: int, b: int) -> bool:
        return dedup_removed.get(a) == b or dedup_removed.get(b) == a

    family = planted.family
    correct = sum(family[a] == family[b] for a, b in dedup_removed.items())
    planted_rows = {c["row"] for c in planted.contaminated}
    near = breakdown(planted.copies, lambda c: merged(c["row"], c["origin_row"]), min_j=0.7)
    contamination = breakdown(planted.contaminated, lambda c: c["row"] in decontaminated, min_j=0.7)
    pairs_kept = [not merged(p["a"], p["b"]) for p in planted.pairs]
    controls_kept = [c["row"] not in decontaminated for c in planted.controls]
    exact = [merged(c["row"], c["origin_row"]) for c in planted.copies if c["kind"] == "exact"]
    return {
        "dedup": {
            "near_duplicates": near,
            "exact_recall": round(sum(exact) / len(exact), 4),
            "removed": len(dedup_removed),
            "correct": correct,
            "precision": round(correct / len(dedup_removed), 4) if dedup_removed else 1.0,
            "distinct_pairs": {
                "n": len(pairs_kept),
                "kept": round(sum(pairs_kept) / len(pairs_kept), 4),
                "by_jaccard": _kept_by_jaccard(planted.pairs, pairs_kept),
            },
        },
        "decontamination": {
            "contaminated": contamination,
            "removed": len(decontaminated),
            "unplanted_removed": accidental(planted, matched_item, planted_rows),
            "correct": len(decontaminated & planted_rows),
            "precision": round(len(decontaminated & planted_rows) / len(decontaminated), 4) if decontaminated else 1.0,
            "look_alikes": {
                "n": len(controls_kept),
                "kept": round(sum(controls_kept) / len(controls_kept), 4),
                "by_jaccard": _kept_by_jaccard(planted.controls, controls_kept),
            },
        },
    }


def accidental(planted: Planted, matched_item: dict[int, int], planted_rows: set[int]) -> dict[str, Any]:
    """The removed rows that were not planted, and how many of them do overlap the eval item they matched word
    for word (the item's 5+ words whole inside the row or the row's inside the item, or a shared word 13-gram):
    contamination the corpus generator made by accident (its chain reproduces real sentences and boilerplate),
    which the precision above counts as false."""

    def words(text: str) -> list[str]:
        return re.findall(r"[^\W_]+", text.casefold())  # runs of letters and digits, as prepare reads words

    def inside(small: list[str], big: list[str]) -> bool:
        return 5 <= len(small) <= len(big) and any(
            big[k : k + len(small)] == small for k in range(len(big) - len(small) + 1)
        )

    def grams(ws: list[str]) -> set[tuple[str, ...]]:
        return {tuple(ws[k : k + 13]) for k in range(len(ws) - 12)}

    unplanted = [row for row in matched_item if row not in planted_rows]
    verbatim = 0
    for row in unplanted:
        a, b = words(planted.rows[row]), words(planted.eval_items[matched_item[row]])
        verbatim += inside(a, b) or inside(b, a) or bool(grams(a) & grams(b))
    removed = len(matched_item)
    return {
        "n": len(unplanted),
        "verbatim_overlap": verbatim,
        "precision_counting_verbatim_as_true": round((removed - len(unplanted) + verbatim) / removed, 4)
        if removed
        else 1.0,
    }


def _kept_by_jaccard(cases: list[dict[str, Any]], kept: list[bool]) -> dict[str, Any]:
    groups: dict[str, list[bool]] = defaultdict(list)
    for case, k in zip(cases, kept, strict=True):
        groups[jaccard_band(case["jaccard"])].append(k)
    return {b: {"n": len(v), "kept": round(sum(v) / len(v), 4)} for b, v in sorted(groups.items())}


def table(title: str, rows: dict[str, dict[str, Any]], baseline: dict[str, dict[str, Any]] | None) -> list[str]:
    lines = [f"  {title:<16}{'n':>7}{'recall':>9}" + (f"{'before':>9}{'ratio':>8}" if baseline else "")]
    for key, value in rows.items():
        line = f"  {key:<16}{value['n']:>7}{value['recall']:>9.3f}"
        old = (baseline or {}).get(key)
        if old and old.get("recall") is not None:
            ratio = value["recall"] / old["recall"] if old["recall"] else float("inf")
            line += f"{old['recall']:>9.3f}{ratio:>7.2f}x"
        lines.append(line)
    return lines


def report(result: dict[str, Any], baseline: dict[str, Any] | None) -> str:
    lines: list[str] = []
    for part, key in (("dedup", "near_duplicates"), ("decontamination", "contaminated")):
        section = result[part][key]
        old = baseline[part][key] if baseline else None
        lines.append(
            f"{part}: recall {section['all']['recall']:.3f} of {section['all']['n']} planted, "
            f"{section['j>=0.7']['recall']:.3f} of the {section['j>=0.7']['n']} with char-5-gram "
            f"Jaccard >= 0.7" + (f" (before: {old['all']['recall']:.3f}, {old['j>=0.7']['recall']:.3f})" if old else "")
        )
        for title, name in (
            ("edit kind*", "by_kind"),
            ("edit kind, all", "by_kind_all"),
            ("length band*", "by_length"),
            ("Jaccard band", "by_jaccard"),
        ):
            lines += table(title, section[name], old.get(name) if old else None)
    d, c = result["dedup"], result["decontamination"]
    lines.append(
        f"  (* copies with Jaccard >= 0.7)\ndedup: exact recall {d['exact_recall']:.3f}, precision "
        f"{d['precision']:.4f} ({d['removed']} removed), distinct-but-similar pairs kept "
        f"{d['distinct_pairs']['kept']:.3f} of {d['distinct_pairs']['n']}"
    )
    lines.append(
        f"decontamination: precision {c['precision']:.4f} ({c['removed']} removed), look-alikes of eval "
        f"items kept {c['look_alikes']['kept']:.3f} of {c['look_alikes']['n']}"
    )
    u = c["unplanted_removed"]
    lines.append(
        f"  of the {u['n']} removed rows not planted, {u['verbatim_overlap']} overlap their eval item word for "
        f"word (an accident of the generator); counting those as true, precision "
        f"{u['precision_counting_verbatim_as_true']:.4f}"
    )
    if baseline:
        bd, bc = baseline["dedup"], baseline["decontamination"]
        lines.append(
            f"before: exact recall {bd['exact_recall']:.3f}, dedup precision {bd['precision']:.4f}, "
            f"pairs kept {bd['distinct_pairs']['kept']:.3f}; decontamination precision "
            f"{bc['precision']:.4f}, look-alikes kept {bc['look_alikes']['kept']:.3f}"
        )
    return "\n".join(lines)


def targets(result: dict[str, Any]) -> dict[str, bool]:
    near = result["dedup"]["near_duplicates"]
    return {
        "near_recall_j70_every_band": all(
            v["recall"] >= TARGETS["near_recall_j70_every_band"] for v in near["by_length"].values()
        ),
        "exact_recall": result["dedup"]["exact_recall"] >= TARGETS["exact_recall"],
        # over every planted contaminated row, and over those sharing >= 70% of their character 5-grams
        "contamination_recall": result["decontamination"]["contaminated"]["all"]["recall"]
        >= TARGETS["contamination_recall"],
        "contamination_recall_j70": result["decontamination"]["contaminated"]["j>=0.7"]["recall"]
        >= TARGETS["contamination_recall"],
        "distinct_kept": result["dedup"]["distinct_pairs"]["kept"] >= TARGETS["distinct_kept"],
    }


def shingle_study(planted: Planted) -> list[str]:
    """The evidence behind the shingling: exact Jaccard of each candidate shingling on the planted copies with
    char-5-gram Jaccard >= 0.7 (recall by length) and on the look-alike pairs (kept), at a few thresholds."""
    from mydecide.data import shingles

    copies = [c for c in planted.copies if c["jaccard"] >= 0.7]
    lines = [f"  {'shingles':<10}{'threshold':>10}{'copies <15 words':>18}{'15-49':>8}{'look-alikes kept':>18}"]
    for unit, n in (("word", 3), ("word", 2), ("word", 1), ("char", 4), ("char", 5), ("char", 6)):
        shingling = shingles.Shingling(unit, n)

        def similarity(a: int, b: int, shingling: shingles.Shingling = shingling) -> float:
            return shingles.jaccard(shingling.set(planted.rows[a]), shingling.set(planted.rows[b]))

        cases = [(c["band"], similarity(c["row"], c["origin_row"])) for c in copies]
        pairs = [similarity(p["a"], p["b"]) for p in planted.pairs]
        for t in (0.6, 0.7, 0.8):
            short = [j >= t for band, j in cases if band == "3-14"]
            middle = [j >= t for band, j in cases if band == "15-49"]
            lines.append(
                f"  {unit + str(n):<10}{t:>10.1f}{sum(short) / len(short):>18.3f}"
                f"{sum(middle) / len(middle):>8.3f}{sum(j < t for j in pairs) / len(pairs):>18.3f}"
            )
    return lines


# ------------------------------------------------------------------------- records whose content is the question


def question_length(words: int) -> str:
    return "short question (<12 words)" if words < 12 else "long question (12+ words)"


def score_questions(planted: QuestionPlanted, rejects: list[dict[str, Any]], ids: dict[str, int]) -> dict[str, Any]:
    removed: dict[int, int] = {}  # dedup: row → the row it matched
    decontaminated: dict[int, int] = {}  # row → eval item
    for r in rejects:
        row = ids[r["id"]]
        if r["step"] in ("exact_dedup", "near_dedup"):
            removed[row] = ids[r["matched"]["id"]]
        elif r["step"] == "decontaminate":
            decontaminated[row] = int(r["matched"]["eval_id"][1:])

    def merged(a: int, b: int) -> bool:
        return removed.get(a) == b or removed.get(b) == a

    def recall(cases: list[dict[str, Any]], hit: Callable[[dict[str, Any]], bool], key: str) -> dict[str, Any]:
        groups: dict[str, list[bool]] = defaultdict(list)
        for case in cases:
            name = question_length(case["question_words"]) if key == "length" else str(case[key])
            groups[name].append(hit(case))
        return {k: rate(v) for k, v in sorted(groups.items())}

    def section(cases: list[dict[str, Any]], hit: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
        strong = [c for c in cases if c["jaccard"] >= 0.7]
        out = {
            "all": rate([hit(c) for c in cases]),
            "j>=0.7": rate([hit(c) for c in strong]),
            "by_where": recall(strong, hit, "where"),
            "by_where_all": recall(cases, hit, "where"),
            "by_kind": recall(strong, hit, "kind"),
        }
        if cases and "question_words" in cases[0]:
            out["by_question_length"] = recall(strong, hit, "length")
        return out

    pairs_kept = defaultdict(list)
    for p in planted.pairs:
        pairs_kept[p["kind"]].append(not merged(p["a"], p["b"]))
    controls_kept = defaultdict(list)
    for c in planted.controls:
        controls_kept[c["kind"]].append(c["row"] not in decontaminated)
    copy_of = {c["row"]: c["origin_row"] for c in planted.copies}  # a copy may come first and remove its original
    lost = [row for row in planted.clean if row in removed and copy_of.get(removed[row]) != row]
    planted_rows = {c["row"] for c in planted.contaminated}
    clean_flagged = [row for row in planted.clean if row in decontaminated]

    def words(text: str) -> list[str]:
        return re.findall(r"[^\W_]+", text.casefold())

    def grams(pair: tuple[str, str]) -> set[tuple[str, ...]]:
        ws = words(f"{pair[0]} {pair[1]}")
        return {tuple(ws[k : k + 13]) for k in range(len(ws) - 12)}

    verbatim = sum(
        bool(grams(planted.rows[row]) & grams(planted.eval_items[decontaminated[row]])) for row in clean_flagged
    )
    return {
        "dedup": {
            "near_duplicates": section(planted.copies, lambda c: merged(c["row"], c["origin_row"])),
            "look_alikes_kept": {
                k: {"n": len(v), "kept": round(sum(v) / len(v), 4)} for k, v in sorted(pairs_kept.items())
            },
            "clean_rows": len(planted.clean),
            "clean_rows_lost": len(lost),
            "clean_rows_lost_share": round(len(lost) / len(planted.clean), 4),
            "removed": len(removed),
        },
        "decontamination": {
            "contaminated": section(planted.contaminated, lambda c: c["row"] in decontaminated),
            "look_alikes_kept": {
                k: {"n": len(v), "kept": round(sum(v) / len(v), 4)} for k, v in sorted(controls_kept.items())
            },
            "removed": len(decontaminated),
            "correct": len(set(decontaminated) & planted_rows),
            "clean_rows_flagged": len(clean_flagged),
            "clean_rows_flagged_share": round(len(clean_flagged) / len(planted.clean), 4),
            "clean_rows_flagged_sharing_13_words": verbatim,  # a word 13-gram with their eval item: real overlaps
        },
    }


def run_questions(base: int, seed: int, corpus: Corpus, recipe_overrides: dict[str, Any]) -> dict[str, Any]:
    """The fixture of records whose content is in the question, through prepare() with the default recipe."""
    started = time.perf_counter()
    planted = build_questions(base, seed, corpus)
    built = time.perf_counter() - started
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "records.jsonl"
        source.write_text(
            "".join(
                json.dumps(
                    {
                        "id": f"r{i}",
                        "task": "trivia",
                        "state": state,
                        "question": {"type": "noul", "instructions": question},
                        "answer": i % 2 == 0,
                    }
                )
                + "\n"
                for i, (state, question) in enumerate(planted.rows)
            ),
            encoding="utf-8",
        )
        eval_file = Path(tmp) / "eval.jsonl"
        eval_file.write_text(
            "".join(
                json.dumps({"id": f"e{i}", "state": state, "question": {"type": "noul", "instructions": question}})
                + "\n"
                for i, (state, question) in enumerate(planted.eval_items)
            ),
            encoding="utf-8",
        )
        recipe = DataRecipe.model_validate(
            {
                "sources": [{"kind": "jsonl", "path": str(source)}],
                "decontaminate_against": [str(eval_file)],
                **recipe_overrides,
            }
        )
        start = time.perf_counter()
        prepare(recipe, Path(tmp) / "out")
        seconds = time.perf_counter() - start
        rejects = [json.loads(line) for line in (Path(tmp) / "out" / "rejects.jsonl").open(encoding="utf-8")]
    result = score_questions(planted, rejects, {f"r{i}": i for i in range(len(planted.rows))})
    result.update(
        {
            "rows": len(planted.rows),
            "eval_items": len(planted.eval_items),
            "rows_by_question_length": dict(Counter(question_length(len(q.split())) for _s, q in planted.rows)),
            "rows_by_state": dict(
                Counter(
                    "generic" if s in GENERIC_STATES else ("short (<15 words)" if len(s.split()) < 15 else "passage")
                    for s, _q in planted.rows
                )
            ),
            "prepare_seconds": round(seconds, 2),
            "build_seconds": round(built, 2),
        }
    )
    return result


def report_questions(result: dict[str, Any]) -> str:
    d, c = result["dedup"], result["decontamination"]
    near, cont = d["near_duplicates"], c["contaminated"]
    lines = [
        f"records whose content is in the question: {result['rows']} rows {result['rows_by_state']}, "
        f"{result['rows_by_question_length']}",
        f"near dedup: recall {near['j>=0.7']['recall']:.3f} of the {near['j>=0.7']['n']} copies with decision "
        f"Jaccard >= 0.7 ({near['all']['recall']:.3f} of all {near['all']['n']})",
    ]
    for title, name in (("edit in", "by_where"), ("question", "by_question_length")):
        lines += table(title, near[name], None)
    kept = ", ".join(f"{k} {v['kept']:.3f} of {v['n']}" for k, v in d["look_alikes_kept"].items())
    lines.append(f"  look-alikes kept: {kept}")
    lines.append(f"  clean rows lost: {d['clean_rows_lost']} of {d['clean_rows']} ({d['clean_rows_lost_share']:.2%})")
    lines.append(
        f"decontamination: recall {cont['j>=0.7']['recall']:.3f} of the {cont['j>=0.7']['n']} with J >= 0.7 "
        f"({cont['all']['recall']:.3f} of all {cont['all']['n']}); clean rows flagged {c['clean_rows_flagged']}"
        f" ({c['clean_rows_flagged_share']:.2%}; {c['clean_rows_flagged_sharing_13_words']} of them share a word"
        " 13-gram with their eval item: boilerplate and repeated real texts)"
    )
    lines += table("edit in", cont["by_where"], None)
    kept = ", ".join(f"{k} {v['kept']:.3f} of {v['n']}" for k, v in c["look_alikes_kept"].items())
    lines.append(f"  look-alikes of eval items kept: {kept}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", type=int, default=12_000, help="distinct base texts (a tenth become eval items)")
    parser.add_argument("--seed", type=int, default=13)
    parser.add_argument("--out", type=Path, default=RESULTS / "dedup.json")
    parser.add_argument(
        "--baseline",
        type=Path,
        default=RESULTS / "dedup_before.json",
        help="an earlier result to print ratios against (the run before the shingling changed)",
    )
    parser.add_argument("--recipe", default="{}", help="JSON overrides of the data recipe (default: none)")
    parser.add_argument(
        "--fixture",
        choices=("both", "states", "questions"),
        default="both",
        help="states: the mixed-length states under one question; questions: records whose content is in the"
        " question (the 'questions' section of the results); both (default)",
    )
    parser.add_argument("--question-base", type=int, default=6_000, help="base records of the questions fixture")
    parser.add_argument(
        "--study",
        action="store_true",
        help="only print the exact-Jaccard comparison of shingle kinds and exit"
        " (docs/LOG.md#dedup-character-5-grams-and-short-edits)",
    )
    args = parser.parse_args()

    started = time.perf_counter()
    planted, corpus = build(args.base, args.seed)
    built = time.perf_counter() - started
    if args.study:
        print("\n".join(shingle_study(planted)))
        return
    result: dict[str, Any] = {}
    if args.fixture in ("both", "states"):
        result = run_states(planted, corpus, args, built)
    if args.fixture in ("both", "questions"):
        questions = run_questions(args.question_base, args.seed, corpus, json.loads(args.recipe))
        result["questions"] = questions
        result["near_dup_recall_j70_questions"] = questions["dedup"]["near_duplicates"]["j>=0.7"]["recall"]
        print(report_questions(questions))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"-> {args.out}")


def run_states(planted: Planted, corpus: Corpus, args: argparse.Namespace, built: float) -> dict[str, Any]:
    """The mixed-length states under one question, through prepare() with the default recipe; prints its report."""
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "records.jsonl"
        source.write_text(
            "".join(
                json.dumps({"id": f"r{i}", "task": "texts", "state": s, "question": QUESTION, "answer": i % 2 == 0})
                + "\n"
                for i, s in enumerate(planted.rows)
            ),
            encoding="utf-8",
        )
        eval_file = Path(tmp) / "eval.jsonl"
        eval_file.write_text(
            "".join(json.dumps({"id": f"e{i}", "state": s}) + "\n" for i, s in enumerate(planted.eval_items)),
            encoding="utf-8",
        )
        recipe = DataRecipe.model_validate(
            {
                "sources": [{"kind": "jsonl", "path": str(source)}],
                "decontaminate_against": [str(eval_file)],
                **json.loads(args.recipe),
            }
        )
        start = time.perf_counter()
        manifest = prepare(recipe, Path(tmp) / "out")
        seconds = time.perf_counter() - start
        rejects = [json.loads(line) for line in (Path(tmp) / "out" / "rejects.jsonl").open(encoding="utf-8")]
    ids = {f"r{i}": i for i in range(len(planted.rows))}
    result = score(planted, rejects, ids)
    lengths = Counter(band_of(len(s.split())) for s in planted.rows)
    steps = {s["step"]: s for s in manifest["steps"]}
    result.update(
        {
            "rows": len(planted.rows),
            "eval_items": len(planted.eval_items),
            "seed": args.seed,
            "rows_by_length": {f"{lo}-{hi}": lengths[f"{lo}-{hi}"] for lo, hi in LENGTH_BANDS},
            "base_texts_by_origin": dict(corpus.kinds),
            "recipe_overrides": json.loads(args.recipe),
            "near_dedup_settings": {
                k: v
                for k, v in steps["near_dedup"].items()
                if k not in ("step", "in", "out", "removed", "reasons", "by_source", "by_type", "seconds")
            },
            "prepare_seconds": round(seconds, 2),
            "build_seconds": round(built, 2),
            "targets": TARGETS,
        }
    )
    result["meets"] = targets(result)
    result["near_dup_recall_j70"] = result["dedup"]["near_duplicates"]["j>=0.7"]["recall"]
    baseline = json.loads(args.baseline.read_text()) if args.baseline.is_file() and args.baseline != args.out else None
    if baseline:
        old = baseline["dedup"]["near_duplicates"]["j>=0.7"]["recall"]
        result["near_dup_recall_j70_ratio_to_before"] = round(result["near_dup_recall_j70"] / old, 3)

    print(
        f"{len(planted.rows)} rows ({', '.join(f'{k}: {v}' for k, v in result['rows_by_length'].items())} "
        f"words), {len(planted.eval_items)} eval items; prepare {seconds:.1f} s; near dedup settings "
        f"{result['near_dedup_settings']}"
    )
    print(report(result, baseline))
    print(f"targets met: {result['meets']}")
    return result


if __name__ == "__main__":
    main()
