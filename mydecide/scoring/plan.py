"""Planning, the scoring layer's second step: which prompts score each question, round by round.

Every scorer — ``scoring.engine.score_questions``, the server's micro-batching worker, evaluation, calibration,
training's dev metrics — drives one :class:`ScoringPlan`, so all of them score a question the same way.

**Many options.** Choice questions with more options than answer letters (27–255): groups of ≤ 26, then a final
round.

A prompt shows at most 26 options (labels A–Z, one token each), but a Jev choice may have up to 255. A choice
with K > 26 options is scored in two rounds, every prompt continuing from the same state prefix:

1. **Groups.** The options, in shown order, are cut into G = ⌈K / 26⌉ consecutive groups of nearly equal size
   (77 → 26 + 26 + 25). Each group is a prompt of its own: the same state and instructions, only that group's
   options. The G prompts go through one batch, so the state prefix is computed once for all of them. The
   softmax inside group g is p(o | g).
2. **Final round.** The leader (argmax) of every group is shown, in group order, as the options of one more
   prompt. Its softmax is P(g): how likely the answer is in group g, judged from the group's best candidate.
3. **Combination.** P(o) = P(g(o)) · p(o | g(o)). Summed over all options this is
   Σ_g P(g) · Σ_{o ∈ g} p(o | g) = 1 exactly, so every option gets a probability and they sum to 1.

:class:`ScoringPlan` returns ``log P(o)`` as the question's (K,) logits, in canonical option order like any other
question, so the softmax / temperature code downstream needs no special case. Two rounds fit 26 × 26 = 676
options; 255 needs at most 10 groups.

**Temperature.** For K ≤ 26 the logits are log-probabilities up to a constant, and softmax(z / T) tempers the
model's distribution: p^(1/T) renormalised. Here the logits are exact log-probabilities, and softmax(z / T) is
the same operation on the composed distribution, so T means the same thing at every K and keeps the argmax.
(It is not the same as tempering each round separately: that would weight the groups by Σ_{o ∈ g} p(o|g)^(1/T).)
``calibrate --by-bucket`` gives K ≥ 27 its own temperature (bucket "27+").

**Training** uses the matching view (``training/batches.py``): a record with more than 26 options is shown as
its gold option (every option with target mass) among sampled distractors, 26 options in all, drawn afresh every
epoch — at inference time every prompt is also a choice among at most 26 of the options.

**Cost.** G + 1 prompts instead of one, and a second forward pass that waits for the first (its options depend
on the group results); the state prefix is computed once per round. An answer still depends only on its own
question: groups and the final round are separate prompts that never see other questions.

Set questions are expanded here too (one yes/no prompt per label, read as yes − no logits), and so are questions
scored in the **per-option form** (``RenderConfig.option_form`` / ``score_form``: one yes/no prompt per option,
continuing a prefix that holds the state and the question; the K yes − no logits go through one softmax). Neither
needs groups: every option is its own prompt at any K. Score questions in the **threshold** and **binomial** forms
are yes/no reads too (K − 1 reads, or one), their log-odds turned into level logits (:func:`threshold_logits`,
:func:`binomial_logits`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from mydecide.records import Question
from mydecide.scoring.probabilities import log_softmax
from mydecide.scoring.render import MAX_LETTER_OPTIONS, Prompt, Renderer, question_units
from mydecide.scoring.yes_no import from_noul, yes_no_view

if TYPE_CHECKING:
    import numpy as np

GROUP_SIZE = MAX_LETTER_OPTIONS


def is_grouped(question: Question, form: str = "letters") -> bool:
    """Whether a question has more options than one prompt can show (letters form, K > 26)."""
    return question.type not in ("set", "span") and form == "letters" and question.k > GROUP_SIZE


def option_groups(order: Sequence[int], size: int = GROUP_SIZE) -> list[tuple[int, ...]]:
    """Cut a shown order into ⌈K / size⌉ consecutive groups whose sizes differ by at most one (larger first)."""
    k = len(order)
    if k == 0:
        raise ValueError("no options to group")
    n_groups = math.ceil(k / size)
    base, extra = divmod(k, n_groups)
    groups, start = [], 0
    for g in range(n_groups):
        stop = start + base + (1 if g < extra else 0)
        groups.append(tuple(order[start:stop]))
        start = stop
    return groups


def prompt_count(question: Question, form: str = "letters") -> int:
    """Prompts scored for one question: 1 (the binomial form too); a set or the per-option form: one per option; the
    threshold form: K − 1; letters with K > 26 options: G groups + the final round."""
    if yes_no_view(question) is not None:  # read as the noul it is
        return 1
    if question.type in ("set", "span") or form == "per_option":  # span: counted one per label (and window)
        return question.k
    if form == "thresholds":
        return question.k - 1
    if is_grouped(question, form):
        return len(option_groups(range(question.k))) + 1
    return 1


def shown_letter_index(k: int, position: int) -> int:
    """The label (0 = "A") under which the option at shown ``position`` appears in the first round."""
    if k <= GROUP_SIZE:
        return position
    for group in option_groups(range(k)):
        if position in group:
            return group.index(position)
    raise ValueError(f"position {position} is outside 0..{k - 1}")


def sub_question(question: Question, indices: Sequence[int]) -> Question:
    """The question restricted to the options ``indices`` (canonical indices), shown in that order."""
    return Question(
        question.type,
        question.instructions,
        tuple(question.options[i] for i in indices),
        tuple(question.descriptions[i] for i in indices),
    )


def combine(
    groups: Sequence[Sequence[int]], group_logits: Sequence[np.ndarray], final_logits: np.ndarray, k: int
) -> np.ndarray:
    """(K,) log P(o) in canonical order: log P(g) from the final round + log p(o | g) inside each group.

    ``group_logits[g]`` are group g's logits in the order of ``groups[g]``; ``final_logits`` (G,) the final
    round's logits, one per group in group order.
    """
    import numpy as np

    log_pg = log_softmax(final_logits)  # (G,)
    out = np.full(k, np.nan)
    for g, (indices, z) in enumerate(zip(groups, group_logits, strict=True)):
        out[list(indices)] = log_pg[g] + log_softmax(z)
    if np.isnan(out).any():
        raise ValueError("the groups do not cover every option")
    return out


# ------------------------------------------------------------------------------------------------ the plan


@dataclass
class _Item:
    state: Any
    question: Question
    order: tuple[int, ...] | None
    groups: list[tuple[int, ...]] = field(default_factory=list)  # canonical indices, grouped questions only
    yes_no: bool = False  # one yes/no prompt per option or label (set, per-option form): logits are yes − no
    cumulative: bool = False  # threshold form: K − 1 yes/no reads, summed into the K level logits
    binomial: bool = False  # binomial form: one yes/no read s, the K level logits log C(K − 1, k) + k·s
    yes: int | None = None  # a yes / no question asked as a choice or score: its yes option (scoring.yes_no)
    rows: list[np.ndarray] = field(default_factory=list)  # first-round logits, one per prompt of this item
    final: np.ndarray | None = None


class ScoringPlan:
    """The prompts that score a list of (state, question) items, round by round, and their logits.

    Use::

        plan = ScoringPlan(renderer, items, orders)
        while plan.pending:
            plan.read(score(plan.pending))  # any prompt scorer: score_prompts, score_packed, …
        logits = plan.logits()

    Round 1 holds one prompt per question (set: per label; K > 26: per group); round 2, only when some question
    has more than 26 options, one final-round prompt per such question. Many plans can be scored together by
    concatenating their ``pending`` prompts (the server does), since every prompt is scored independently.
    """

    def __init__(
        self,
        renderer: Renderer,
        items: Sequence[tuple[Any, Question]],
        orders: Sequence[Sequence[int] | None] | None = None,
    ):
        self.renderer = renderer
        self.items: list[_Item] = []
        self.prompts: list[Prompt] = []  # round 1
        self.owner: list[int] = []  # item index of each round-1 prompt
        for n, (state, question) in enumerate(items):
            order = orders[n] if orders is not None else None
            item = _Item(state, question, tuple(order) if order is not None else None)
            self.items.append(item)
            form = renderer.form(question)
            view = yes_no_view(question)
            if question.type == "span":
                raise ValueError("span questions are scored by scoring.span_reads (a sequence per label), not a plan")
            if view is not None:
                units = [renderer.render(state, view[0])]
                item.yes = view[1]
            elif question.type == "set":
                units = [renderer.render(state, unit) for unit in question_units(question)]
                item.yes_no = True
            elif form == "thresholds":  # levels keep their order: the reads do not depend on a shown order
                units = renderer.render_thresholds(state, question)
                item.yes_no = item.cumulative = True
            elif form == "binomial":  # one read, levels in their order
                units = [renderer.render_binomial(state, question)]
                item.yes_no = item.binomial = True
            elif form == "per_option":  # the shown order does not matter: every option is judged on its own
                units = renderer.render_per_option(state, question)
                item.yes_no = True
            elif is_grouped(question, form):
                shown = item.order if item.order is not None else tuple(range(question.k))
                if sorted(shown) != list(range(question.k)):
                    raise ValueError(f"order {shown} is not a permutation of the {question.k} options")
                item.groups = option_groups(shown)
                units = [renderer.render(state, sub_question(question, group)) for group in item.groups]
            else:
                units = [renderer.render(state, question, item.order)]
            self.prompts.extend(units)
            self.owner.extend([n] * len(units))
        self.rounds: list[list[Prompt]] = [self.prompts]
        self._final_owner: list[int] = []
        self._read = 0  # rounds whose logits have been read

    @property
    def pending(self) -> list[Prompt]:
        """The prompts to score next (empty when every logit is known)."""
        return self.rounds[self._read] if self._read < len(self.rounds) else []

    def read(self, rows: Sequence[np.ndarray]) -> None:
        """Take the logits of ``pending`` (one row per prompt, canonical order of the prompt's question)."""
        pending = self.pending
        if not pending and rows:
            raise ValueError("no prompts are pending")
        if len(rows) != len(pending):
            raise ValueError(f"{len(rows)} logit rows for {len(pending)} pending prompts")
        if self._read == 0:
            for n, row in zip(self.owner, rows, strict=True):
                self.items[n].rows.append(row)
            final = []
            for n, item in enumerate(self.items):
                if item.groups:
                    leaders = [group[int(_argmax(z))] for group, z in zip(item.groups, item.rows, strict=True)]
                    final.append(self.renderer.render(item.state, sub_question(item.question, leaders)))
                    self._final_owner.append(n)
            if final:
                self.rounds.append(final)
        else:
            for n, row in zip(self._final_owner, rows, strict=True):
                self.items[n].final = row
        self._read += 1

    def reset(self) -> None:
        """Forget every logit read so far (to score the plan again, e.g. alone after a failed batch)."""
        for item in self.items:
            item.rows, item.final = [], None
        self.rounds = [self.prompts]
        self._final_owner = []
        self._read = 0

    def logits(self) -> list[np.ndarray]:
        """Per item: (K,) logits in canonical option order (a yes / no choice or score: the noul's (yes, no) logits in
        its option order); set and per-option form: (K,) yes − no; threshold form:
        the reads' running sums (:func:`threshold_logits`); binomial form: :func:`binomial_logits` of the one read;
        letters with K > 26: log P(o)."""
        if self.pending:
            raise ValueError(f"{len(self.pending)} prompts are still to be scored")
        out = []
        for item in self.items:
            if item.yes is not None:
                out.append(from_noul(item.rows[0], item.yes))
            elif item.cumulative:
                out.append(threshold_logits(yes_minus_no(item.rows)))
            elif item.binomial:
                out.append(binomial_logits(float(yes_minus_no(item.rows)[0]), item.question.k))
            elif item.yes_no:
                out.append(yes_minus_no(item.rows))
            elif item.groups:
                assert item.final is not None
                out.append(combine(item.groups, item.rows, item.final, item.question.k))
            else:
                out.append(item.rows[0])
        return out

    def tokens(self, shared_prefix: bool = True) -> int:
        """Tokens the scoring processes: per round each state once, each question's shared text once and every
        read's suffix (``shared_prefix``: the packed layout, ``scoring.packed.tree_tokens``), or every prompt in
        full."""
        from mydecide.scoring.packed import tree_tokens

        total = 0
        for prompts in self.rounds:
            if shared_prefix:
                total += tree_tokens(prompts)
            else:
                total += sum(len(p) for p in prompts)
        return total


def yes_minus_no(rows: Sequence[np.ndarray]) -> np.ndarray:
    """(K,) log-odds of yes, one per yes/no prompt (each row is the prompt's (yes, no) logits)."""
    import numpy as np

    return np.array([row[0] - row[1] for row in rows], dtype=np.float64)


def threshold_logits(reads: np.ndarray) -> np.ndarray:
    """(K,) level logits from the K − 1 threshold log-odds: z_0 = 0, z_j = d_1 + … + d_j (the adjacent-category
    model: d_j is the log-odds of level j against level j − 1). softmax(z / T) then tempers every read alike."""
    import numpy as np

    return np.concatenate([[0.0], np.cumsum(np.asarray(reads, dtype=np.float64))])


def binomial_logits(read: float, k: int) -> np.ndarray:
    """(K,) level logits from the binomial form's one log-odds s: z_j = log C(K − 1, j) + j·s, so softmax(z) is the
    binomial distribution of K − 1 trials with success probability sigmoid(s) (Beckham & Pal 2017). It is the
    threshold form with tied reads, d_j = s + log((K − j) / j). softmax(z / T) tempers the log C term with the read."""
    import numpy as np

    if k < 2:
        raise ValueError(f"a score question needs at least 2 levels, got {k}")
    j = np.arange(k, dtype=np.float64)
    log_choose = np.array([math.lgamma(k) - math.lgamma(i + 1) - math.lgamma(k - i) for i in range(k)])
    return log_choose + j * float(read)


def _argmax(z: np.ndarray) -> int:
    import numpy as np

    return int(np.argmax(z))  # first on ties


def score_plans(plans: Sequence[ScoringPlan], score: Callable[[list[Prompt]], Sequence[np.ndarray]]) -> int:
    """Score many plans together: one call of ``score(prompts) -> logits`` per round over every plan's pending
    prompts (so concurrent requests share forward passes in both rounds). Returns the prompts scored."""
    scored = 0
    while True:
        pending = [p for plan in plans for p in plan.pending]
        if not pending:
            return scored
        rows = score(pending)
        if len(rows) != len(pending):
            raise ValueError(f"the scorer returned {len(rows)} logit rows for {len(pending)} prompts")
        start = 0
        for plan in plans:
            n = len(plan.pending)
            if n:
                plan.read(rows[start : start + n])
                start += n
        scored += len(pending)
