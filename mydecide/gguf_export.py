"""`mydecide export-gguf`: a letters-form adapter merged into its base and written as a decision GGUF that
llama.cpp's ``/v1/systemone`` answers (docs/serving.md#export-gguf).

llama.cpp's ``openjev`` decision type renders each question with the model's ``systemone`` chat template, tokenises
the whole text, and reads one label token per option (A, B, …; a yes / no question's "true" first) at the last
token, then a softmax at ``<arch>.decision.temperature.<type>[.<bucket>]``. That is mydecide's letters read, so a
letters-form adapter (``prompt.option_form=letters prompt.score_form=letters``) is answered the same when:

* the template renders exactly the Renderer's text (:data:`SYSTEMONE_TEMPLATE`, the head and tail rendered here);
* the whole text tokenises to the Renderer's segment-by-segment token ids (checked on sample questions);
* the temperatures map onto llama.cpp's buckets (:func:`decision_temperatures`).

The tensors are the merged float32 weights (F32, F16, or Q8_0 through gguf-py's quantize); everything else
(hyperparameters, tokenizer, chat template) is copied from the base's own GGUF file, the only base form this
exports from.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from mydecide.errors import UserError
from mydecide.formats import check_format, stamped
from mydecide.io import holds, provenance, refuse_link
from mydecide.prompt import RenderConfig
from mydecide.records import parse_question
from mydecide.scoring.render import LETTERS, Renderer, question_text, render_state

GGUF_TYPES = ("f16", "q8_0", "f32")
EXPORT_KEY = "mydecide.export"  # a JSON record that marks a file export-gguf wrote: only such a one is replaced
EXPORT_FORMAT = 1
DECISION_TYPE = "openjev"
ARCHITECTURES = ("llama",)  # whose tensor layout (Q/K rows permuted per head) this writes and tests
LLAMA_CPP_TYPES = ("choice", "noul", "score")
LLAMA_CPP_BUCKETS = {"2": range(2, 3), "3_5": range(3, 6), "6_10": range(6, 11), "11": range(11, 27)}
"""llama.cpp's option-count buckets (get_temperature: K ≤ 2, ≤ 5, ≤ 10, more), over the K mydecide shows in one
letters prompt (2–26)."""
SHOWN_K = {"choice": range(2, 27), "noul": range(2, 3), "score": range(2, 11)}
LETTERS_ADVICE = "train with prompt.option_form=letters prompt.score_form=letters"


def _literal(text: str) -> str:
    """``text`` as a double-quoted Jinja string literal that Python's Jinja and llama.cpp's own engine read alike
    (llama.cpp knows the escapes \\n \\t \\r \\b \\f \\v \\\\ \\' \\" only)."""
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\r", "\\r")
    return '"' + escaped.replace("\t", "\\t") + '"'


SYSTEMONE_TEMPLATE = (
    # every piece of text is an expression, so llama.cpp's trim_blocks / lstrip_blocks (on) and Python Jinja's
    # (off by default) render the same characters
    "{%- set letters = [" + ", ".join(_literal(c) for c in LETTERS) + "] -%}"
    '{%- if options | length > 26 -%}{{- raise_exception("this decision model reads at most 26 options (A-Z)") -}}'
    "{%- endif -%}"
    "{{- HEAD -}}"
    "{%- if state is string -%}{{- state -}}"
    "{%- elif state is mapping -%}{{- state | tojson(indent=2) -}}"
    '{%- else -%}{{- state | join("\\n") -}}{%- endif -%}'
    '{{- "\\n\\nQuestion: " -}}{{- instructions -}}'
    '{%- if type == "noul" and not (options[0].description or options[1].description) -%}'
    '{{- "\\nAnswer A for yes or B for no." -}}'
    "{%- else -%}"
    '{%- if type == "choice" -%}{{- "\\nChoose one option." -}}'
    '{%- elif type == "noul" -%}{{- "\\nAnswer yes or no." -}}'
    '{%- else -%}{{- "\\nChoose one level (levels are listed lowest first)." -}}{%- endif -%}'
    "{%- for o in options -%}"
    '{{- "\\n" -}}{{- letters[loop.index0] -}}{{- ". " -}}'
    '{%- if type == "score" -%}{{- o.description -}}'
    "{%- else -%}"
    '{%- if type == "noul" -%}{%- if o.key == "true" -%}{{- "yes" -}}{%- else -%}{{- "no" -}}{%- endif -%}'
    "{%- else -%}{{- o.key -}}{%- endif -%}"
    '{%- if o.description -%}{{- " — " -}}{{- o.description -}}{%- endif -%}'
    "{%- endif -%}"
    "{%- endfor -%}"
    '{{- "\\nAnswer with the letter only." -}}'
    "{%- endif -%}"
    "{{- TAIL -}}"
)
"""The ``systemone`` chat template, with HEAD and TAIL to be replaced by the Renderer's literal head and tail. Its
inputs are llama.cpp's (server-decision.cpp): ``id``, ``type``, ``instructions``, ``state`` (the request's JSON),
``options`` (``key``, ``description``: choice in the request's order, score keys "0"…, noul "true" then "false")."""


def systemone_template(renderer: Renderer) -> str:
    """The template for one renderer: its head (the chat template up to "State:\\n") and tail (after the question,
    ending at the answer slot) rendered once, here, as literals."""
    return SYSTEMONE_TEMPLATE.replace("HEAD", _literal(renderer.head)).replace("TAIL", _literal(renderer.tail))


# ------------------------------------------------------------------------------------------ requests and checks


def systemone_question(question: Mapping[str, Any]) -> dict[str, Any]:
    """A mydecide question (choice, noul or score) as llama.cpp's /v1/systemone takes it: a choice's option list
    becomes an object of options without description (llama.cpp takes objects only)."""
    q = dict(question)
    if q.get("type") == "choice" and isinstance(q.get("criteria"), list):
        q["criteria"] = {option: None for option in q["criteria"]}
    return q


def template_inputs(state: Any, qid: str, question: Mapping[str, Any]) -> dict[str, Any]:
    """What llama.cpp gives the template for one /v1/systemone question (``question`` in its wire form)."""
    qtype, criteria = question["type"], question.get("criteria") or {}
    if qtype == "choice":
        options = list(criteria.items())
    elif qtype == "score":
        options = [(str(i), level) for i, level in enumerate(criteria)]
    else:  # noul: "true" first (llama.cpp's noul_true_first for openjev)
        options = [("true", criteria.get("true")), ("false", criteria.get("false"))]
    return {
        "id": qid,
        "type": qtype,
        "instructions": question["instructions"],
        "state": state,
        "options": [{"key": key, "description": description} for key, description in options],
        "images": [],
    }


def render_systemone(template: str, state: Any, qid: str, question: Mapping[str, Any]) -> str:
    """The template rendered by Python's Jinja with llama.cpp's settings (trim_blocks, lstrip_blocks) and its
    ``tojson`` (no ASCII escaping, keys in order). llama.cpp runs its own Jinja engine: the bench checks that one."""
    from jinja2 import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def tojson(value: Any, indent: int | None = None, ensure_ascii: bool = False) -> str:
        return json.dumps(value, indent=indent, ensure_ascii=ensure_ascii)

    def raise_exception(message: str) -> None:
        raise TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    return env.from_string(template).render(**template_inputs(state, qid, question))


def renderer_text(renderer: Renderer, state: Any, question: Mapping[str, Any]) -> str:
    """The text the Renderer tokenises for a letters read (its prefix then its suffix, options in request order)."""
    q = parse_question(dict(question))
    return renderer.head + render_state(state) + question_text(q, range(q.k)) + renderer.tail


def check_whole_text_tokens(renderer: Renderer, template: str, items: Iterable[tuple[Any, Mapping[str, Any]]]) -> int:
    """Refuse (one line, naming the question) unless the template renders the Renderer's text and that text,
    tokenised whole as llama.cpp does, gives the Renderer's segment-by-segment token ids. Returns how many."""
    n = 0
    for state, question in items:
        text = render_systemone(template, state, "q", systemone_question(question))
        if text != renderer_text(renderer, state, question):
            raise UserError(f"question {question['instructions']!r}: the systemone template renders another text")
        prompt = renderer.render(state, parse_question(dict(question)))
        whole = list(renderer.tokenizer(text, add_special_tokens=False)["input_ids"])
        if prompt.truncated or whole != [*prompt.prefix, *prompt.suffix]:
            raise UserError(
                f"question {question['instructions']!r}: this tokenizer splits the whole prompt into other tokens "
                "than mydecide's segments, so llama.cpp would read another prompt; export-gguf cannot export it"
            )
        n += 1
    return n


def check_letters(render: RenderConfig | None, adapter: Path) -> RenderConfig:
    """The adapter's render config, refused (one line) unless both choice and score questions are read by letters."""
    render = render or RenderConfig()
    if render.option_form != "letters" or render.score_form != "letters":
        raise UserError(
            f"{adapter}: trained with prompt.option_form={render.option_form} prompt.score_form={render.score_form}; "
            "llama.cpp's /v1/systemone reads one letter per option at the last token, the letters form only: "
            f"{LETTERS_ADVICE}"
        )
    return render


def decision_temperatures(table: Any, path: Path) -> dict[str, float]:
    """temperatures.json as llama.cpp's ``<arch>.decision.temperature.<name>`` keys: one per type, and one per
    llama.cpp bucket whose K all have the same mydecide temperature, other than the type's. Refused (one line):
    set or span temperatures (llama.cpp has neither type), score level maps (it applies a temperature only), and
    mydecide buckets that split a llama.cpp bucket."""
    for qtype in ("set", "span"):
        if qtype in table.types or qtype in table.buckets:
            raise UserError(
                f"{path}: has a {qtype} temperature: llama.cpp's /v1/systemone has no {qtype} questions; calibrate "
                "on choice, noul and score questions only (the recipe's data)"
            )
    if table.level_maps:
        raise UserError(
            f"{path}: has score level maps (K = {', '.join(map(str, sorted(table.level_maps)))}), which llama.cpp "
            "cannot apply (it divides by one temperature); calibrate with level_maps=false"
        )
    keys: dict[str, float] = {}
    for qtype in LLAMA_CPP_TYPES:
        keys[qtype] = float(table.types.get(qtype, 1.0))
        for bucket, ks in LLAMA_CPP_BUCKETS.items():
            shown = [k for k in ks if k in SHOWN_K[qtype]]
            values = sorted({float(table(qtype, k)) for k in shown})
            if len(values) > 1:
                raise UserError(
                    f"{path}: {qtype} temperatures differ within llama.cpp's option-count bucket {bucket} "
                    f"(K = {shown[0]}–{shown[-1]}: {', '.join(f'{v:.4g}' for v in values)}); llama.cpp has one per "
                    "bucket 2, 3_5, 6_10, 11: calibrate without by_bucket=true"
                )
            if values and values[0] != keys[qtype]:
                keys[f"{qtype}.{bucket}"] = values[0]
    return keys


def exported_record(path: Path) -> dict[str, Any] | None:
    """The export record of a GGUF file export-gguf wrote, else None (any other file, GGUF or not)."""
    import gguf

    try:
        field = gguf.GGUFReader(path).fields.get(EXPORT_KEY)
        record = json.loads(field.contents()) if field is not None else None
        check_format(record, path, version=EXPORT_FORMAT, remedy="")
    except Exception:  # not a GGUF, a damaged one, another tool's: not export-gguf's to replace
        return None
    return record


def check_gguf_out(out: Path, adapter: Path) -> None:
    """Refuse, before any work, an --out that export-gguf would replace but did not write (one line): a symbolic
    link, a directory, a path inside the adapter, an existing file that is not an earlier export."""
    refuse_link(out)
    if out.is_dir():
        raise UserError(f"{out}: is a directory; give the .gguf file to write (e.g. {out}/model.gguf)")
    if holds(adapter, out):
        raise UserError(f"--out {out}: lies inside --adapter {adapter}, which export-gguf must not change")
    if out.exists() and exported_record(out) is None:
        raise UserError(f"{out}: exists and is not a GGUF written by export-gguf; choose another --out")


def source_gguf(model: str) -> Path:
    """The GGUF file a base came from (the embedded default's packaged file, or a .gguf path); an HF-directory or
    hub base is refused (one line): its tokenizer would have to be rewritten for llama.cpp, which this does not."""
    from mydecide.modeling import DEFAULT_MODEL, packaged_gguf

    if model == DEFAULT_MODEL:
        return packaged_gguf()
    if Path(model).suffix == ".gguf":
        if not Path(model).is_file():
            raise FileNotFoundError(f"{model}: no such GGUF file")
        return Path(model)
    raise UserError(
        f"--model {model}: export-gguf exports from a base given as a GGUF file (smollm2-135m or a .gguf path), "
        "whose tokenizer and settings it copies; convert this base with llama.cpp's convert_hf_to_gguf.py and pass "
        "that file as --model"
    )


def gguf_architecture(path: Path) -> str:
    """The ``general.architecture`` of a GGUF file (a damaged or foreign file: one line naming it)."""
    import gguf

    try:
        field = gguf.GGUFReader(path).fields.get("general.architecture")
    except (OSError, ValueError) as err:
        raise UserError(f"{path}: not a readable GGUF file ({err})") from None
    if field is None:
        raise UserError(f"{path}: a GGUF file without general.architecture")
    return str(field.contents())


def log(message: str) -> None:
    print(f"[mydecide] export-gguf: {message}", file=sys.stderr, flush=True)


def export_gguf(
    adapter: str | Path,
    temperatures: str | Path | None,
    out: str | Path,
    *,
    gguf_type: str = "f16",
    model: str | None = None,
    sample: Sequence[tuple[Any, Mapping[str, Any]]] | None = None,
) -> dict[str, Any]:
    """Check everything that can be checked cheaply, load base + adapter in float32, merge, check the template and
    the whole-text tokens on ``sample`` (default: merge's sample questions without the set one), then write ``out``
    atomically. Returns the export record written into the file."""
    from mydecide.adapters import check_adapter
    from mydecide.calibration.temperatures import load_temperatures
    from mydecide.hub import local_adapter
    from mydecide.merging import SAMPLE_QUESTIONS, base_model_of
    from mydecide.modeling import check_model
    from mydecide.scoring.span_head import adapter_has_head

    if gguf_type not in GGUF_TYPES:
        raise UserError(f"--type {gguf_type}: not one of {', '.join(GGUF_TYPES)}")
    adapter, out = local_adapter(adapter), Path(out)
    check_adapter(adapter)
    check_gguf_out(out, adapter)
    if adapter_has_head(adapter):
        raise UserError(
            f"{adapter}: carries a span head (trained on span questions), which llama.cpp cannot read; train "
            "without span data (tasks=[...]) to export it"
        )
    model = model or base_model_of(adapter)
    source = source_gguf(model)
    arch = gguf_architecture(source)
    if arch not in ARCHITECTURES:
        raise UserError(f"{source}: a {arch} model; export-gguf writes the {', '.join(ARCHITECTURES)} architecture")
    checked = check_model(model, adapter)
    render = check_letters(checked.saved, adapter)
    keys = decision_temperatures(load_temperatures(temperatures), Path(temperatures)) if temperatures else {}
    keys = keys or {qtype: 1.0 for qtype in LLAMA_CPP_TYPES}

    import torch

    from mydecide.gguf_tensors import merged_weights, write_decision_gguf
    from mydecide.modeling import load_model

    log(f"loading {model} with {adapter} (float32)")
    loaded = load_model(checked, device="cpu", dtype=torch.float32)
    if loaded.renderer.label_form != "A":
        raise UserError(
            f"{model}: its answer labels read {loaded.renderer.label_form!r} after the chat prompt, and llama.cpp "
            "reads the label 'A' tokenised alone; this model cannot be exported for llama.cpp"
        )
    template = systemone_template(loaded.renderer)
    items = sample if sample is not None else [(s, q) for s, q in SAMPLE_QUESTIONS if q["type"] != "set"]
    checked_n = check_whole_text_tokens(loaded.renderer, template, items)
    log(f"the systemone template renders mydecide's prompt and its tokens on {checked_n} sample questions")
    log("merging the adapter into the base (float32)")
    weights = merged_weights(loaded)
    del loaded
    record = stamped(
        {
            "adapter": str(adapter),
            "base": model,
            "source_gguf": source.name,
            "type": gguf_type,
            "temperatures": str(temperatures) if temperatures else None,
            "decision_temperatures": keys,
            "render": render.model_dump(),
            "checked_questions": checked_n,
            "provenance": provenance(),
        },
        EXPORT_FORMAT,
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp")
    os.close(fd)
    try:
        strings = {
            "{arch}.decision.type": DECISION_TYPE,
            "tokenizer.chat_template.systemone": template,
            EXPORT_KEY: json.dumps(record, ensure_ascii=False),
        }
        floats = {f"{{arch}}.decision.temperature.{name}": value for name, value in keys.items()}
        written = write_decision_gguf(source, weights, Path(tmp), gguf_type, strings, floats, log)
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    log(f"wrote {out}: {written} tensors ({gguf_type}), decision type {DECISION_TYPE}, temperatures {keys}")
    return record


def _umask() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return umask
