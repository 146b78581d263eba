"""A recipe's text: YAML with repeated keys refused, dotted ``KEY=VALUE`` overrides from the command line, and a
validation error told in one line that blames the file, the override or the command line, with the key.

Values of overrides are parsed as YAML scalars (``1e-4``, ``true``, ``[a, b]``); command-line options are taken as
given (``--out "runs/exp #2"`` is that directory).
"""

from __future__ import annotations

import contextlib
import difflib
import json
import re
import unicodedata
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, get_args

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from mydecide.errors import UserError


class RecipeError(UserError):
    """A recipe file or override is invalid; the message names the file and the key."""


def parse_overrides(overrides: Sequence[str]) -> dict[str, Any]:
    """``["lora.r=16", "objective.kind=rlcd"]`` → nested dict."""
    nested: dict[str, Any] = {}
    for given in overrides:
        item = given if len(given) <= 80 else given[:79] + "…"  # as messages show it
        if "=" not in item:
            raise RecipeError(f"override {item!r} must look like KEY=VALUE (for example lora.r=16)")
        key, raw = given.split("=", 1)
        parts = key.strip().split(".")
        if not all(parts):
            raise RecipeError(f"override {item!r}: empty key segment")
        try:
            value = load_yaml(raw) if raw.strip() else None
        except yaml.YAMLError as err:
            raise RecipeError(f"override {item!r}: {yaml_problem(err, 'value is not valid YAML')}") from None
        node = nested
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise RecipeError(f"override {item!r}: {part!r} is not a section")
        node[parts[-1]] = value
    return nested


def merge(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    """``update`` over ``base``, mapping into mapping; an empty mapping in ``update`` replaces (clears) its key."""
    out = dict(base)
    for key, value in update.items():
        if isinstance(value, dict) and value and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


class UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.safe_load`` keeps the last of two equal keys, so a setting would vanish silently; refuse instead."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *base` entries may be overridden on purpose
                continue
            key = self.construct_object(key_node, deep=True)
            with contextlib.suppress(TypeError):  # an unhashable key: the base constructor says so
                if key in seen:
                    raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
                seen.add(key)
        return super().construct_mapping(node, deep)


# YAML 1.1 (PyYAML) reads 1e-4 and 1.5e3 as strings: it wants a dot and a signed exponent. Recipes are strictly
# typed, so such a string would be refused where a number belongs; a number with an exponent is a float, as in
# YAML 1.2.
UniqueKeyLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:\.[0-9]+|[0-9][0-9_]*(?:\.[0-9_]*)?)[eE][-+]?[0-9]+$"),
    list("-+.0123456789"),
)


def load_yaml(text: str) -> Any:
    """Safe YAML (no tags that build objects) with duplicate keys refused; text that Python cannot hold (an integer
    of thousands of digits, nesting past the recursion limit) is a ``yaml.YAMLError`` like any other bad YAML."""
    try:
        return yaml.load(text, Loader=UniqueKeyLoader)  # a SafeLoader: builds no objects
    except RecursionError:
        raise yaml.YAMLError("nested too deeply to read") from None
    except ValueError as err:  # int("9" * 5000): "Exceeds the limit (4300 digits) for integer string conversion…"
        raise yaml.YAMLError(f"a value too large to read ({str(err).split(':')[0]})") from None


def yaml_problem(err: yaml.YAMLError, invalid: str = "not valid YAML") -> str:
    """A YAML error in one line: ``duplicate key 'seed' (line 4)``, ``not valid YAML (line 2: expected ',')``."""
    mark = getattr(err, "problem_mark", None)
    line = f"line {mark.line + 1}" if mark is not None else ""
    problem = getattr(err, "problem", None) or " ".join(str(err).split())
    if problem.startswith("duplicate key"):
        return f"{problem} ({line})" if line else problem
    return f"{invalid} ({line}: {problem})" if line else f"{invalid} ({problem})"


def read_yaml(path: str | Path) -> dict[str, Any]:
    """A recipe file's mapping; ``recipes/...`` absent here is read from the package (mydecide.starter)."""
    from mydecide.starter import packaged_recipe

    path = packaged_recipe(path) or Path(path)
    if not path.is_file():
        raise RecipeError(f"{path}: no such recipe file")
    try:
        data = load_yaml(path.read_text(encoding="utf-8")) or {}
    except UnicodeDecodeError as err:
        raise RecipeError(f"{path}: not UTF-8 text ({err.reason} at byte {err.start}); is it a recipe?") from None
    except yaml.YAMLError as err:
        raise RecipeError(f"{path}: {yaml_problem(err)}") from None
    if not isinstance(data, dict):
        raise RecipeError(f"{path}: a recipe must be a YAML mapping")
    return data


def nest(flat: Mapping[str, Any]) -> dict[str, Any]:
    """``{"costs.right": 2}`` → ``{"costs": {"right": 2}}``."""
    nested: dict[str, Any] = {}
    for key, value in flat.items():
        *sections, last = key.split(".")
        node = nested
        for part in sections:
            node = node.setdefault(part, {})
        node[last] = value
    return nested


# validation errors of a value of the wrong type, whose message gains the value given
WRONG_TYPE = {"int_type", "float_type", "bool_type", "string_type", "literal_error"}


def describe_errors(
    err: ValidationError,
    model: type[BaseModel],
    where: str,
    overrides: Sequence[str] = (),
    options: Collection[str] = (),
) -> str:
    """One line for all of a validation error's problems, each blamed on the override that set the key (when
    one did), on the command line (``options``: the dotted keys its options set) or on ``where``; an unknown key
    gets a did-you-mean among the keys of its section."""
    typed = [(item, item.split("=", 1)[0].strip()) for item in overrides if "=" in item]
    problems = []
    lookalike = {  # a required key written with a look-alike letter: its unknown key says all, not "Field required"
        (*e["loc"][:-1], plain_letters(str(e["loc"][-1])))
        for e in err.errors()
        if e["type"] == "extra_forbidden" and not str(e["loc"][-1]).isascii()
    }
    for e in err.errors():
        loc = tuple(e["loc"])
        if e["type"] == "missing" and loc in lookalike:
            continue
        keys, parent = section_keys(model, loc[:-1])
        message = e["msg"]
        if e["type"] in WRONG_TYPE and isinstance(e.get("input"), (bool, int, float, str)):
            given = json.dumps(e["input"], ensure_ascii=False)  # strict types: say what was given (true is not 1)
            message += f", not {given if len(given) <= 60 else given[:59] + '…'}"
        if e["type"] == "extra_forbidden":
            message = unknown_key(str(loc[-1]), keys, parent)
        written = ".".join([*parent, str(loc[-1])] if loc else parent)
        key = written.encode("ascii", "backslashreplace").decode() if written else "(top)"  # shows what is hidden
        blamed = next((item for item, dotted in typed if _same_key(dotted, written)), None)
        if blamed:
            problems.append(f"command-line override {blamed}: {key}: {message}")
        elif any(_same_key(dotted, written) for dotted in options):
            problems.append(f"command line: {key}: {message}")
        else:
            problems.append(f"{where}: {key}: {message}")
    return "; ".join(problems)


INVISIBLE = ("Cf", "Zs", "Mn")  # format characters (zero-width space, joiners, BOM), spaces, combining marks
# letters of other scripts drawn like Latin ones (Cyrillic, Greek): a key typed or pasted with one looks right
LOOKALIKES = str.maketrans(
    "аеорсухіјѕԁԛԝһкАВЕКМНОРСТХІЈЅοαικνρτυχΑΒΕΗΙΚΜΝΟΡΤΧΥΖ",
    "aeopcyxijsdqwhkABEKMHOPCTXIJSoaikvptuxABEHIKMNOPTXYZ",
)


def plain_letters(key: str) -> str:
    """``key`` with look-alike letters made Latin and invisible characters left out."""
    return "".join(c for c in key.translate(LOOKALIKES) if unicodedata.category(c) not in INVISIBLE)


def unknown_key(key: str, keys: list[str], parent: list[str]) -> str:
    """ "unknown key", with the key of its section it was meant to be. A key with an invisible or a look-alike
    character (``split\u200b``, a Cyrillic ``ѕources``) looks right on screen: the message names the character."""
    odd = list(dict.fromkeys(c for c in key if not c.isascii()))
    if not odd:
        close = difflib.get_close_matches(key, keys, n=1, cutoff=0.6)
        return "unknown key" + (f" (did you mean {'.'.join([*parent, close[0]])}?)" if close else "")
    plain = plain_letters(key)
    meant = plain if plain in keys else next(iter(difflib.get_close_matches(plain, keys, n=1, cutoff=0.6)), None)

    def what(c: str) -> str:
        name = f"U+{ord(c):04X} {unicodedata.name(c, 'unnamed')}"
        if unicodedata.category(c) in INVISIBLE:
            return f"{name}, invisible"
        latin = c.translate(LOOKALIKES)
        return f"{name}, a look-alike of {latin!r}" if latin != c else f"{name}, not ASCII"

    said = f"unknown key: it holds {'; '.join(map(what, odd))}"
    if meant is None:
        return said
    meant = ".".join([*parent, meant])
    return (
        f"{said}; in plain letters it reads {meant}: retype it"
        if plain == meant.rsplit(".", 1)[-1]
        else (f"{said} (did you mean {meant}?)")
    )


def _same_key(dotted: str, written: str) -> bool:
    """Whether an override of ``dotted`` set the key ``written`` (itself, a section holding it, or a key below a
    value that is not a section)."""
    return bool(written) and (written == dotted or written.startswith(dotted + ".") or dotted.startswith(written + "."))


def section_keys(model: type[BaseModel], loc: tuple[Any, ...]) -> tuple[list[str], list[str]]:
    """The keys of the recipe section at a validation error's ``loc`` ([] when unknown), and ``loc`` as the user
    writes it: without the tags of tagged unions."""
    current: Any = model
    written: list[str] = []
    for part in loc:
        if isinstance(part, int):  # an item of a list: shown, as in sources.0.kind
            written.append(str(part))
            continue
        if isinstance(current, list):  # a tagged union: the part is the tag
            current = next((m for m in current if m.model_fields["kind"].default == part), None)
            continue
        written.append(str(part))
        is_model = isinstance(current, type) and issubclass(current, BaseModel)
        field = current.model_fields.get(part) if is_model else None
        members = _models_in(field.annotation) if field is not None else []
        current = members[0] if len(members) == 1 else members or None
    is_model = isinstance(current, type) and issubclass(current, BaseModel)
    return (list(current.model_fields) if is_model else []), written


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for a in get_args(annotation) for m in _models_in(a)]


class Strict(BaseModel):
    """Every recipe section: an unknown key is an error, and so is a value of another type than the key's, with no
    conversion (``true`` is not the integer 1, ``"5"`` not the number 5, ``2.0`` not the integer 2); ``.inf`` and
    ``.nan`` are no numbers either."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


Seed = Annotated[int, Field(ge=0, le=2**32 - 1)]
"""A seed numpy, torch and datasketch all take: 0 to 2³²−1."""
