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
"""

from __future__ import annotations

import argparse
import csv
import itertools
import json
import random
import re
import tempfile
import time
import zlib
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _common import BENCH, RESULTS, ROOT

from mydecide.config import DataRecipe
from mydecide.data.prepare import prepare

SAMPLES = ROOT / "data_sources" / "samples"
LENGTH_BANDS = [(3, 14), (15, 49), (50, 199), (200, 999), (1000, 3000)]
BAND_WEIGHTS = [0.40, 0.30, 0.18, 0.09, 0.03]  # short-heavy: intents, tweets, tickets, reviews, then documents
JACCARD_BANDS = [0.0, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0]  # last band: exactly 1.0
EDIT_KINDS = ["exact", "sub1", "ins1", "del1", "few", "typo", "case_punct", "space_quotes", "greeting", "drop_sentence"]
QUESTION = {"type": "noul", "instructions": "Does this text ask for something?"}
TARGETS = {"near_recall_j70_every_band": 0.95, "exact_recall": 1.0, "contamination_recall": 0.95, "distinct_kept": 0.98}


# ------------------------------------------------------------------------------------------------ real texts


def real_texts(kinds: tuple[str, ...] = ("vader", "rotten_tomatoes", "convention", "spamassassin")) -> list[str]:
    """The states of the shipped samples, read the way their converters read them (distinct, 3+ words)."""
    from mydecide.data.sources import load_source

    texts: dict[str, None] = {}
    for kind in kinds:
        for row in load_source(kind).convert(None, limit=None, seed=13):
            state = row.get("state") if isinstance(row, dict) else None
            if isinstance(state, str) and len(state.split()) >= 3:
                texts.setdefault(state, None)
    return list(texts)


def banking_questions() -> list[str]:
    with open(BENCH / "data" / "banking77_synthetic.csv", encoding="utf-8") as handle:
        return [row["text"] for row in csv.DictReader(handle)]


SENTENCE = re.compile(r"(?<=[.!?])\s+")


def sentences(text: str) -> list[str]:
    return [s for s in SENTENCE.split(text.strip()) if s]


class Bigrams:
    """A word-bigram chain over the real texts: generated text with real words, punctuation and rhythm."""

    def __init__(self, texts: list[str], rng: random.Random):
        self.rng = rng
        self.next: dict[str, list[str]] = defaultdict(list)
        self.starts: list[str] = []
        for text in texts:
            words = text.split()
            if words:
                self.starts.append(words[0])
            for a, b in itertools.pairwise(words):
                self.next[a].append(b)

    def text(self, n: int) -> str:
        out = [self.rng.choice(self.starts)]
        while len(out) < n:
            follow = self.next.get(out[-1])
            out.append(self.rng.choice(follow) if follow else self.rng.choice(self.starts))
        return " ".join(out)


# ------------------------------------------------------------------------------------------------- templates

TIMES = [f"{h} {m}" for h in range(1, 13) for m in ("am", "pm")] + ["noon", "midnight", "6:30 am", "7:15 pm"]
CITIES = [
    "Paris",
    "Berlin",
    "Lagos",
    "Lima",
    "Osaka",
    "Denver",
    "Leeds",
    "Porto",
    "Austin",
    "Hanoi",
    "Quito",
    "Cairo",
    "Oslo",
    "Perth",
    "Dublin",
    "Nairobi",
    "Madrid",
    "Seoul",
    "Boston",
    "Mumbai",
]
DAYS = ["today", "tomorrow", "on Monday", "on Friday", "this weekend", "tonight", "next week"]
NAMES = [
    "Anna",
    "Ben",
    "Chloe",
    "David",
    "Emma",
    "Farid",
    "Grace",
    "Hugo",
    "Ines",
    "Jonas",
    "Kofi",
    "Lena",
    "Mateo",
    "Nora",
    "Omar",
    "Priya",
    "Quinn",
    "Rosa",
    "Sven",
    "Tara",
]
COUNTRIES = [
    "France",
    "Germany",
    "Japan",
    "Kenya",
    "Peru",
    "Canada",
    "Norway",
    "Egypt",
    "India",
    "Chile",
    "Spain",
    "Ghana",
    "Vietnam",
    "Ireland",
    "Mexico",
    "Poland",
    "Brazil",
    "Nepal",
    "Italy",
    "Greece",
]
THINGS = [
    "the Eiffel Tower",
    "Mount Everest",
    "the Golden Gate Bridge",
    "Big Ben",
    "the Burj Khalifa",
    "the Empire State Building",
    "Kilimanjaro",
    "the Statue of Liberty",
    "the Shard",
    "Table Mountain",
]
SONGS = ["jazz", "lo-fi beats", "Taylor Swift", "Bach", "the Beatles", "reggae", "Miles Davis", "k-pop"]
ITEMS = ["milk", "eggs", "bread", "coffee", "batteries", "rice", "apples", "shampoo", "butter", "tea"]
TEMPLATES: list[tuple[str, dict[str, list[str]]]] = [
    ("set an alarm for {t}", {"t": TIMES}),
    ("wake me up at {t} {d}", {"t": TIMES, "d": DAYS}),
    ("what's the weather in {c} {d}", {"c": CITIES, "d": DAYS}),
    ("will it rain in {c} {d}?", {"c": CITIES, "d": DAYS}),
    ("send {n} {a} dollars", {"n": NAMES, "a": [str(a) for a in (5, 10, 20, 25, 40, 50, 75, 100, 150, 200)]}),
    ("call {n} on speaker", {"n": NAMES}),
    ("remind me to call {n} at {t}", {"n": NAMES, "t": TIMES}),
    ("what is the capital of {k}?", {"k": COUNTRIES}),
    ("what currency do they use in {k}?", {"k": COUNTRIES}),
    ("how tall is {x}?", {"x": THINGS}),
    ("play some {s} in the kitchen", {"s": SONGS}),
    ("add {i} to my shopping list", {"i": ITEMS}),
    ("book a table for {p} at {t} {d}", {"p": [str(p) for p in range(2, 9)], "t": TIMES, "d": DAYS}),
    ("my card ending in {d4} was declined at the shop", {"d4": [f"{x:04d}" for x in range(0, 10000, 37)]}),
    ("where is my order number {o}? it has not arrived yet", {"o": [str(x) for x in range(40000, 41000, 7)]}),
    ("how long does a transfer to {k} take?", {"k": COUNTRIES}),
    ("translate good morning into the language spoken in {k}", {"k": COUNTRIES}),
    ("turn the {r} lights {o}", {"r": ["kitchen", "bedroom", "hall", "garden", "office"], "o": ["on", "off"]}),
    (
        "I was charged twice for my {i} order from {d}, please refund one",
        {"i": ITEMS, "d": ["Monday", "Tuesday", "yesterday", "last week", "the 3rd", "the 17th"]},
    ),
    (
        "my flight to {c} on {d} was cancelled. When do I get my refund?",
        {"c": CITIES, "d": ["May 3", "June 12", "July 9", "August 21"]},
    ),
]


def fill(
    template: tuple[str, dict[str, list[str]]], rng: random.Random, fixed: dict[str, str] | None = None
) -> tuple[str, dict[str, str]]:
    pattern, slots = template
    values = {k: (fixed or {}).get(k) or rng.choice(v) for k, v in slots.items()}
    return pattern.format(**values), values


def look_alike(template: tuple[str, dict[str, list[str]]], rng: random.Random) -> tuple[str, str]:
    """Two fills of one template that differ in exactly one slot (the other slots equal)."""
    first, values = fill(template, rng)
    slot = rng.choice(sorted(template[1]))
    other = dict(values)
    while other[slot] == values[slot]:
        other[slot] = rng.choice(template[1][slot])
    return first, template[0].format(**other)


# ----------------------------------------------------------------------------------------------------- edits

GREETINGS = ["Hi,", "Hello team,", "Hey there!", "Good morning,", "Hi all -", "Dear support,"]
SIGNATURES = [
    "Thanks!",
    "Thanks, Anna",
    "Sent from my iPhone",
    "Cheers,\nTom",
    "Kind regards,\nPriya Shah",
    "thx",
    "-- \nJohn Smith\nACME Corp | Support",
]


def apply_edit(kind: str, text: str, vocab: list[str], rng: random.Random) -> str | None:
    """The edited copy, or None when the kind does not apply to this text."""
    words = text.split()
    if kind == "exact":
        return text
    if kind in ("sub1", "ins1", "del1", "few"):
        ops = [kind[:3]] if kind != "few" else [rng.choice(("sub", "ins", "del")) for _ in range(rng.randint(2, 3))]
        if (kind == "few" and len(words) < 6) or (kind == "del1" and len(words) < 4):
            return None
        for op in ops:
            i = rng.randrange(len(words))
            if op == "sub":
                replacement = rng.choice(vocab)
                while replacement.casefold() == words[i].casefold():
                    replacement = rng.choice(vocab)
                words[i] = replacement
            elif op == "ins":
                words.insert(i, rng.choice(vocab))
            else:
                del words[i]
        return " ".join(words)
    if kind == "typo":
        long_words = [i for i, w in enumerate(words) if len(w) >= 4 and w.isalpha()]
        if not long_words:
            return None
        i = rng.choice(long_words)
        w = words[i]
        j = rng.randrange(len(w) - 1)
        words[i] = rng.choice([w[:j] + w[j + 1] + w[j] + w[j + 2 :], w[:j] + w[j + 1 :], w[:j] + w[j] + w[j:]])
        return " ".join(words)
    if kind == "case_punct":
        out = rng.choice(
            [text.lower(), text.upper() if len(words) < 30 else text.lower(), text.capitalize(), text.title()]
        )
        out = re.sub(r"[,;:]", "", out) if rng.random() < 0.5 else out.replace(" ", ", ", 1)
        out = out.rstrip(".!?") + rng.choice(["", ".", "!", "!!", "?"])
        return out if out != text else None
    if kind == "space_quotes":
        out = text.replace("'", "\u2019").replace('"', "\u201c") if rng.random() < 0.5 else text
        out = re.sub(r" ", lambda _m: rng.choice([" ", " ", " ", "  ", "\n"]), out)
        if rng.random() < 0.5 or out == text:
            out = f'"{out}"' if rng.random() < 0.5 else f"\u201c {out} \u201d"
        return out
    if kind == "greeting":
        if rng.random() < 0.5:
            return f"{rng.choice(GREETINGS)} {text}"
        return f"{text}\n\n{rng.choice(SIGNATURES)}"
    if kind == "drop_sentence":
        parts = sentences(text)
        if len(parts) < 2:
            return None
        del parts[rng.randrange(len(parts))]
        return " ".join(parts)
    raise ValueError(kind)


# ---------------------------------------------------------------------------------------------------- corpus


def char_jaccard(a: str, b: str, n: int = 5) -> float:
    """Jaccard of the character n-grams of the case-folded, whitespace-collapsed texts (the yardstick)."""

    def grams(text: str) -> set[str]:
        t = " ".join(text.casefold().split())
        return {t[i : i + n] for i in range(max(1, len(t) - n + 1))}

    ga, gb = grams(a), grams(b)
    return len(ga & gb) / len(ga | gb)


def band_of(words: int) -> str:
    """The length band (of the original's words) a case is reported under."""
    lo, hi = next((b for b in LENGTH_BANDS if words <= b[1]), LENGTH_BANDS[-1])
    return f"{lo}-{hi}"


def jaccard_band(j: float) -> str:
    if j >= 1.0:
        return "1.0"
    for lo, hi in itertools.pairwise(JACCARD_BANDS):
        if j < hi:
            return f"{lo:.1f}-{hi:.1f}"
    return "1.0"


class Corpus:
    """Base texts of the wanted length mix, none sharing a word 13-gram with another (templates aside).

    Real texts are used once each: 60% as they are (the shorter bands), the others cut into sentences that long
    documents use once each, mixed with bigram-chain paragraphs. A candidate that shares a word 13-gram with an
    earlier base text (spam campaigns, quoted mail, a chain that copied a real run) is drawn again, so the only
    look-alikes among base texts are the templated requests, which must be kept.
    """

    def __init__(self, seed: int):
        self.rng = random.Random(seed)
        real = real_texts()
        self.rng.shuffle(real)
        whole, cut = real[: len(real) * 6 // 10], real[len(real) * 6 // 10 :]
        self.unused: dict[int, list[str]] = defaultdict(list)  # band index → unused real texts
        for text in whole:
            n = len(text.split())
            if n <= 3000:
                self.unused[self.band_index(n)].append(text)
        self.sentences = [s for text in cut for s in sentences(text) if len(s.split()) >= 4]
        self.banking = banking_questions()
        # the chain learns from the prose that is not used whole (so it cannot reproduce a base text, or an eval
        # item made from one) and not from mail (its footers and headers would come out as shared boilerplate)
        prose = set(real_texts(("vader", "rotten_tomatoes", "convention")))
        self.chain = Bigrams([text for text in cut if text in prose], self.rng)
        self.vocab = sorted({w.strip(".,!?;:\"'()") for text in real for w in text.split()} - {""})
        self.kinds: Counter[str] = Counter()
        self.grams: set[int] = set()  # crc32 of every word 13-gram of the accepted base texts

    @staticmethod
    def band_index(words: int) -> int:
        return next(i for i, (_lo, hi) in enumerate(LENGTH_BANDS) if words <= hi)

    def length(self) -> int:
        band = self.rng.choices(range(len(LENGTH_BANDS)), weights=BAND_WEIGHTS)[0]
        lo, hi = LENGTH_BANDS[band]
        return round(lo * (hi / lo) ** self.rng.random())

    def text(self) -> str:
        """A new base text (its origin counted in ``kinds``), redrawn at the same length while it overlaps."""
        n = self.length()
        for _attempt in range(50):
            kind, text = self._draw(n)
            words = re.findall(r"\w+", text.casefold())
            grams = {zlib.crc32(" ".join(words[i : i + 13]).encode()) for i in range(len(words) - 12)}
            if kind == "template" or not grams & self.grams:
                break
        self.grams |= grams
        self.kinds[kind] += 1
        return text

    def _draw(self, n: int) -> tuple[str, str]:
        band = self.band_index(n)
        roll = self.rng.random()
        if band <= 3 and self.unused[band] and roll < 0.5:
            return "real", self.unused[band].pop()
        if band == 0 and roll < 0.75:
            if self.rng.random() < 0.3:
                return "template", self.rng.choice(self.banking)  # exact repeats are skipped by the caller
            return "template", fill(self.rng.choice(TEMPLATES), self.rng)[0]
        if band >= 2:
            paragraphs: list[str] = []
            while sum(len(p.split()) for p in paragraphs) < n:
                if self.sentences and self.rng.random() < 0.3:
                    paragraphs.append(" ".join(self.sentences.pop() for _ in range(min(4, len(self.sentences)))))
                else:
                    paragraphs.append(self.chain.text(self.rng.randint(40, 90)))
            return "document", "\n\n".join(paragraphs)
        return "bigram chain", self.chain.text(n)


@dataclass
class Planted:
    rows: list[str]  # train states, in corpus order
    family: list[int]  # row → id of the text it derives from (planted copies share their original's)
    copies: list[dict[str, Any]]  # {"row", "origin", "kind", "band", "jaccard"}
    pairs: list[dict[str, Any]]  # look-alikes: {"a", "b", "band", "jaccard"}
    eval_items: list[str]
    contaminated: list[dict[str, Any]]  # {"row", "item", "kind", "band", "jaccard"}
    controls: list[dict[str, Any]]  # look-alikes of eval items: {"row", "item", "band", "jaccard"}


def build(base: int, seed: int) -> tuple[Planted, Corpus]:
    corpus = Corpus(seed)
    rng = corpus.rng
    seen: set[str] = set()
    texts: list[str] = []
    while len(texts) < base:  # distinct base texts (banking questions repeat: keep the first only)
        text = corpus.text()
        key = " ".join(text.casefold().split())
        if key not in seen:
            seen.add(key)
            texts.append(text)
    n_eval = base // 10
    eval_items, train = texts[:n_eval], texts[n_eval:]
    rows: list[tuple[str, int]] = [(t, i) for i, t in enumerate(train)]
    copies: list[dict[str, Any]] = []
    for origin in rng.sample(range(len(train)), k=len(train) // 4):
        for kind in rng.sample(EDIT_KINDS, k=len(EDIT_KINDS)):
            edited = apply_edit(kind, train[origin], corpus.vocab, rng)
            if edited is not None and edited.strip():
                copies.append({"text": edited, "origin": origin, "kind": kind})
                break

    def fresh_look_alike() -> tuple[str, str]:  # a pair that repeats no text already in the corpus
        while True:
            a, b = look_alike(rng.choice(TEMPLATES), rng)
            keys = {" ".join(t.casefold().split()) for t in (a, b)}
            if not keys & seen:
                seen.update(keys)
                return a, b

    pairs = [{"texts": fresh_look_alike()} for _ in range(max(200, base // 25))]
    contaminated: list[dict[str, Any]] = []
    for item in rng.sample(range(n_eval), k=n_eval * 6 // 10):
        for kind in rng.sample([*EDIT_KINDS, "embedded"], k=len(EDIT_KINDS) + 1):
            if kind == "embedded":
                edited = f"{corpus.chain.text(rng.randint(20, 60))} {eval_items[item]} {corpus.chain.text(20)}"
            else:
                edited = apply_edit(kind, eval_items[item], corpus.vocab, rng)
            if edited is not None and edited.strip():
                contaminated.append({"text": edited, "item": item, "kind": kind})
                break
    controls: list[dict[str, Any]] = []
    for _ in range(max(100, base // 50)):
        a, b = fresh_look_alike()
        controls.append({"item_text": a, "text": b})

    # assemble: every planted thing gets a family id; then shuffle the rows
    next_family = len(train)
    items: list[tuple[str, int, str, int]] = [(t, f, "base", f) for t, f in rows]
    items += [(c["text"], c["origin"], "copy", k) for k, c in enumerate(copies)]
    for k, p in enumerate(pairs):
        items += [(p["texts"][0], next_family, "pair_a", k), (p["texts"][1], next_family + 1, "pair_b", k)]
        next_family += 2
    for k, c in enumerate(contaminated):
        items.append((c["text"], next_family, "contaminated", k))
        next_family += 1
    for k, c in enumerate(controls):
        eval_items.append(c["item_text"])
        c["item"] = len(eval_items) - 1
        items.append((c["text"], next_family, "control", k))
        next_family += 1
    rng.shuffle(items)
    states = [t for t, _f, _w, _k in items]
    family = [f for _t, f, _w, _k in items]
    where: dict[tuple[str, int], int] = {(w, k): row for row, (_t, _f, w, k) in enumerate(items)}
    base_row = {k: where[("base", k)] for k in range(len(train))}

    for k, c in enumerate(copies):
        original = train[c["origin"]]
        c.update(
            row=where[("copy", k)],
            origin_row=base_row[c["origin"]],
            band=band_of(len(original.split())),
            jaccard=char_jaccard(original, c["text"]),
        )
        del c["text"]
    out_pairs = []
    for k, p in enumerate(pairs):
        a, b = p["texts"]
        out_pairs.append(
            {
                "a": where[("pair_a", k)],
                "b": where[("pair_b", k)],
                "band": band_of(len(a.split())),
                "jaccard": char_jaccard(a, b),
            }
        )
    for k, c in enumerate(contaminated):
        original = eval_items[c["item"]]
        c.update(
            row=where[("contaminated", k)],
            band=band_of(len(original.split())),
            jaccard=char_jaccard(original, c["text"]),
        )
        del c["text"]
    for k, c in enumerate(controls):
        c.update(
            row=where[("control", k)],
            band=band_of(len(c["item_text"].split())),
            jaccard=char_jaccard(c["item_text"], c["text"]),
        )
        del c["item_text"], c["text"]
    return Planted(states, family, copies, out_pairs, eval_items, contaminated, controls), corpus


# --------------------------------------------------------------------------------------------------- scoring


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

# questions whose decision hangs on a slot: (pattern, slots); numbers, names and years can be swapped for a look-alike
QUESTION_TEMPLATES: list[tuple[str, dict[str, list[str]]]] = [
    ("Is {c} the capital of {k}?", {"c": CITIES, "k": COUNTRIES}),
    ("Is {c} in {k}?", {"c": CITIES, "k": COUNTRIES}),
    ("Is {x} taller than {n} meters?", {"x": THINGS, "n": [str(n) for n in range(20, 900, 10)]}),
    ("Was {x} built before {y}?", {"x": THINGS, "y": [str(y) for y in range(1800, 2020, 5)]}),
    ("Does {p} live in {c}?", {"p": NAMES, "c": CITIES}),
    ("Is the population of {k} above {n} million?", {"k": COUNTRIES, "n": [str(n) for n in range(1, 200)]}),
    ("Did {p} visit {k} in {y}?", {"p": NAMES, "k": COUNTRIES, "y": [str(y) for y in range(1990, 2024)]}),
    (
        "Is the flight from {c} to {d} longer than {n} hours?",
        {"c": CITIES, "d": CITIES, "n": [str(n) for n in range(1, 20)]},
    ),
    ("Can {p} get a refund of {n} dollars for the order?", {"p": NAMES, "n": [str(n) for n in range(5, 500, 5)]}),
]
NUMBER_SLOTS = {"n", "y"}
NAME_SLOTS = {"c", "d", "k", "p", "x"}
GENERIC_STATES = [
    "Answer from general knowledge.",
    "Trivia",
    "General knowledge quiz, round one.",
    "Fact check",
    "Yes or no?",
    "Customer message",
    "Question from the help centre",
]
QUESTION_PHRASES = [" Answer yes or no.", " (true or false)", " Please answer.", " Is that right?", " Just checking."]
QUESTION_PREFIXES = ["Quick question: ", "True or false: ", "Honestly, "]
QUESTION_EDITS = ["case_punct", "ins1", "ins2", "del1", "typo", "phrase", "sub1_long"]
WHERE = ("state", "question", "both")
# the state edits of a copy (EDIT_KINDS) where the state is short: a one-word state replaced is another state
SHORT_STATE_EDITS = ["sub1", "ins1", "typo", "case_punct", "space_quotes", "greeting"]
TINY_STATE_EDITS = ["typo", "case_punct", "space_quotes", "greeting"]
LOOK_ALIKES = ("number", "negation", "name", "other question")


def negated(question: str) -> str | None:
    """The question with a negation: "Is X ...?" → "Is X not ...?" (after the subject's first word), or None."""
    words = question.split()
    aux = {"is", "was", "does", "did", "can", "are"}
    if len(words) < 3 or words[0].casefold() not in aux:
        return None
    if words[0].casefold() in ("is", "was", "are") and words[1][0].isupper():
        return " ".join([words[0], words[1], "not", *words[2:]])
    return " ".join([{"Can": "Can't"}.get(words[0], words[0] + "n't"), *words[1:]])


def question_edit(kind: str, question: str, vocab: list[str], rng: random.Random) -> str | None:
    """A copy's question: the edits a copied record meets (case and punctuation, a word or two inserted or left
    out, a typo, a phrase added) that keep what it asks. Inserted words are plain lower-case words, left-out words
    are neither numbers nor names (dropping the slot would ask another question); a replaced word only in a long
    question (20+ words), where one word does not make another question."""
    words = question.split()
    plain = [i for i, w in enumerate(words) if w.isalpha() and w.islower() and i > 0]
    if kind == "case_punct":
        out = rng.choice(
            [question.lower(), question.upper() if len(words) < 15 else question.lower(), question.title()]
        )
        out = out.rstrip("?!.") + rng.choice(["", ".", "??", " ?"])
        return out if out != question else None
    if kind in ("ins1", "ins2"):
        for _ in range(1 if kind == "ins1" else 2):
            words.insert(rng.randrange(1, len(words) + 1), rng.choice(vocab))
        return " ".join(words)
    if kind == "del1":
        if len(words) < 5 or not plain:
            return None
        del words[rng.choice(plain)]
        return " ".join(words)
    if kind == "typo":
        long_words = [i for i in plain if len(words[i]) >= 4]
        if not long_words:
            return None
        i = rng.choice(long_words)
        w = words[i]
        j = rng.randrange(len(w) - 1)
        words[i] = rng.choice([w[:j] + w[j + 1] + w[j] + w[j + 2 :], w[:j] + w[j + 1 :], w[:j] + w[j] + w[j:]])
        return " ".join(words) if " ".join(words) != question else None
    if kind == "phrase":
        if rng.random() < 0.7:
            return question + rng.choice(QUESTION_PHRASES)
        return rng.choice(QUESTION_PREFIXES) + question[0].lower() + question[1:]
    if kind == "sub1_long":
        if len(words) < 20 or not plain:
            return None
        i = rng.choice(plain)
        replacement = rng.choice(vocab)
        while replacement == words[i]:
            replacement = rng.choice(vocab)
        words[i] = replacement
        return " ".join(words)
    raise ValueError(kind)


@dataclass
class QuestionCase:
    state: str
    question: str
    kind: str  # of the base record: "template", "banking", "claim"
    slots: dict[str, str] | None = None
    template: int | None = None


@dataclass
class QuestionPlanted:
    rows: list[tuple[str, str]]  # (state, question) per row, in corpus order
    clean: list[int]  # rows that repeat nothing (base records and look-alikes)
    copies: list[dict[str, Any]]  # {"row", "origin_row", "where", "kind", "jaccard", "question_words", "state_words"}
    pairs: list[dict[str, Any]]  # look-alikes: {"a", "b", "kind", "jaccard"}
    eval_items: list[tuple[str, str]]
    contaminated: list[dict[str, Any]]  # {"row", "item", "where", "kind", "jaccard"}
    controls: list[dict[str, Any]]  # look-alikes of eval items: {"row", "item", "kind"}


def decision_jaccard(a: tuple[str, str], b: tuple[str, str]) -> float:
    """The yardstick of this fixture: character 5-gram Jaccard of state and question together."""
    return char_jaccard(f"{a[0]} {a[1]}", f"{b[0]} {b[1]}")


class QuestionCorpus:
    """Records whose content is in the question: templated trivia (slots: places, people, landmarks, numbers,
    years), real customer questions (banking77) and claims to verify made of real sentences (long questions,
    20-80 words), asked about a generic state ("Trivia"), a short real text (3-14 words) or a passage (15-60)."""

    def __init__(self, corpus: Corpus, seed: int):
        self.rng = random.Random(seed)
        self.corpus = corpus
        self.claims = [s for s in corpus.sentences if 8 <= len(s.split()) <= 40]
        self.rng.shuffle(self.claims)
        self.banking = list(dict.fromkeys(corpus.banking))
        self.rng.shuffle(self.banking)
        self.short = [t for band in (0,) for t in corpus.unused[band]]
        self.passages = [t for t in corpus.unused[1] if len(t.split()) <= 60]
        self.vocab = [w for w in corpus.vocab if w.isalpha() and w.islower() and len(w) >= 2]
        self.asked: set[str] = set()

    def state(self, generic: bool = False) -> str:
        """A generic state (shared by many records), or a short text or a passage of its own (used once)."""
        roll = self.rng.random()
        if generic or roll < 0.5 or not self.short:
            return self.rng.choice(GENERIC_STATES)
        if roll < 0.85 or not self.passages:
            return self.short.pop()
        return self.passages.pop()

    def question(self) -> QuestionCase:
        while True:
            roll = self.rng.random()
            if roll < 0.55:
                template = self.rng.randrange(len(QUESTION_TEMPLATES))
                text, slots = fill(QUESTION_TEMPLATES[template], self.rng)
                case = QuestionCase(self.state(), text, "template", slots, template)
            elif roll < 0.8 and self.banking:
                case = QuestionCase(self.state(), self.banking.pop(), "banking")
            elif len(self.claims) >= 2:
                claim = " ".join(self.claims.pop() for _ in range(self.rng.choice((1, 1, 2))))
                frame = self.rng.choice(["Is it true that {}?", "Claim: {} Is this claim supported?", "{} True?"])
                case = QuestionCase(self.state(), frame.format(claim.rstrip(".!?")), "claim")
            else:
                continue
            key = " ".join(case.question.casefold().split())
            if key not in self.asked:  # every base question is asked once (a question asked often is an instruction)
                self.asked.add(key)
                return case

    def look_alike(self, kind: str, generic: bool = False) -> tuple[tuple[str, str], tuple[str, str]]:
        """Two records that ask different questions about one state: another number, a negation, another name, or
        another question about the same passage (``generic``: a generic state, so that only the question can make
        one of them a copy of the other: an eval item's passage in a training row is contamination whatever the
        question)."""
        while True:
            template = self.rng.randrange(len(QUESTION_TEMPLATES))
            pattern, slots = QUESTION_TEMPLATES[template]
            first, values = fill(QUESTION_TEMPLATES[template], self.rng)
            state = self.state(generic)
            if kind == "negation":
                other = negated(first)
            elif kind == "other question":
                state = self.passages.pop() if self.passages else state
                other = fill(QUESTION_TEMPLATES[(template + 1) % len(QUESTION_TEMPLATES)], self.rng)[0]
            else:
                wanted = NUMBER_SLOTS if kind == "number" else NAME_SLOTS
                names = sorted(set(slots) & wanted)
                if not names:
                    continue
                slot = self.rng.choice(names)
                changed = dict(values)
                while changed[slot] == values[slot]:
                    changed[slot] = self.rng.choice(slots[slot])
                other = pattern.format(**changed)
            keys = {" ".join(q.casefold().split()) for q in (first, other or "")}
            if other and len(keys) == 2 and not keys & self.asked:
                self.asked |= keys
                return (state, first), (state, other)

    def copy(self, case: tuple[str, str], rng: random.Random, where: str) -> tuple[tuple[str, str], str] | None:
        """An edited copy of (state, question): the state edited by one of the state benchmark's edits, the
        question by one of QUESTION_EDITS, or both; with the kinds applied joined by "+"."""
        state, question = case
        kinds = []
        if where in ("state", "both"):
            n = len(state.split())
            kinds_here = EDIT_KINDS[1:] if n >= 6 else SHORT_STATE_EDITS if n >= 3 else TINY_STATE_EDITS
            for kind in rng.sample(kinds_here, k=len(kinds_here)):
                edited = apply_edit(kind, state, self.vocab, rng)
                if edited is not None and edited.strip() and edited != state:
                    state, kinds = edited, [kind]
                    break
            else:
                return None
        if where in ("question", "both"):
            for kind in rng.sample(QUESTION_EDITS, k=len(QUESTION_EDITS)):
                edited = question_edit(kind, question, self.vocab, rng)
                if edited is not None and edited != question:
                    question, kinds = edited, [*kinds, kind]
                    break
            else:
                return None
        return (state, question), "+".join(kinds)


def build_questions(base: int, seed: int, corpus: Corpus) -> QuestionPlanted:
    qc = QuestionCorpus(corpus, seed)
    rng = qc.rng
    cases = [qc.question() for _ in range(base)]
    n_eval = base // 10
    eval_items = [(c.state, c.question) for c in cases[:n_eval]]
    train = [(c.state, c.question) for c in cases[n_eval:]]
    items: list[tuple[tuple[str, str], str, int]] = [(t, "base", k) for k, t in enumerate(train)]
    copies: list[dict[str, Any]] = []
    for origin in rng.sample(range(len(train)), k=len(train) // 4):
        made = qc.copy(train[origin], rng, rng.choice(WHERE))
        if made is not None:
            copies.append({"text": made[0], "origin": origin, "kind": made[1]})
    pairs: list[dict[str, Any]] = []
    for k in range(max(200, base // 10)):
        a, b = qc.look_alike(LOOK_ALIKES[k % len(LOOK_ALIKES)])
        pairs.append({"texts": (a, b), "kind": LOOK_ALIKES[k % len(LOOK_ALIKES)]})
    contaminated: list[dict[str, Any]] = []
    for item in rng.sample(range(n_eval), k=n_eval * 6 // 10):
        made = qc.copy(eval_items[item], rng, rng.choice(WHERE))
        if made is not None:
            contaminated.append({"text": made[0], "item": item, "kind": made[1]})
    controls: list[dict[str, Any]] = []
    for k in range(max(100, base // 50)):
        kind = LOOK_ALIKES[k % 3]
        a, b = qc.look_alike(kind, generic=True)
        eval_items.append(a)
        controls.append({"text": b, "item": len(eval_items) - 1, "kind": kind})
    items += [(c["text"], "copy", k) for k, c in enumerate(copies)]
    for k, p in enumerate(pairs):
        items += [(p["texts"][0], "pair_a", k), (p["texts"][1], "pair_b", k)]
    items += [(c["text"], "contaminated", k) for k, c in enumerate(contaminated)]
    items += [(c["text"], "control", k) for k, c in enumerate(controls)]
    rng.shuffle(items)
    where = {(w, k): row for row, (_t, w, k) in enumerate(items)}
    rows = [t for t, _w, _k in items]
    out_copies = []
    for k, c in enumerate(copies):
        original = train[c["origin"]]
        edit = c["kind"]
        place = "both" if "+" in edit else ("question" if edit in QUESTION_EDITS else "state")
        out_copies.append(
            {
                "row": where[("copy", k)],
                "origin_row": where[("base", c["origin"])],
                "where": place,
                "kind": edit,
                "jaccard": decision_jaccard(original, c["text"]),
                "question_words": len(original[1].split()),
                "state_words": len(original[0].split()),
            }
        )
    out_pairs = [
        {
            "a": where[("pair_a", k)],
            "b": where[("pair_b", k)],
            "kind": p["kind"],
            "jaccard": decision_jaccard(*p["texts"]),
        }
        for k, p in enumerate(pairs)
    ]
    out_contaminated = []
    for k, c in enumerate(contaminated):
        edit = c["kind"]
        place = "both" if "+" in edit else ("question" if edit in QUESTION_EDITS else "state")
        out_contaminated.append(
            {
                "row": where[("contaminated", k)],
                "item": c["item"],
                "where": place,
                "kind": edit,
                "jaccard": decision_jaccard(eval_items[c["item"]], c["text"]),
            }
        )
    out_controls = [
        {"row": where[("control", k)], "item": c["item"], "kind": c["kind"]} for k, c in enumerate(controls)
    ]
    clean = sorted(
        [where[("base", k)] for k in range(len(train))]
        + [row for p in out_pairs for row in (p["a"], p["b"])]
        + [c["row"] for c in out_controls]
    )
    return QuestionPlanted(rows, clean, out_copies, out_pairs, eval_items, out_contaminated, out_controls)


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
