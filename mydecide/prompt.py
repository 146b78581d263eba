"""The ``prompt:`` recipe section: how questions are shown to the model (:class:`RenderConfig`, with the span
windows and reads of :class:`SpanWindows`) and the names of the scoring forms.

A recipe model like those in :mod:`mydecide.config`, saved with every adapter as ``mydecide_render.json``
(:func:`mydecide.modeling.save_render_config`) so that every command renders as training did; the renderer that
applies it is :mod:`mydecide.scoring.render`. docs/scoring-forms.md and docs/spans.md say what each key does.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

OptionForm = Literal["letters", "per_option"]
OPTION_FORMS: tuple[str, ...] = ("letters", "per_option")
ScoreForm = Literal["letters", "per_option", "thresholds", "binomial"]
SCORE_FORMS: tuple[str, ...] = ("letters", "per_option", "thresholds", "binomial")


class SpanWindows(BaseModel):
    """How a span question's text is cut into token windows (docs/spans.md)."""

    model_config = ConfigDict(extra="forbid")

    window_tokens: int = Field(512, ge=16)  # text tokens in one window (the question and label come on top)
    overlap_tokens: int = Field(128, ge=0)  # about how many text tokens consecutive windows share
    # how a word × label cell is read: "head" = a small trained span head on the last hidden state that scores every
    # word against every label's line, one sequence per window; "letters" = the output head's rows of A (yes) and B
    # (no) at the word, one sequence per label, no new parameters; "auto" = a head is trained when the training data
    # has span questions and used when the model has one, the letters otherwise (docs/spans.md)
    read: Literal["auto", "head", "letters"] = "auto"
    # where the span head reads: "own" = every window its own sequence (template head, context, question, labels,
    # text); "shared" = after the prefix every other question of the state shares (template head + state), one
    # block: the question, the label lines, then a copy of the text, read there, so every read has seen all labels
    # and the whole text (a window not wholly in the prefix, a state cut by max_state_tokens, carries its own first
    # copy); scored in the state's packed row beside its other questions (docs/spans.md#the-shared-layout). The
    # span head's read only (a letters read keeps its own sequences)
    layout: Literal["own", "shared"] = "own"

    def resolve(self, head: bool) -> SpanWindows:
        """``auto`` made concrete: ``head`` when the model has (or training will give it) a span head, else
        ``letters``; an explicit read stays as it is."""
        return self if self.read != "auto" else self.model_copy(update={"read": "head" if head else "letters"})

    @model_validator(mode="after")
    def _overlap_below_window(self) -> SpanWindows:
        if self.overlap_tokens > self.window_tokens // 2:
            raise ValueError(f"overlap_tokens must be at most half of window_tokens ({self.window_tokens // 2})")
        if self.layout == "shared" and self.read == "letters":
            raise ValueError("layout: shared is a layout of the span head's read; read: letters keeps its own layout")
        return self


class RenderConfig(BaseModel):
    """How questions are shown to the model. Saved next to every adapter so serving renders as training did."""

    model_config = ConfigDict(extra="forbid")

    # the chat's system message (null: none)
    system_prompt: str | None = (
        "You are a decision model. Read the state, then answer the question with the letter of one option."
    )
    # the state's tokens at most; a longer state is cut and marked "[… state truncated]"
    max_state_tokens: int = Field(3000, ge=1)
    # How a choice question's options are scored: "letters" = one next-token read over the labels A, B, … (one pass
    # per question; needs a model that binds letters to options), "per_option" = every option its own yes / no
    # continuation of a prefix holding the state and the question, the K yes − no logits through one softmax
    # (order-invariant by construction; what small models can learn; the default). Score questions have their own
    # key.
    option_form: OptionForm = "per_option"
    # Score questions: "letters" and "per_option" as for choices (nominal reads of the levels; per_option is the
    # default: it ranked and scored the demo's 5-level task best of the three, docs/scoring-forms.md), or
    # "thresholds": the levels listed lowest first, then K − 1 yes / no reads "is the right level this one or a higher
    # one?" whose log-odds d_k sum into the level logits z_j = d_1 + … + d_j (z_0 = 0), so every read learns from
    # every example and the levels' order is in the model; or "binomial": the levels listed lowest first, then one
    # yes / no read s "is the right level closer to the top level than to the bottom one?", the level logits
    # z_k = log C(K − 1, k) + k·s (one read per question, always unimodal; docs/scoring-forms.md)
    score_form: ScoreForm = "per_option"
    # span questions: how the text is cut into windows and how each word × label cell is read (docs/spans.md)
    span: SpanWindows = Field(default_factory=SpanWindows)
