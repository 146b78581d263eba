"""The fixtures of ``bench_dedup.py``: the corpus it plants copies in, and the copies, look-alikes and eval items.

Two fixtures, built from the real texts shipped in ``data_sources/samples/`` and the banking77 questions in
``bench/data/``:

- **states** (``build``): base texts of 3 to 3,000 words, short-heavy (``Corpus``: real texts, a word-bigram chain
  trained on them, documents of real sentences, templated requests), with planted near-duplicates made by one edit
  kind (``apply_edit``), look-alike pairs that differ in one template slot (``look_alike``), contaminated copies of
  eval items and look-alikes of eval items;
- **questions** (``build_questions``): records whose content is in the question (``QuestionCorpus``: templated
  trivia, banking questions, claims to verify, about a generic state, a short text or a passage), with copies whose
  state, question or both are edited (``question_edit``), look-alikes (another number, a negation, another name,
  another question about one passage), contaminated copies and look-alikes of eval items.

Each fixture records, per planted row, what it was made from, how (the edit kind) and how similar it is (the
character 5-gram Jaccard of ``char_jaccard``, the benchmark's yardstick); ``bench_dedup.py`` runs the rows through
``prepare()`` and scores its rejects against that. Everything is drawn from one ``random.Random(seed)``, so a seed
gives the same corpus every time.
"""

from __future__ import annotations

import csv
import itertools
import random
import re
import zlib
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Any

from _common import BENCH, ROOT

SAMPLES = ROOT / "data_sources" / "samples"
LENGTH_BANDS = [(3, 14), (15, 49), (50, 199), (200, 999), (1000, 3000)]
BAND_WEIGHTS = [0.40, 0.30, 0.18, 0.09, 0.03]  # short-heavy: intents, tweets, tickets, reviews, then documents
EDIT_KINDS = ["exact", "sub1", "ins1", "del1", "few", "typo", "case_punct", "space_quotes", "greeting", "drop_sentence"]

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
