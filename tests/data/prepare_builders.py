"""Record builders shared by the data-preparation tests (records are built in the tests, never downloaded)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

_VOCABULARY = (
    "amber basalt cedar delta ember fjord granite harbor iris juniper kelp lagoon meadow nectar onyx "
    "prairie quartz river sierra tundra umber valley willow xenon yarrow zephyr anchor beacon canyon "
    "dune estuary forest glacier heath island jungle knoll lake marsh"
)
WORDS = _VOCABULARY.split()

CHOICE = {
    "type": "choice",
    "instructions": "Which team should handle this ticket?",
    "criteria": {
        "billing": "Charges and refunds",
        "engineering": "Bugs and outages",
        "support": "How-to questions",
        "sales": "New contracts",
    },
}
NOUL = {"type": "noul", "instructions": "Is a production system down?"}
SCORE = {"type": "score", "instructions": "How urgent is it?", "criteria": ["low", "medium", "high"]}


def sentence(seed: int, n: int = 40) -> str:
    """A distinct pseudo-random sentence of ``n`` words (different seeds share no 5-gram in practice)."""
    import random

    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(n))


def make(
    i: int,
    *,
    state: str | None = None,
    question: dict[str, Any] | None = None,
    task: str = "tickets",
    answer: Any = None,
    **extra: Any,
) -> dict[str, Any]:
    question = question or CHOICE
    if answer is None:
        answer = {"choice": "engineering", "noul": True, "score": 1}[question["type"]]
    return {
        "id": f"r{i}",
        "task": task,
        "state": state if state is not None else sentence(i),
        "question": question,
        "answer": answer,
        **extra,
    }


def write_jsonl(path: Path, rows: list[Any]) -> Path:
    lines = [row if isinstance(row, str) else json.dumps(row) for row in rows]
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path
