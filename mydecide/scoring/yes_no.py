"""A yes / no question asked as a choice or a score is read, and calibrated, as the yes / no question it is.

"Is the customer on the enterprise plan?" can come as a noul, as a choice between ``yes`` and ``no`` or as a score
with the two levels ``No`` and ``Yes``. These are one question, so they get one answer: a choice or a score whose two
options are a yes and a no (yes / true and no / false, any case, trailing punctuation ignored; an option's
description decides where it has one, its id otherwise) is scored by the noul's prompt (the same tokens, the same
read) and takes the noul's temperature (:func:`family`). Its probabilities come back in its own option order, so the
answer is still a choice or a score on the wire. Training shows such a record as the noul too
(``training/batches.py``), so the model learns one reading.

Options that are not plainly a yes and a no (``maybe``, ``yes please``, three options) keep their type's reading.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mydecide.records import Question

if TYPE_CHECKING:
    import numpy as np

YES = frozenset({"yes", "true"})
NO = frozenset({"no", "false"})


def _name(question: Question, i: int) -> str:
    """What option i says: its description where it has one (answers follow descriptions, not ids), else its id (a
    score level's id is its index: only its name counts)."""
    shown = question.descriptions[i] or ("" if question.type == "score" else question.options[i])
    return shown.strip().rstrip(".!").strip().lower()


def yes_no_view(question: Question) -> tuple[Question, int] | None:
    """(the noul question, the index of the yes option) when ``question`` is a choice or score of a yes and a no;
    None otherwise (nouls included: they are read as themselves)."""
    if question.type not in ("choice", "score") or question.k != 2:
        return None
    first, second = _name(question, 0), _name(question, 1)
    if first in YES and second in NO:
        yes = 0
    elif first in NO and second in YES:
        yes = 1
    else:
        return None
    return Question("noul", question.instructions, ("yes", "no"), ("", "")), yes


def family(question: Question) -> str:
    """The question type whose temperature (and calibration rows) a question takes: ``noul`` for a yes / no question
    asked as a choice or a score (:func:`yes_no_view`), its own type otherwise."""
    return "noul" if yes_no_view(question) is not None else question.type


def from_noul(logits: np.ndarray, yes: int) -> np.ndarray:
    """The noul's (yes, no) logits in the option order of the question it answers (``yes``: its yes option's
    index)."""
    import numpy as np

    z = np.asarray(logits, dtype=np.float64)
    return z if yes == 0 else z[::-1].copy()
