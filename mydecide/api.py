"""The Python API: what the commands do, called from a script or a notebook (docs/python-api.md).

:func:`prepare`, :func:`train`, :func:`calibrate` and :func:`evaluate` take a recipe (a YAML path, a recipe object
or None for the defaults), dotted ``KEY=VALUE`` overrides and keyword options (recipe keys: ``out``, ``model``,
``data``, ...), and return typed results. :class:`DecisionModel` loads an adapter (and its temperatures) once and
answers questions about states as ``mydecide serve`` does: :meth:`DecisionModel.predict` goes through the server's
request path (``serving.response.answer_request``) and returns one typed answer per question.

``import mydecide`` stays light: the package's attributes load this module on first use (``mydecide.__getattr__``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel

from mydecide.config import CalibrateRecipe, DataRecipe, EvalRecipe, ServeRecipe, TrainRecipe
from mydecide.recipe_loading import load_recipe
from mydecide.recipe_parsing import merge, nest, parse_overrides

R = TypeVar("R", bound=BaseModel)
RecipeLike = str | Path | BaseModel | None


def _recipe(model: type[R], recipe: RecipeLike, overrides: Sequence[str], options: Mapping[str, Any]) -> R:
    """A recipe from a YAML path (as the commands read it), a recipe object, or None (the defaults), with the
    dotted overrides and then the keyword options (``None`` = not given) applied."""
    if recipe is None or isinstance(recipe, (str, Path)):
        return load_recipe(recipe, list(overrides), model=model, options=options)
    if not isinstance(recipe, model):
        raise TypeError(f"expected a {model.__name__}, a YAML path or None, got {type(recipe).__name__}")
    given = {key: value for key, value in options.items() if value is not None}
    data = merge(merge(recipe.model_dump(mode="json"), parse_overrides(list(overrides))), nest(given))
    return model.model_validate(data)


# ------------------------------------------------------------------------------------------------- the stages


@dataclass(frozen=True)
class Prepared:
    """What :func:`prepare` wrote: the data directory and its manifest."""

    out: Path
    manifest: dict[str, Any]

    @property
    def splits(self) -> dict[str, int]:
        """Rows per split (``{"train": n, "dev": n, ...}``)."""
        return {name: info["rows"] for name, info in self.manifest["splits"].items()}

    def split(self, name: str) -> Path:
        return self.out / f"{name}.jsonl"


def prepare(recipe: RecipeLike, *, overrides: Sequence[str] = (), log: Any = None, **options: Any) -> Prepared:
    """``mydecide prepare``: ``recipe`` a data recipe; ``log`` a function taking each summary line (print)."""
    from mydecide.data.prepare import prepare as run_prepare

    data = _recipe(DataRecipe, recipe, overrides, options)
    manifest = run_prepare(data, log=log)
    return Prepared(Path(data.out), manifest)


@dataclass(frozen=True)
class Trained:
    """A training run: its directory, the kept adapter and summary.json (the kept update and its dev metrics)."""

    run: Path
    summary: dict[str, Any]

    @property
    def adapter(self) -> Path:
        return self.run / "adapter"

    def metrics(self) -> list[dict[str, Any]]:
        """Every line of the run's metrics.jsonl (training losses and dev reports)."""
        lines = (self.run / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
        return [json.loads(line) for line in lines]


def train(recipe: RecipeLike, *, overrides: Sequence[str] = (), resume: bool = False, **options: Any) -> Trained:
    """``mydecide train``: ``recipe`` a training recipe (``data=``, ``model=`` and ``out=`` as on the command line)."""
    from mydecide.training.loop import train as run_training

    run = run_training(_recipe(TrainRecipe, recipe, overrides, options), resume=resume)
    return Trained(run, json.loads((run / "summary.json").read_text(encoding="utf-8")))


@dataclass(frozen=True)
class Calibrated:
    """The temperatures.json :func:`calibrate` wrote and its fits per question type."""

    path: Path
    types: dict[str, dict[str, Any]]

    def temperature(self, qtype: str) -> float:
        return float(self.types[qtype]["temperature"])


def calibrate(
    recipe: RecipeLike = None, *, overrides: Sequence[str] = (), progress: bool = False, **options: Any
) -> Calibrated:
    """``mydecide calibrate``: fit a temperature per question type on dev (``model=``, ``adapter=``, ``data=``,
    ``out=``)."""
    from mydecide.calibration.run import calibrate_file

    fitted = _recipe(CalibrateRecipe, recipe, overrides, options)
    document = calibrate_file(fitted, progress=progress)
    return Calibrated(Path(fitted.out), document["types"])


@dataclass(frozen=True)
class Evaluated:
    """An evaluation: its directory and report.json (per type, per task, per option, intervals, baselines)."""

    out: Path
    report: dict[str, Any]

    def predictions(self) -> list[dict[str, Any]]:
        lines = (self.out / "predictions.jsonl").read_text(encoding="utf-8").splitlines()
        return [json.loads(line) for line in lines]


def evaluate(
    recipe: RecipeLike = None, *, overrides: Sequence[str] = (), progress: bool = False, **options: Any
) -> Evaluated:
    """``mydecide evaluate`` (``model=``, ``adapter=``, ``temperatures=``, ``data=`` a file or a list, ``out=``)."""
    from mydecide.evaluation.run import evaluate_files

    if isinstance(options.get("data"), (str, Path)):
        options["data"] = [str(options["data"])]
    recipe = _recipe(EvalRecipe, recipe, overrides, options)
    evaluation = evaluate_files(recipe, progress=progress)
    return Evaluated(Path(recipe.out), {key: value for key, value in evaluation.report.items()})


# ------------------------------------------------------------------------------------------------- answers


@dataclass(frozen=True)
class Answer:
    """One question's answer, as ``serve`` gives it: ``probabilities`` per option (a noul: P(yes) and P(no); a set:
    P(label applies) per label; a span: none)."""

    type: str
    probabilities: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class ChoiceAnswer(Answer):
    choice: str = ""  # the most probable option
    confidence: float = 0.0  # (K·p_max − 1) / (K − 1): 0 at uniform, 1 at certainty


@dataclass(frozen=True)
class NoulAnswer(Answer):
    noul: float = 0.0  # P(yes)


@dataclass(frozen=True)
class ScoreAnswer(Answer):
    score: float = 0.0  # the expected level, Σ i·p_i
    confidence: float = 0.0
    legend: dict[str, str] = field(default_factory=dict)  # level index → its text


@dataclass(frozen=True)
class SetAnswer(Answer):
    selected: list[str] = field(default_factory=list)  # the labels with P >= 0.5


@dataclass(frozen=True)
class FoundSpan:
    label: str
    start: int
    end: int
    text: str
    probability: float


@dataclass(frozen=True)
class SpanAnswer(Answer):
    noul: float = 0.0  # P(there is any span)
    spans: list[FoundSpan] = field(default_factory=list)


def answer_of(wire: Mapping[str, Any]) -> Answer:
    """The typed answer of one answer object of a ``/v1/systemone`` response."""
    kind = wire["type"]
    if kind == "choice":
        return ChoiceAnswer(kind, dict(wire["probabilities"]), wire["choice"], wire["confidence"])
    if kind == "noul":
        return NoulAnswer(kind, {"yes": wire["noul"], "no": 1.0 - wire["noul"]}, wire["noul"])
    if kind == "score":
        return ScoreAnswer(kind, dict(wire["probabilities"]), wire["score"], wire["confidence"], dict(wire["legend"]))
    if kind == "set":
        return SetAnswer(kind, dict(wire["probabilities"]), list(wire["selected"]))
    spans = [FoundSpan(s["label"], s["start"], s["end"], s["text"], s["probability"]) for s in wire["spans"]]
    return SpanAnswer(kind, {}, wire["noul"], spans)


@dataclass(frozen=True)
class Prediction:
    """The answers to one state's questions, by question name, and the prompt tokens they took."""

    answers: dict[str, Answer]
    input_tokens: int

    def __getitem__(self, name: str) -> Answer:
        return self.answers[name]


class DecisionModel:
    """A base model with an adapter and its temperatures, loaded once; :meth:`predict` answers as ``serve`` does."""

    def __init__(self, loaded: Any, temperature: Any, recipe: ServeRecipe):
        self.loaded, self.temperature, self.recipe = loaded, temperature, recipe

    @classmethod
    def load(
        cls,
        adapter: str | Path | None,
        temperatures: str | Path | None = None,
        *,
        model: str | None = None,
        device: str | None = None,
        **options: Any,
    ) -> DecisionModel:
        """Load ``model`` (default: the base recorded with the adapter) with ``adapter`` and the temperatures
        ``calibrate`` wrote; ``options`` are serve recipe keys (``shared_prefix``, ``option_form``, ...)."""
        from mydecide.calibration.temperatures import load_temperatures
        from mydecide.merging import base_model_of
        from mydecide.modeling import load_model

        if model is None and adapter is not None:
            model = base_model_of(adapter)
        given = {
            "model": model,
            "adapter": None if adapter is None else str(adapter),
            "temperatures": None if temperatures is None else str(temperatures),
            "device": device,
        }
        recipe = _recipe(ServeRecipe, None, (), {**given, **options})
        loaded = load_model(
            recipe.model,
            recipe.adapter,
            device=recipe.device,
            option_form=recipe.option_form,
            score_form=recipe.score_form,
            allow_other_base=recipe.allow_other_base,
        )
        temperature = load_temperatures(recipe.temperatures) if recipe.temperatures is not None else None
        return cls(loaded, temperature, recipe)

    def predict(self, state: Any, questions: Mapping[str, Mapping[str, Any]]) -> Prediction:
        """Answer named questions (as in a request: ``{name: {type, instructions, criteria}}``) about ``state``
        (a text or a JSON object); a question the server would refuse is a UserError naming it."""
        from mydecide.errors import UserError
        from mydecide.serving.request import RequestError, parse_request
        from mydecide.serving.response import answer_request

        try:
            request = parse_request({"state": state, "questions": dict(questions)}, self.recipe.limits)
        except RequestError as err:
            raise UserError(str(err)) from None
        response = answer_request(
            self.loaded, request, self.temperature, shared_prefix=self.recipe.shared_prefix, model_name=""
        )
        answers = {name: answer_of(wire) for name, wire in response["answers"].items()}
        return Prediction(answers, response["usage"]["input_tokens"])
