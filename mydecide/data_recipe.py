"""The recipe of ``mydecide prepare`` (``recipes/data/``): sources, dedup, decontamination, splits, augmentation,
the Ray engine and the output layout. A recipe model like those in :mod:`mydecide.config`, which imports these with
every other command's recipe; the code that applies it is :mod:`mydecide.data`.
"""

from __future__ import annotations

import json
import sys
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from mydecide.recipe_parsing import Seed, Strict


class SourceSpec(Strict):
    """One converter run: ``kind`` names a module in ``data_sources/``; ``options`` go to its ``convert``."""

    kind: str  # a converter module in data_sources/ (`mydecide prepare --list-sources`)
    path: str | None = None  # None: the converter's default (its bundled sample, or the hub when online)
    name: str | None = None  # label in the manifest and rejects.jsonl; default: kind (kind#i when repeated)
    limit: int | None = Field(None, ge=0)  # read at most this many rows of the source
    seed: Seed = 13  # for converters that sample
    options: dict[str, Any] = Field(default_factory=dict)  # converter-specific keyword arguments

    @field_validator("limit")
    @classmethod
    def _countable(cls, value: int | None) -> int | None:
        """A converter counts rows up to ``limit`` (itertools.islice), which takes no number above sys.maxsize."""
        if value is not None and value > sys.maxsize:
            raise PydanticCustomError(
                "limit", "a limit is at most {most} rows; leave it out to read every row", {"most": sys.maxsize}
            )
        return value


class NearDedupConfig(Strict):
    """MinHash LSH near-duplicate removal on the state text of records that ask the same question."""

    enabled: bool = True  # false: exact dedup only
    threshold: float = Field(0.7, gt=0.0, le=1.0)  # Jaccard of the shingle sets (candidates verified exactly)
    shingle: Literal["char", "word"] = "char"  # n-grams of characters of the normalised text, or of words
    ngram: int = Field(5, ge=1, le=32)  # characters (shingle: char) or words (shingle: word) per shingle
    num_perm: int = Field(128, ge=16, le=1024)  # MinHash permutations
    seed: Seed = 1  # of the MinHash permutations
    keep_slot_changes: bool = True  # keep short look-alikes differing in a number, a name or a negation


class DedupConfig(Strict):
    exact: bool = True  # normalised key: case-folded, whitespace-collapsed state + instructions + options
    near: NearDedupConfig = Field(default_factory=NearDedupConfig)


class DecontaminationConfig(Strict):
    """How training rows are matched against the ``decontaminate_against`` files (state text only)."""

    exact: bool = True  # drop training rows whose normalised state equals an eval item's
    near: bool = True  # MinHash with dedup.near's shingles; threshold below or dedup.near.threshold
    near_threshold: float | None = Field(None, gt=0.0, le=1.0)
    ngram: int = Field(13, ge=0, le=64)  # n-gram overlap length in words; 0 turns the check off
    # a text shorter than ngram words (and at least this long) found whole inside the other side; 0: off
    whole_min_words: int = Field(8, ge=0, le=64)
    # short eval items copied with one word edited or wrapped, and rare 5-7-word phrases (docs/dedup.md)
    short_edits: bool = True


class SplitConfig(Strict):
    # whole tasks → heldout_tasks.jsonl; holding out every task, which leaves train empty, is an error
    heldout_tasks: list[str] = Field(default_factory=list)
    # share of each trained task's rows in dev.jsonl; 0: no dev split (said in the summary line). A share > 0 that
    # leaves dev empty (too few rows) is an error, and so is an empty train split, whatever emptied it
    dev_fraction: float = Field(0.05, ge=0.0, lt=1.0)
    # > 0 also writes test.jsonl (trained tasks only); a share > 0 that leaves test empty is an error
    test_fraction: float = Field(0.0, ge=0.0, lt=1.0)
    seed: Seed = 13  # of the stable hash that assigns rows to splits

    @model_validator(mode="after")
    def _fractions(self) -> SplitConfig:
        if self.dev_fraction + self.test_fraction >= 1.0:
            total = f"{self.dev_fraction} + {self.test_fraction}"
            raise ValueError(f"dev_fraction + test_fraction must leave rows for training, got {total}")
        return self


# An option no run has measured yet: docs/recipes.md lists it in a table of its own, with the date by which it is
# measured (and stays, with its LOG entry) or deleted (docs/contributing.md#the-revert-rule).
EXPERIMENTAL: dict[str, Any] = {"tier": "experimental", "decide_by": "2026-12-21"}
ExperimentalShare = Annotated[float, Field(ge=0.0, le=1.0, json_schema_extra=EXPERIMENTAL)]


class AugmentConfig(Strict):
    """Augmentation of the train split only; each field is the fraction of eligible rows that get a copy."""

    anonymize_options: ExperimentalShare = 0.0  # choice: ids → option_1.. (descriptions kept)
    drop_distractors: ExperimentalShare = 0.0  # choice with > 2 options: drop zero-mass options
    paraphrase_instructions: ExperimentalShare = 0.0  # swap instructions for a listed variant
    # exact instructions → variants
    paraphrases: dict[str, list[str]] = Field(default_factory=dict, json_schema_extra=EXPERIMENTAL)
    reword_instructions: ExperimentalShare = 0.0  # any type: instructions in a generic rewording
    drop_span_labels: ExperimentalShare = 0.0  # span: drop 1..L-1 labels and their gold spans
    rename_span_labels: ExperimentalShare = 0.0  # span: labels → neutral codes (descriptions kept)
    paraphrase_span_labels: ExperimentalShare = 0.0  # span: descriptions → user-listed paraphrases
    # label name → other descriptions of it
    span_label_paraphrases: dict[str, list[str]] = Field(default_factory=dict, json_schema_extra=EXPERIMENTAL)
    add_absent_span_labels: ExperimentalShare = 0.0  # span: also ask for 1..n absent_span_labels
    # label name → description of labels that occur in no text of the data (the user says so), added with no gold
    # spans; a record asking for one of them is an error (docs/spans.md#training)
    absent_span_labels: dict[str, str] = Field(default_factory=dict, json_schema_extra=EXPERIMENTAL)
    # schema resampling (Vela 2.0): anonymize_options, drop_distractors, reword_instructions and the span copies
    # (paraphrased and absent labels only where span_label_paraphrases and absent_span_labels list some)
    schema_resampling: ExperimentalShare = 0.0
    negate_noul: ExperimentalShare = 0.0  # noul: the negated question, target complemented
    rename_options: ExperimentalShare = 0.0  # choice: ids → random neutral codes (descriptions kept)
    negation_templates: list[str] | None = None  # "{instructions}" templates; None: augment.NEGATION_TEMPLATES
    seed: Seed = 13  # which rows get augmented copies
    # train rows whose meta.soft_target gives a label distribution (vader: its raters' levels) are trained on it;
    # dev, test and held-out rows keep the hard answer (docs/records.md#training-only-soft-targets)
    soft_targets: bool = False

    @model_validator(mode="before")
    @classmethod
    def _removed(cls, data: Any) -> Any:
        if isinstance(data, dict) and "consistency" in data:
            raise PydanticCustomError(
                "removed_key",
                "consistency was removed (its copies did not move the negation law: docs/LOG.md, Many options: "
                "coherence); set negate_noul and rename_options",
            )
        if isinstance(data, dict) and "shuffle_options" in data:
            raise PydanticCustomError(
                "removed_key",
                "shuffle_options was removed (it changed nothing: `mydecide train` reshuffles choice options every "
                "epoch, see the training recipe's shuffle_options); delete it",
            )
        return data

    @field_validator("span_label_paraphrases")
    @classmethod
    def _span_label_paraphrases(cls, value: dict[str, list[str]]) -> dict[str, list[str]]:
        for label, variants in value.items():
            if not label.strip():
                raise PydanticCustomError("span_label", "a label name must not be blank")
            if not variants or not all(variant.strip() for variant in variants):
                raise PydanticCustomError(
                    "span_label",
                    "label {label} needs a list of non-blank descriptions (leave the label out to keep its own)",
                    {"label": json.dumps(label, ensure_ascii=False)},
                )
        return value

    @field_validator("absent_span_labels")
    @classmethod
    def _absent_span_labels(cls, value: dict[str, str]) -> dict[str, str]:
        folded: dict[str, str] = {}
        for label, description in value.items():
            if (other := folded.setdefault(label.casefold(), label)) != label:
                raise PydanticCustomError(
                    "span_label",
                    "labels {labels} differ only in case: declare each absent label once",
                    {"labels": json.dumps([other, label], ensure_ascii=False)},
                )
            if not label.strip():
                raise PydanticCustomError("span_label", "a label name must not be blank")
            if not description.strip():
                raise PydanticCustomError(
                    "span_label",
                    "label {label} needs a description: it is what the model reads for a label it never sees marked",
                    {"label": json.dumps(label, ensure_ascii=False)},
                )
        return value

    @model_validator(mode="after")
    def _paraphrases(self) -> AugmentConfig:
        if self.paraphrase_instructions > 0 and not any(self.paraphrases.values()):
            raise ValueError("paraphrase_instructions > 0 needs paraphrases: {instructions: [variant, ...]}")
        if self.paraphrase_span_labels > 0 and not self.span_label_paraphrases:
            raise PydanticCustomError(
                "span_label", "paraphrase_span_labels > 0 needs span_label_paraphrases: {label: [description, ...]}"
            )
        if self.add_absent_span_labels > 0 and not self.absent_span_labels:
            raise PydanticCustomError(
                "span_label", "add_absent_span_labels > 0 needs absent_span_labels: {label: description}"
            )
        for template in self.negation_templates or []:
            if template.count("{instructions}") != 1 or template.replace("{instructions}", "").count("{"):
                raise ValueError(
                    f"negation template {template!r} must contain {{instructions}} once and no other {{…}} field"
                )
        if self.negation_templates is not None and not self.negation_templates:
            raise ValueError("negation_templates must list at least one template (or be left out)")
        return self


class RayEngineConfig(Strict):  # where engine: ray runs prepare, block by block (docs/distributed-prepare.md)
    address: str | None = None  # a running cluster ("auto", "ray://head:10001"); None: $RAY_ADDRESS, else a local Ray
    num_workers: int | None = Field(None, ge=1)  # CPUs of a local Ray started for the run; None: every CPU
    partitions: int | None = Field(None, ge=1)  # the reducers of every shuffle; None: 2 per CPU of the cluster
    block_rows: int = Field(20_000, ge=1)  # rows read per block (a task's batch)


class OutputConfig(Strict):  # how prepare writes the splits (docs/distributed-prepare.md); train reads every layout
    format: Literal["jsonl", "parquet"] = "jsonl"  # parquet: columns id, task, type, lang and record (its JSON)
    rows_per_file: int | None = Field(None, ge=1)  # None: one file per split; N: train/part-00000.* of ≤ N rows


class DataRecipe(Strict):
    sources: list[SourceSpec] = Field(min_length=1)  # the converter runs whose rows are prepared
    decontaminate_against: list[str | SourceSpec] = Field(default_factory=list)  # JSONL paths or sources
    decontamination: DecontaminationConfig = Field(default_factory=DecontaminationConfig)
    dedup: DedupConfig = Field(default_factory=DedupConfig)  # duplicate removal within the sources
    cap_per_task: int | dict[str, int] | None = None  # one cap for every task, or {task: cap}; each cap ≥ 1
    split: SplitConfig = Field(default_factory=SplitConfig)  # held-out tasks, dev and test shares
    augment: AugmentConfig = Field(default_factory=AugmentConfig)
    out: str = "runs/data"  # output directory (train / dev / test / heldout_tasks / rejects JSONL, manifest)
    engine: Literal["local", "ray"] = "local"  # ray: every step on a Ray cluster, same outputs
    ray: RayEngineConfig = Field(default_factory=RayEngineConfig)  # used when engine is ray
    output: OutputConfig = Field(default_factory=OutputConfig)  # single files (train.jsonl) or part files

    @field_validator("cap_per_task", mode="before")
    @classmethod
    def _caps(cls, value: Any) -> Any:
        """A cap is a whole number of rows, at least 1: a cap of 0 (or false) keeps no row of its task, and true is
        not a number of rows."""
        caps = dict(value) if isinstance(value, dict) else {} if value is None else {None: value}
        for task, cap in caps.items():
            if isinstance(cap, bool) or not isinstance(cap, int) or cap < 1:
                shown = json.dumps(cap, default=str) + ("" if task is None else f" (task {task})")
                raise PydanticCustomError(
                    "cap", "a cap is a whole number of rows, at least 1, not {cap}", {"cap": shown}
                )
        return value
