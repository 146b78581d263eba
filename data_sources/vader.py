"""VADER human sentiment ratings (Hutto & Gilbert 2014): how positive is a short text (score, or noul).

Texts are tweets, movie-review snippets, New York Times editorial snippets and Amazon review snippets, each
rated by at least 20 people from -4 (extremely negative) to +4 (extremely positive); the files give the mean.

``form="score"`` (default; task ``vader_sentiment_score``): 5 levels from the mean rating m, lowest first —
very negative (m ≤ -2), negative (-2 < m ≤ -0.5), neutral (-0.5 < m < 0.5), positive (0.5 ≤ m < 2), very
positive (m ≥ 2). The cut points at ±0.5 and ±2 give every level a usable share of the data (over all four
corpora: 11%, 27%, 18%, 28%, 16%).

``form="noul"`` (task ``vader_sentiment_positive``): "Is the sentiment of this text positive?", answered yes
when m ≥ 0.5 and no when m ≤ -0.5. Rows with |m| < 0.5 have no yes/no label: they are yielded as error rows
with the reason "neutral rating, no yes/no label", so they are counted in the manifest rather than lost.

Files: the ratings' own ``<corpus>_GroundTruth.txt`` files (tab-separated id, mean rating, text; no header), a
directory holding them, or (no path) the shipped sample ``samples/vader_*_GroundTruth.txt`` (1500 rows, 300
per level; see samples/ATTRIBUTION.md). The vaderSentiment wheel does not ship the ratings, only its sdist
does. Records: id ``vader-<corpus>-<id>``, lang ``en``, meta ``{"corpus", "mean_rating"}``.

The raters: where ``<corpus>_anonDataRatings.txt`` sits beside a ground-truth file (id, mean, standard deviation,
then every rater's rating as a list; the sdist has one per corpus, and so does the shipped sample), each score
record also gets ``meta.raters`` (how many rated it) and ``meta.soft_target``: the share of raters whose own rating
falls in each level, by the same bins. ``prepare`` trains on that distribution where the data recipe sets
``augment.soft_targets``; dev and test keep the level of the mean (docs/records.md#training-only-soft-targets).
The level of the mean stays the answer even where a corpus's two files disagree on the mean (14 of the sample's
tweets, by up to 0.8). A text the ratings file lacks gets no soft target; a ratings line that cannot be read is an
error row.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from data_sources._files import SAMPLES, capped, error_row, existing, open_text

LEVELS = ["very negative", "negative", "neutral", "positive", "very positive"]
SCORE_TASK, NOUL_TASK = "vader_sentiment_score", "vader_sentiment_positive"
SCORE_INSTRUCTIONS = "How positive or negative is the sentiment of this text?"
NOUL_INSTRUCTIONS = "Is the sentiment of this text positive?"
NEUTRAL_REASON = "neutral rating, no yes/no label"


def level(mean: float) -> int:
    """The score level (0..4) of a mean rating on the -4..4 scale."""
    if mean <= -2.0:
        return 0
    if mean <= -0.5:
        return 1
    if mean < 0.5:
        return 2
    if mean < 2.0:
        return 3
    return 4


def rating_files(path: str | Path | None) -> list[Path]:
    """The ``*_GroundTruth.txt`` files to read: the file, those in a directory, or the shipped sample."""
    if path is None:
        files = sorted(SAMPLES.glob("vader_*_GroundTruth.txt"))
        if not files:
            raise FileNotFoundError(f"{SAMPLES}: the shipped sample vader_*_GroundTruth.txt is missing")
        return files
    p = existing(path)
    if p.is_dir():
        files = sorted(p.glob("*_GroundTruth.txt"))
        if not files:
            raise FileNotFoundError(f"{p}: no *_GroundTruth.txt rating files in this directory")
        return files
    return [p]


def corpus_of(path: Path) -> str:
    """``tweets_GroundTruth.txt`` and ``vader_tweets_GroundTruth.txt`` → ``tweets``."""
    return path.name.split("_GroundTruth")[0].split("_")[-1]


def rater_file(ground_truth: Path) -> Path:
    """``x_GroundTruth.txt`` → ``x_anonDataRatings.txt`` (the same directory)."""
    return ground_truth.with_name(ground_truth.name.replace("_GroundTruth", "_anonDataRatings"))


def rater_levels(path: Path) -> Iterator[tuple[str, str, tuple[dict[str, float], int] | str]]:
    """``(id, "file:line", ({level: share of raters}, raters) or the reason the line cannot be read)`` per line of a
    ``*_anonDataRatings.txt`` file."""
    with open_text(path) as handle:
        for number, line in enumerate(handle, start=1):
            line = line.rstrip("\r\n").lstrip("\ufeff")
            if not line.strip():
                continue
            where, fields = f"{path.name}:{number}", line.split("\t")
            if len(fields) != 4:
                yield fields[0], where, "line must have 4 tab-separated fields: id, mean, sd, [ratings]"
                continue
            try:
                ratings = [float(r) for r in fields[3].strip().strip("[]").split(",")]
            except ValueError:
                yield fields[0], where, f"field 4 {fields[3][:40]!r} is not a list of numbers"
                continue
            if not ratings or any(not -4.0 <= r <= 4.0 for r in ratings):
                yield fields[0], where, "field 4 must list ratings in -4..4"
                continue
            counts = [0] * len(LEVELS)
            for r in ratings:
                counts[level(r)] += 1
            shares = {name: c / len(ratings) for name, c in zip(LEVELS, counts, strict=True)}
            yield fields[0], where, (shares, len(ratings))


def _records(files: list[Path], form: str) -> Iterator[dict[str, Any]]:
    for file in files:
        corpus = corpus_of(file)
        raters: dict[str, tuple[dict[str, float], int]] = {}
        if form == "score" and rater_file(file).is_file():
            for rid, where, read in rater_levels(rater_file(file)):
                if isinstance(read, str):
                    yield error_row(where, read, rid)
                else:
                    raters[rid] = read
        with open_text(file) as handle:
            for number, line in enumerate(handle, start=1):
                line = line.rstrip("\r\n").lstrip("\ufeff")
                if not line.strip():
                    continue
                where = f"{file.name}:{number}"
                fields = line.split("\t", 2)
                if len(fields) != 3:
                    reason = "line must have 3 tab-separated fields: id, mean rating, text"
                    yield error_row(where, reason, line)
                    continue
                rid, rating, text = fields
                try:
                    mean = float(rating)
                except ValueError:
                    yield error_row(where, f"field 2 (mean rating) {rating!r} is not a number", line)
                    continue
                if not -4.0 <= mean <= 4.0:
                    yield error_row(where, f"field 2 (mean rating) {mean} is outside -4..4", line)
                    continue
                if not rid.strip() or not text.strip():
                    yield error_row(where, "field 1 (id) or field 3 (text) is empty", line)
                    continue
                base = {
                    "id": f"vader-{corpus}-{rid.strip()}",
                    "lang": "en",
                    "state": text.strip(),
                    "meta": {"corpus": corpus, "mean_rating": mean},
                    "_where": where,
                }
                if form == "score":
                    if rid.strip() in raters:
                        shares, count = raters[rid.strip()]
                        base["meta"] |= {"raters": count, "soft_target": shares}
                    yield {
                        **base,
                        "task": SCORE_TASK,
                        "answer": level(mean),
                        "question": {"type": "score", "instructions": SCORE_INSTRUCTIONS, "criteria": list(LEVELS)},
                    }
                elif abs(mean) < 0.5:
                    yield error_row(where, NEUTRAL_REASON, line)
                else:
                    yield {
                        **base,
                        "task": NOUL_TASK,
                        "answer": mean > 0,
                        "question": {"type": "noul", "instructions": NOUL_INSTRUCTIONS},
                    }


def convert(
    path: str | None = None, *, limit: int | None = None, seed: int = 13, form: str = "score"
) -> Iterator[dict[str, Any]]:
    """Yield one record per rated text (no randomness; ``path`` None reads the shipped sample)."""
    if form not in ("score", "noul"):
        raise ValueError(f"vader source: option 'form' must be 'score' or 'noul', got {form!r}")
    return capped(_records(rating_files(path), form), limit)
