"""Look-alikes: short texts that differ in what a decision hangs on ("set an alarm for 7 am" / "... 9 pm") are
not duplicates however similar their shingles, and a misspelt word is not another word; :func:`small_edit` says
when a short text is another one with a word or two inserted, left out or replaced, or a phrase added."""

from __future__ import annotations

import re
from difflib import SequenceMatcher
from functools import lru_cache

from mydecide.data.shingles import TOKEN, tokens

# ------------------------------------------------------------------------------------------------ look-alikes

SLOT_WORDS = 24  # texts up to this many words are checked for a changed slot
QUESTION_SLOT_WORDS = 64  # ... questions up to this many (a claim to verify is a long question)
EDIT_WORDS = 2  # words a small edit inserts, leaves out or replaces (small_edit)
AFFIX_WORDS = 6  # words of a phrase a small edit adds or drops at the start or the end
EDIT_MAX_WORDS = 48  # longer texts are compared by their shingles only
NEGATIONS = frozenset(
    {"not", "no", "never", "none", "nothing", "nobody", "nowhere", "neither", "nor", "without", "cannot", "t"}
)  # "t": the tokens of "don't" are "don", "t"
SWITCHES = frozenset({"on", "off", "yes", "no", "open", "close", "closed", "up", "down"})  # count when swapped
TIME_WORDS = frozenset(
    {
        "am",
        "pm",
        "noon",
        "midnight",
        "today",
        "tonight",
        "tomorrow",
        "yesterday",
        "morning",
        "afternoon",
        "evening",
        "night",
        "week",
        "weekend",
        "month",
        "year",
        "hour",
        "hours",
        "minute",
        "minutes",
        "day",
        "days",
    }
)
_TYPO = 0.7  # two words at least this similar (difflib ratio) are one word misspelt, not two entities


def different_slots(a: str, b: str, max_words: int = SLOT_WORDS) -> bool:
    """Whether two short, similar texts differ in what a decision hangs on, so both must be kept.

    True when both have at most ``max_words`` words (``SLOT_WORDS``; questions: ``QUESTION_SLOT_WORDS``) and, in
    the word-level diff of the two (case-folded), a replaced span holds on both sides a number ("for 7 am" /
    "for 9 am"), a time word ("7 am" / "7 pm", "tonight" / "tomorrow") or a named entity (a capitalised word that
    does not start a sentence, and not a misspelling of the other: "the capital of France" / "of Germany"), or a
    changed span adds or drops a number ("at 6 am" / "at 6:30 am"), or adds, drops or swaps a negation ("I like
    it" / "I don't like it"), or swaps one switch word for another ("turn the lights on" / "off"). Edits of case,
    punctuation, a typo, an added greeting or a changed common word are not slot changes: those copies stay
    duplicates.
    """
    if max(len(a.split()), len(b.split())) > 2 * max_words:  # cheap bound before reading words
        return False
    wa, wb = _surface_words(a), _surface_words(b)
    if not wa or not wb or max(len(wa), len(wb)) > max_words:
        return False
    fa, fb = [w.casefold() for w, _ in wa], [w.casefold() for w, _ in wb]
    if fa == fb:  # the same words: case, punctuation or spacing changed
        return False
    for op, i1, i2, j1, j2 in SequenceMatcher(None, fa, fb, autojunk=False).get_opcodes():
        if op == "equal":
            continue
        if _negations(fa[i1:i2], fb[j1:j2]) or _negations(fb[j1:j2], fa[i1:i2]):
            return True
        if op != "replace":  # a number added or dropped ("for 2" / "for 2 or 3", "at 6 am" / "at 6:30 am")
            if any(map(_is_number, fa[i1:i2] + fb[j1:j2])):
                return True
            continue
        if any(map(_is_number, fa[i1:i2])) and any(map(_is_number, fb[j1:j2])):
            return True
        if set(fa[i1:i2]) & TIME_WORDS and set(fb[j1:j2]) & TIME_WORDS:
            return True
        if set(fa[i1:i2]) & SWITCHES and set(fb[j1:j2]) & SWITCHES:
            return True
        names_a = [w for w, (_, entity) in zip(fa[i1:i2], wa[i1:i2], strict=True) if entity]
        names_b = [w for w, (_, entity) in zip(fb[j1:j2], wb[j1:j2], strict=True) if entity]
        if names_a and names_b and all(SequenceMatcher(None, x, y).ratio() < _TYPO for x in names_a for y in names_b):
            return True
    return False


def small_edit(a: str, b: str, *, replaced: bool = True) -> bool:
    """Whether two short texts (at most ``EDIT_MAX_WORDS`` words) are one text edited a little: in the word-level
    diff of their case-folded words (punctuation dropped, so case and punctuation are free), misspelt words are
    free, so is a phrase of up to ``AFFIX_WORDS`` words added or dropped at the start or the end ("... Answer yes
    or no."), and at most ``EDIT_WORDS`` other words are inserted, left out or (with ``replaced``) replaced, with at
    least as many words kept (and one). Whether the edit changed a slot is :func:`different_slots`' question.

    ``replaced=False`` is the rule for questions: "Is it red?" / "Is it blue?" are two questions, while a
    question that gained or lost a word or a trailing phrase is the same question.
    """
    ta, tb = tokens(a), tokens(b)
    if ta == tb:
        return True
    if max(len(ta), len(tb)) > EDIT_MAX_WORDS:
        return False
    changed = kept = 0
    for op, i1, i2, j1, j2 in SequenceMatcher(None, ta, tb, autojunk=False).get_opcodes():
        span_a, span_b = ta[i1:i2], tb[j1:j2]
        if op == "equal":
            kept += len(span_a)
            continue
        if op == "replace" and len(span_a) == len(span_b) and all(map(misspelt, span_a, span_b)):
            kept += len(span_a)  # misspelt, still the same words
            continue
        at_edge = (i1 == j1 == 0) or (i2 == len(ta) and j2 == len(tb))
        if op != "replace" and at_edge and len(span_a) + len(span_b) <= AFFIX_WORDS:
            continue
        if op == "replace" and not replaced:
            return False
        changed += max(len(span_a), len(span_b))
    return changed <= EDIT_WORDS and kept >= max(1, changed)


def _negations(span: list[str], other: list[str]) -> bool:
    """Whether ``span`` holds a negation that ``other`` does not merely misspell ("without" / "wiithout" is a
    typo; "never" / "ever" drops the negation: a typo keeps at least the negation's length). The "no" of "yes or
    no" is an answer's choice, not a negation."""
    return any(
        w in NEGATIONS
        and not (w == "no" and "yes" in span)
        and not any(len(v) >= len(w) and misspelt(w, v) for v in other)
        for w in span
    )


def misspelt(a: str, b: str) -> bool:
    """Whether two different words are one word misspelt: letters only, 4+ letters each, one letter inserted,
    dropped, replaced, or two neighbours swapped ("quite" / "quuite", "they" / "thye", "without" / "withuot")."""
    if a == b or not (a.isalpha() and b.isalpha()) or min(len(a), len(b)) < 4 or abs(len(a) - len(b)) > 1:
        return False
    if len(a) != len(b):
        shorter, longer = (a, b) if len(a) < len(b) else (b, a)
        return any(longer[:k] + longer[k + 1 :] == shorter for k in range(len(longer)))
    diff = [k for k in range(len(a)) if a[k] != b[k]]
    if len(diff) == 1:
        return True
    return len(diff) == 2 and diff[1] == diff[0] + 1 and a[diff[0]] == b[diff[1]] and a[diff[1]] == b[diff[0]]


def _is_number(word: str) -> bool:
    return any(c.isdigit() for c in word)


_SENTENCE_END = re.compile(r"[.!?:;\n\"“(\[]\s*$")


@lru_cache(maxsize=1 << 16)  # a short text is compared with each of its candidates
def _surface_words(text: str) -> tuple[tuple[str, bool], ...]:
    """(word, is it entity-like: capitalised, not all capitals, not the first word of a sentence)."""
    out: list[tuple[str, bool]] = []
    for match in TOKEN.finditer(text):
        word, start = match.group(), match.start()
        starts_sentence = not out or bool(_SENTENCE_END.search(text[max(0, start - 3) : start]))
        out.append((word, word[0].isupper() and not word.isupper() and not starts_sentence))
    return tuple(out)
