"""Category prepare-inputs, part 3: bad rows after ten good ones (the bad row is line 11): not JSON, bad ids, missing
or empty fields, bad question shapes, targets, spans, bytes and sizes. Each belongs in rejects.jsonl."""

from __future__ import annotations

import json
from typing import Any

from assets import Env, jsonl_text
from harness import Expect, Probe
from judge import (
    any_of,
    kept_all,
    rejected_line,
    warned,
)
from prepare_inputs import (
    BAD,
    DROP,
    N_GOOD,
    accept,
    bad_record,
    prepare_probe,
    reject,
    with_bad,
)


def row_probes(env: Env) -> list[Probe]:
    """Rows that are not records, bad ids, duplicate ids, missing or empty fields."""
    P: list[Probe] = []

    def add(cid: str, what: str, expect: Expect, **kw: Any) -> None:
        P.append(prepare_probe(env, cid, what, expect, **kw))

    # ---- rows (the bad row is line 11, after 10 good ones)
    add("row-invalid-json", "a row that is not JSON", reject(BAD, "json"), rows=with_bad('{"task": "x", '))
    add("row-trailing-comma", "a row with a trailing comma", reject(BAD, "json"), rows=with_bad('{"task": "x",}'))
    add("row-array", "a row that is a JSON array", reject(BAD), rows=with_bad("[1, 2, 3]"))
    add("row-string", "a row that is a JSON string", reject(BAD), rows=with_bad('"just a string"'))
    add("row-null", "a row that is null", reject(BAD), rows=with_bad("null"))
    add("row-id-true", '"id": true', reject(BAD, "id"), rows=with_bad(bad_record(id=True)))
    add("row-id-float", '"id": 1.5', reject(BAD, "id"), rows=with_bad(bad_record(id=1.5)))
    add("row-id-list", '"id": [1]', reject(BAD, "id"), rows=with_bad(bad_record(id=[1])))
    add(
        "row-id-5000-digits",
        "an integer id of 5,000 digits (over Python's int-parsing limit)",
        Expect(
            "the row rejected naming the id, or kept",
            refuse=False,
            accept=any_of(rejected_line(BAD), kept_all(N_GOOD + 1)),
        ),
        rows=with_bad('{"id": ' + "7" * 5000 + ", " + json.dumps(bad_record(id=DROP))[1:]),
    )
    add(
        "row-id-5000-chars",
        "a string id of 5,000 characters (valid)",
        accept(kept_all(N_GOOD + 1), "all rows kept"),
        rows=with_bad(bad_record(id="x" * 5000)),
    )
    dup = bad_record(id="r3")
    add(
        "row-dup-id",
        "two different rows with the same id in one file",
        Expect(
            "the second one rejected (or a warning naming the id)",
            refuse=True,
            accept=any_of(rejected_line(BAD), warned("r3")),
        ),
        rows=with_bad(dup),
    )
    add(
        "row-dup-id-int-str",
        'id 7 and id "7" in one file',
        Expect(
            "one of them rejected, or a warning that ids 7 and '7' collide",
            refuse=True,
            accept=any_of(rejected_line(BAD), rejected_line(BAD + 1), warned("7")),
        ),
        rows=with_bad(bad_record(id=7), {**bad_record(id="7"), "state": "another state entirely, with other words"}),
    )
    add(
        "row-dup-id-across-sources",
        "the same id 'r1' in two sources",
        Expect(
            "rejected in the second source, or a warning naming the id",
            refuse=True,
            accept=any_of(rejected_line(1, file="more.jsonl"), warned("r1")),
        ),
        recipe="sources:\n  - {kind: jsonl, path: rows.jsonl}\n  - {kind: jsonl, path: more.jsonl, name: more}\n",
        files={"more.jsonl": jsonl_text([{**bad_record(id="r1"), "state": "a completely different ticket text"}])},
    )
    add("row-no-task", "a row without task", reject(BAD, "task"), rows=with_bad(bad_record(task=DROP)))
    add("row-empty-task", 'task: ""', reject(BAD, "task"), rows=with_bad(bad_record(task="")))
    add("row-no-state", "a row without state", reject(BAD, "state"), rows=with_bad(bad_record(state=DROP)))
    add("row-empty-state", 'state: ""', reject(BAD, "state"), rows=with_bad(bad_record(state="")))
    add(
        "row-state-ws",
        'state: "   " (whitespace only)',
        reject(BAD, "state"),
        rows=with_bad(bad_record(state="   \t ")),
    )
    add("row-state-int-list", "state: [1, 2]", reject(BAD, "state"), rows=with_bad(bad_record(state=[1, 2])))
    add("row-state-number", "state: 42", reject(BAD, "state"), rows=with_bad(bad_record(state=42)))
    add("row-no-question", "a row without question", reject(BAD, "question"), rows=with_bad(bad_record(question=DROP)))
    add("row-no-answer", "a row without answer", reject(BAD), rows=with_bad(bad_record(answer=DROP)))
    add(
        "row-answer-not-option",
        "answer not in the criteria",
        reject(BAD, "option"),
        rows=with_bad(bad_record(answer="enginering")),
    )
    add(
        "row-answer-and-target",
        "both answer and target",
        reject(BAD),
        rows=with_bad(bad_record(target={"billing": 1.0})),
    )
    add(
        "row-soft-target-level-twice",
        "score target naming level 'high' by text and by index 1 (one overwrote the other; issue 64)",
        reject(BAD, "twice"),
        rows=with_bad(
            bad_record(
                answer=DROP,
                question={"type": "score", "instructions": "How urgent?", "criteria": ["low", "high"]},
                target={"high": 0.5, "1": 0.5},
            )
        ),
    )
    add(
        "row-misspelt-key",
        "a misspelt key 'anwser'",
        reject(BAD, "anwser"),
        rows=with_bad({**bad_record(answer=DROP), "anwser": "billing"}),
    )
    add(
        "row-dup-key",
        "a repeated key in one object",
        reject(BAD),
        rows=with_bad(json.dumps(bad_record())[:-1] + ', "answer": "support"}'),
    )
    add(
        "row-score-dup-levels",
        "score levels duplicated ['low', 'low', 'high']",
        reject(BAD),
        rows=with_bad(
            bad_record(
                question={"type": "score", "instructions": "How urgent?", "criteria": ["low", "low", "high"]}, answer=1
            )
        ),
    )
    add(
        "row-choice-1-option",
        "a choice with one option",
        reject(BAD),
        rows=with_bad(
            bad_record(question={"type": "choice", "instructions": "Which?", "criteria": ["only"]}, answer="only")
        ),
    )
    add(
        "row-choice-256",
        "a choice with 256 options",
        reject(BAD),
        rows=with_bad(
            bad_record(
                question={"type": "choice", "instructions": "Which?", "criteria": [f"o{i}" for i in range(256)]},
                answer="o1",
            )
        ),
    )
    add(
        "row-score-11",
        "a score with 11 levels",
        reject(BAD),
        rows=with_bad(
            bad_record(
                question={"type": "score", "instructions": "How much?", "criteria": [str(i) for i in range(11)]},
                answer=1,
            )
        ),
    )
    add(
        "row-score-index-out",
        "a score answer 7 on 3 levels",
        reject(BAD),
        rows=with_bad(
            bad_record(question={"type": "score", "instructions": "How much?", "criteria": ["a", "b", "c"]}, answer=7)
        ),
    )
    return P


def row_shape_probes(env: Env) -> list[Probe]:
    """Bad question shapes, targets, spans, bytes and sizes."""
    P: list[Probe] = []

    def add(cid: str, what: str, expect: Expect, **kw: Any) -> None:
        P.append(prepare_probe(env, cid, what, expect, **kw))

    add(
        "row-type-unknown",
        "question type 'multiple'",
        reject(BAD, "type"),
        rows=with_bad(bad_record(question={"type": "multiple", "instructions": "Which?", "criteria": ["a", "b"]})),
    )
    add(
        "row-target-sum",
        "a soft target summing to 1.7",
        reject(BAD),
        rows=with_bad(bad_record(answer=DROP, target={"billing": 0.9, "support": 0.8})),
    )
    add(
        "row-target-nan",
        "a soft target with NaN",
        reject(BAD),
        rows=with_bad(json.dumps(bad_record(answer=DROP))[:-1] + ', "target": {"billing": NaN, "support": 0.5}}'),
    )
    add(
        "row-infinity",
        "Infinity as a noul target",
        reject(BAD),
        rows=with_bad(
            json.dumps(bad_record(question={"type": "noul", "instructions": "Down?"}, answer=DROP))[:-1]
            + ', "target": Infinity}'
        ),
    )
    add("row-lang-empty", 'lang: ""', reject(BAD, "lang"), rows=with_bad(bad_record(lang="")))
    add("row-meta-string", 'meta: "x"', reject(BAD, "meta"), rows=with_bad(bad_record(meta="x")))
    span_q = {"type": "span", "instructions": "Where are the names?", "criteria": ["PERSON"]}
    add(
        "row-span-whitespace",
        "span gold covering only whitespace",
        reject(BAD, "span"),
        rows=with_bad(
            bad_record(
                state="Call    Anna Berg today.", question=span_q, answer=[{"label": "PERSON", "start": 4, "end": 8}]
            )
        ),
    )
    add(
        "row-span-outside",
        "span offsets beyond the text",
        reject(BAD, "outside"),
        rows=with_bad(
            bad_record(state="Call Anna.", question=span_q, answer=[{"label": "PERSON", "start": 5, "end": 500}])
        ),
    )
    add(
        "row-span-33-labels",
        "span with 33 labels",
        reject(BAD),
        rows=with_bad(
            bad_record(state="Call Anna.", question={**span_q, "criteria": [f"L{i}" for i in range(33)]}, answer=[])
        ),
    )
    add(
        "row-multi-unknown-name",
        "a multi-question row whose expected names an unknown question",
        reject(BAD),
        rows=with_bad(
            {
                "id": "m1",
                "task": "triage",
                "state": "Checkout fails for all.",
                "questions": {"down": {"type": "noul", "instructions": "Down?"}},
                "expected": {"down": True, "urgent": 1},
            }
        ),
    )
    add(
        "row-nul-raw",
        "a raw NUL byte inside a row",
        reject(BAD),
        rows=with_bad(json.dumps(bad_record()).replace("Ticket", "Tic\x00ket").encode()),
    )
    add(
        "row-nul-escaped",
        "an escaped \\u0000 in the state (tolerable either way)",
        Expect(
            "kept, or rejected naming the line",
            refuse=False,
            accept=any_of(kept_all(N_GOOD + 1), rejected_line(BAD)),
            bad_input=False,
        ),
        rows=with_bad(json.dumps(bad_record(state="null byte here \u0000 in the text"))),
    )
    add(
        "row-lone-surrogate",
        'a lone surrogate "\\ud800" in the state',
        reject(BAD),
        rows=with_bad(json.dumps(bad_record(state=DROP))[:-1] + ', "state": "broken \\ud800 text"}'),
    )
    add(
        "row-invalid-utf8",
        "one line with an invalid UTF-8 byte",
        reject(BAD),
        rows=with_bad(json.dumps(bad_record()).replace("Ticket", "Tick\xffet").encode("latin-1")),
    )
    add("row-deep-array", "a row of 100,000 '['", reject(BAD), rows=with_bad("[" * 100_000))
    add(
        "row-deep-state",
        "a state object nested 3,000 deep (valid JSON, too deep to read)",
        Expect(
            "rejected naming the line (or kept)", refuse=False, accept=any_of(rejected_line(BAD), kept_all(N_GOOD + 1))
        ),
        rows=with_bad(
            json.dumps(bad_record(state=DROP))[:-1] + ', "state": ' + '{"a": ' * 3000 + '"deep"' + "}" * 3000 + "}"
        ),
    )
    add(
        "row-huge-line",
        "one row with a 3 MB state (valid, tolerable)",
        accept(any_of(kept_all(N_GOOD + 1), rejected_line(BAD)), "kept (or rejected naming the line)", refuse_ok=True),
        rows=with_bad(bad_record(state="lorem ipsum dolor " * 175_000)),
        timeout=120,
    )
    add(
        "row-huge-number",
        "a 200-digit float answer on a score",
        reject(BAD),
        rows=with_bad(
            json.dumps(
                bad_record(question={"type": "score", "instructions": "How much?", "criteria": ["a", "b"]}, answer=DROP)
            )[:-1]
            + ', "answer": 1'
            + "0" * 200
            + ".5}"
        ),
    )
    return P
