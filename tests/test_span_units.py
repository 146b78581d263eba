"""Span units (mydecide/spans.py): text without spaces is cut into units that can hold a name or a number, offsets
stay exact in code points, and a gold grid maps back to its gold spans on CJK, Thai and Korean PII texts."""

from __future__ import annotations

import random

import pytest
import regex

from mydecide.spans import Span, merge_spans, parse_gold_spans, spans_of_grid, words

LABELS = ("PERSON", "EMAIL", "PHONE")


def texts(units: list[tuple[int, int]], text: str) -> list[str]:
    return [text[a:b] for a, b in units]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("plain words, as before.", ["plain", "words,", "as", "before."]),
        (
            "请联系王小明，电话13812345678。",
            ["请", "联", "系", "王", "小", "明", "，", "电", "话", "13812345678", "。"],
        ),
        ("田中さんはtanaka@ex.jpです", ["田", "中", "さ", "ん", "は", "tanaka@ex.jp", "で", "す"]),
        ("김철수씨가 010-1234-5678로", ["김", "철", "수", "씨", "가", "010-1234-5678", "로"]),
        ("ชื่อสมชาย", ["ชื่", "อ", "ส", "ม", "ช", "า", "ย"]),  # a base with its marks is one cluster
        ("Hej 👩‍👩‍👧 🇸🇪 e\u0301té", ["Hej", "👩‍👩‍👧", "🇸🇪", "e\u0301té"]),  # no CJK: cut at whitespace only
    ],
)
def test_units(text: str, expected: list[str]) -> None:
    assert texts(words(text), text) == expected


NON_ASCII = [
    "Hej 😀 Åsa Öberg, och 李小龙 skrev från zoë@exämple.se 🇸🇪 idag.",
    "Family 👩‍👩‍👧‍👦 and flags 🇯🇵🇰🇷 next to 東京タワー and ｅｍａｉｌ：ｔａｒｏ＠ｅｘ．ｊｐ",
    "Combining: Zoe\u0308 Bjo\u0308rk, Ame\u0301lie, नमस्ते दुनिया, ক্ষমা",
    "RTL: שלום עולם, مرحبا بالعالم 0501234567 and العربية123",
    "混合テキスト：王小明（13812345678）、김민수님, ผมชื่อสมชาย โทร 0812345678",
]


@pytest.mark.parametrize("text", NON_ASCII)
def test_every_unit_and_returned_span_lies_on_grapheme_boundaries(text: str) -> None:
    """Any grid of probabilities gives spans whose text is part[start:end] and whose ends fall between grapheme
    clusters; units cover every non-space character once."""
    boundaries = {m.start() for m in regex.finditer(r"\X", text)} | {len(text)}
    units = words(text)
    assert all(a in boundaries and b in boundaries for a, b in units)
    assert "".join(texts(units, text)) == "".join(text.split())
    rng = random.Random(len(text))
    for _ in range(50):
        grid = [rng.random() for _ in range(len(units) * len(LABELS))]
        for span in merge_spans(text, grid, LABELS):
            assert span["text"] == text[span["start"] : span["end"]] and span["text"].strip()
            assert span["start"] in boundaries and span["end"] in boundaries


def pii_fixture(n: int = 300) -> list[tuple[str, tuple[Span, ...]]]:
    """Texts in Chinese, Japanese, Korean and Thai with names, phone numbers and e-mail addresses placed in them as
    people write them: no space around a name, a number right after a word, punctuation of either width."""
    from faker import Faker

    templates = {
        "zh_CN": [
            "您好，我是{PERSON}，电话{PHONE}，邮箱{EMAIL}。",
            "请联系{PERSON}（手机：{PHONE}）或发邮件到{EMAIL}",
            "{PERSON}的订单已发货，如有问题请拨打{PHONE}。",
            "客户{PERSON}说邮箱{EMAIL}收不到验证码",
        ],
        "ja_JP": [
            "担当の{PERSON}です。お電話は{PHONE}まで。",
            "{PERSON}様、メール{EMAIL}宛にご連絡しました。",
            "問い合わせ：{PERSON}（{PHONE}）、{EMAIL}",
        ],
        "ko_KR": ["{PERSON}님이 {PHONE}로 전화했습니다.", "담당자 {PERSON}, 이메일 {EMAIL}입니다."],
        "th_TH": ["ผมชื่อ{PERSON} โทร {PHONE} อีเมล {EMAIL}", "ติดต่อคุณ{PERSON}ที่เบอร์ {PHONE}"],
    }
    rng = random.Random(7)
    fakers = {locale: Faker(locale) for locale in templates}
    for locale, fake in fakers.items():
        fake.seed_instance(len(locale))
    out = []
    for _ in range(n):
        locale = rng.choice(list(templates))
        fake = fakers[locale]
        template = rng.choice(templates[locale])
        text, spans = "", []
        for literal, field in regex.findall(r"([^{]*)(?:\{(\w+)\})?", template):
            text += literal
            if field:
                value = {"PERSON": fake.name, "PHONE": fake.phone_number, "EMAIL": fake.email}[field]()
                spans.append(Span(len(text), len(text) + len(value), field))
                text += value
        out.append((text, tuple(sorted(spans))))
    return out


def test_the_gold_grid_ceiling_on_cjk_pii_texts() -> None:
    """Marking every unit that overlaps a gold span, then merging the grid back, finds the gold spans exactly: the
    best a word × label read can do on these texts (whitespace units alone: a name inside Chinese text cannot be
    located)."""
    found = gold = right = 0
    whitespace_only = 0
    for text, spans in pii_fixture():
        parse_gold_spans([{"label": s.label, "start": s.start, "end": s.end} for s in spans], text, LABELS)
        units = words(text)
        grid = [0.0] * (len(units) * len(LABELS))
        for span in spans:
            for i, (a, b) in enumerate(units):
                if a < span.end and span.start < b:
                    grid[i * len(LABELS) + LABELS.index(span.label)] = 1.0
        back = set(spans_of_grid(text, grid, LABELS))
        found, gold, right = found + len(back), gold + len(spans), right + len(back & set(spans))
        runs = [m.span() for m in regex.finditer(r"\S+", text)]
        whitespace_only += sum(any(a == s.start for a, _ in runs) and any(b == s.end for _, b in runs) for s in spans)
    precision, recall = right / found, right / gold
    f1 = 2 * precision * recall / (precision + recall)
    assert f1 >= 0.95, (precision, recall)
    assert whitespace_only / gold < 0.5  # whitespace runs alone could not even delimit most of these spans
