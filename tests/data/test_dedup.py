"""Exact and near dedup: planted duplicates go, distinct rows stay, signatures are datasketch's MinHash."""

from __future__ import annotations

import numpy as np
import pytest
from prepare_builders import CHOICE, NOUL, make, sentence

from mydecide.data.dedup import exact_duplicates, exact_key
from mydecide.data.lookalikes import different_slots, misspelt
from mydecide.data.near_dedup import estimated_jaccard, fold32, lsh_bands, near_duplicates, signatures
from mydecide.data.shingles import Shingling, char_shingle, jaccard, shingle, shingle_text, tokens
from mydecide.records import parse_record


def test_signatures_equal_datasketch_minhash_of_the_same_shingles() -> None:
    from datasketch import MinHash

    texts = [sentence(1), sentence(2, 3), "!!", "中文文本的去重测试", sentence(3, 200)]
    shingles = shingle(texts, 5)
    sigs = signatures(shingles, num_perm=64, seed=7, block=16)  # a tiny block: texts span blocks
    for i in range(len(texts)):
        reference = MinHash(num_perm=64, seed=7, hashfunc=int)
        reference.update_batch(fold32(shingles.of(i)).tolist())
        assert np.array_equal(reference.hashvalues, sigs[i]), texts[i][:30]


def test_shingles_are_word_ngrams_and_short_texts_are_one_shingle() -> None:
    shingles = shingle(["a b c d e f", "a b", "", "A  B, c d e."], 5)
    assert np.diff(shingles.offsets).tolist() == [2, 1, 1, 1]
    # case and punctuation do not matter: "A B, c d e." has the 5-gram "a b c d e" of the first text
    assert shingles.of(3)[0] == shingles.of(0)[0]
    assert np.diff(shingle(["a b c d e f", "a b"], 5, short="skip").offsets).tolist() == [2, 0]
    # CJK characters are words of their own
    assert tokens("中文 text") == ["中", "文", "text"]


def test_estimated_jaccard_tracks_the_true_jaccard() -> None:
    a = sentence(10, 120).split()
    b = [*a[:60], "zzz", *a[61:]]  # one substitution: 5 of 116 five-grams change
    sigs = signatures(shingle([" ".join(a), " ".join(b), sentence(11, 120)], 5), num_perm=256)
    true = 111 / 121
    assert abs(estimated_jaccard(sigs[0], sigs[1:2])[0] - true) < 0.06
    assert estimated_jaccard(sigs[0], sigs[2:3])[0] < 0.05


def test_exact_duplicates_use_the_normalised_key() -> None:
    base = make(1, state="Checkout returns HTTP 500 since 09:10.")
    same = make(2, state="  checkout RETURNS http 500\n since 09:10.  ")
    shuffled = make(3, state=base["state"], question={**CHOICE, "criteria": dict(reversed(CHOICE["criteria"].items()))})
    other_question = make(4, state=base["state"], question=NOUL)
    other_state = make(5, state="Checkout returns HTTP 502 since 09:10.")
    records = [parse_record(r)[0] for r in (base, same, shuffled, other_question, other_state)]
    removed = exact_duplicates([exact_key(r) for r in records])
    assert removed == {1: 0, 2: 0}


def test_score_level_order_is_part_of_the_exact_key() -> None:
    up = parse_record(make(1, question={"type": "score", "instructions": "How?", "criteria": ["low", "high"]}))[0]
    down = parse_record(make(1, question={"type": "score", "instructions": "How?", "criteria": ["high", "low"]}))[0]
    assert exact_key(up) != exact_key(down)


def test_near_duplicates_removes_planted_copies_and_keeps_distinct_rows() -> None:
    texts = [sentence(i, 60) for i in range(40)]
    planted = {}
    for origin in (3, 17, 25):
        words = texts[origin].split()
        words[30] = "substituted"  # one word edit: Jaccard 51/61 ≈ 0.84
        planted[len(texts)] = origin
        texts.append(" ".join(words))
    removed = near_duplicates(texts, threshold=0.7, num_perm=128, ngram=5)
    assert {i: m.kept for i, m in removed.items()} == planted
    assert all(0.7 <= m.similarity <= 1.0 for m in removed.values())


def test_near_duplicates_keep_the_first_of_a_cluster_and_respect_groups() -> None:
    base = sentence(5, 60).split()
    variants = [" ".join([*base[:k], "edit", *base[k + 1 :]]) for k in (10, 30, 50)]
    texts = [variants[0], variants[1], variants[2], " ".join(base)]
    removed = near_duplicates(texts, threshold=0.6)
    assert sorted(removed) == [1, 2, 3] and all(m.kept == 0 for m in removed.values())
    # the same state asked a different question is not a duplicate
    removed = near_duplicates(texts, threshold=0.6, groups=["a", "b", "a", "b"])
    assert {i: m.kept for i, m in removed.items()} == {2: 0, 3: 1}


@pytest.mark.parametrize("threshold", [0.5, 0.7, 0.8, 0.9])
def test_lsh_bands_catch_pairs_at_the_threshold(threshold: float) -> None:
    b, r = lsh_bands(threshold, 128)
    assert b * r <= 128
    assert 1 - (1 - threshold**r) ** b >= 0.95
    assert 1 - (1 - (threshold + 0.05) ** r) ** b >= 0.99
    # and it is the largest band size that does
    assert r + 1 > 128 // 2 or 1 - (1 - threshold ** (r + 1)) ** (128 // (r + 1)) < 0.95


def test_character_shingles_ignore_case_punctuation_spacing_and_quotes() -> None:
    shingling = Shingling()  # the default: character 5-grams of the normalised text
    assert shingling.set("He said: \u201cHello\u201d,\n  World!") == shingling.set("he said hello world")
    assert shingle_text("Don't  STOP!") == "don t stop"
    assert shingling.set("hi") == {"hi"}  # a text shorter than n is one shingle
    sigs = signatures(char_shingle(["He said: Hello, World!", "he said hello world"], 5))
    assert np.array_equal(sigs[0], sigs[1])


def test_char_signatures_equal_datasketch_minhash_of_the_same_shingles() -> None:
    from datasketch import MinHash

    texts = ["set an alarm for 7 am", "ok", sentence(4, 300), "中文文本的去重测试"]
    shingles = char_shingle(texts, 5)
    # CJK characters are words: "中 文 文 本 …" (17 characters) has 13 five-character shingles
    assert np.diff(shingles.offsets).tolist() == [17, 1, len(shingle_text(texts[2])) - 4, 13]
    sigs = signatures(shingles, num_perm=32, seed=3, block=64)
    for i in range(len(texts)):
        reference = MinHash(num_perm=32, seed=3, hashfunc=int)
        reference.update_batch(fold32(shingles.of(i)).tolist())
        assert np.array_equal(reference.hashvalues, sigs[i]), texts[i][:30]


SHORT = "my package still has not arrived and the tracking page shows nothing"  # 12 words


def test_a_short_text_with_one_word_changed_is_a_near_duplicate() -> None:
    copy = SHORT.replace("package", "parcel")
    # word 5-grams (the default before character shingles): 5 of the 8 shingles change, Jaccard 3/13, kept
    assert near_duplicates([SHORT, copy], unit="word", ngram=5, threshold=0.8) == {}
    removed = near_duplicates([SHORT, copy])
    assert list(removed) == [1] and removed[1].kept == 0 and 0.7 <= removed[1].similarity < 0.9
    # other typical edits of a short text are found as well
    edits = [
        SHORT.upper() + "!!",
        SHORT.replace("tracking", "trackign"),
        f"Hi team, {SHORT}. Thanks, Anna",
        SHORT.replace("still ", ""),
        SHORT.replace(" ", "  ").replace("page", "page,"),
    ]
    removed = near_duplicates([SHORT, *edits])
    assert sorted(removed) == [1, 2, 3, 4, 5] and {m.kept for m in removed.values()} == {0}


@pytest.mark.parametrize(
    "a, b",
    [
        ("set an alarm for 7 am", "set an alarm for 9 pm"),
        ("book a table for 4 at 7 pm tonight", "book a table for 4 at 7 pm tomorrow"),
        ("remind me to call Anna at 6 am", "remind me to call Anna at 6:30 am"),
        (
            "translate good morning into the language spoken in Spain",
            "translate good morning into the language spoken in Japan",
        ),
        ("please turn the kitchen lights on", "please turn the kitchen lights off"),
        ("I liked the new update a lot", "I didn't like the new update a lot"),
    ],
)
def test_short_look_alikes_with_another_slot_value_are_kept(a: str, b: str) -> None:
    assert different_slots(a, b) and different_slots(b, a)
    assert near_duplicates([a, b]) == {}
    # with the check off, the pair is judged on its shingles alone
    if jaccard(Shingling().set(a), Shingling().set(b)) >= 0.7:
        assert list(near_duplicates([a, b], keep_slot_changes=False)) == [1]


def test_case_a_typo_or_a_changed_common_word_is_not_a_slot_change() -> None:
    a = "what is the capital of France?"
    assert not different_slots(a, "What is the capital of FRANCE")
    assert not different_slots(a, "what is the capital of Frnace?")  # a misspelt name is the same name
    assert not different_slots(SHORT, SHORT.replace("package", "parcel"))
    assert not different_slots(" ".join([SHORT] * 3), " ".join([SHORT] * 3).replace("7", "9"))  # long texts


def test_a_misspelt_negation_is_a_typo_but_a_dropped_one_is_a_slot_change() -> None:
    a = "Glengarry Glen Ross without the Mamet dialogue is kinda what you get here."
    assert not different_slots(a, a.replace("without", "wiithout"))  # a typo: still a near duplicate
    assert list(near_duplicates([a, a.replace("without", "wiithout")])) == [1]
    assert different_slots("I have never been to Lima", "I have ever been to Lima")  # the negation dropped
    assert [misspelt(*pair) for pair in [("quite", "quuite"), ("they", "thye"), ("card", "cart")]] == [
        True,
        True,
        True,
    ]
    assert [misspelt(*pair) for pair in [("cat", "car"), ("jazz", "bach"), ("1234", "1243")]] == [
        False,
        False,
        False,
    ]
