"""The mistakes a user makes on the way (an existing run, a misspelt model, a file for a directory and the reverse,
a recipe for another command, a misspelt override) each end in one line on stderr naming what and where, exit
code 2 and no traceback; plus the small things of the command line (--version, flag names, a quiet model load)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from mydecide.cli import app

REPO = Path(__file__).resolve().parents[2]
SMOKE = REPO / "recipes" / "train" / "smoke.yaml"
RECORD = {
    "task": "route",
    "state": "the invoice was charged twice",
    "question": {"type": "choice", "instructions": "Which team?", "criteria": ["billing", "engineering"]},
    "answer": "billing",
}


def prepared(out: Path) -> Path:
    """A minimal `mydecide prepare` output directory."""
    out.mkdir(parents=True, exist_ok=True)
    for name in ("train.jsonl", "dev.jsonl"):
        (out / name).write_text("".join(json.dumps({**RECORD, "id": f"{name}-{i}"}) + "\n" for i in range(4)))
    return out


def one_line_error(result: Any) -> str:
    """The single stderr line of a command that failed as a user error should."""
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    return lines[0]


def test_a_second_run_into_an_existing_directory(tiny_llama_dir: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("")
    result = CliRunner().invoke(
        app,
        [
            "train",
            str(SMOKE),
            "--model",
            str(tiny_llama_dir),
            "--data",
            str(prepared(tmp_path / "data")),
            "--out",
            str(run),
        ],
    )
    line = one_line_error(result)
    assert line == f"error: {run}: run directory exists; pass --resume to continue it or choose --out"


def test_a_misspelt_model_fails_before_any_work_offline_and_names_the_alias(tmp_path: Path) -> None:
    exe = Path(sys.executable).parent / "mydecide"
    run = tmp_path / "run"
    cache = tmp_path / "mydecide-cache"
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "HF_HOME": str(tmp_path / "hf"),
        "HF_HUB_CACHE": str(tmp_path / "hub"),
        "MYDECIDE_CACHE": str(cache),
    }
    cmd = [
        str(exe) if exe.is_file() else sys.executable,
        *([] if exe.is_file() else ["-m", "mydecide.cli"]),
        "train",
        str(SMOKE),
        "--model",
        "smollm2-136m",
        "--data",
        str(prepared(tmp_path / "data")),
        "--out",
        str(run),
    ]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert lines == [
        f"error: smollm2-136m: not a local model directory, not an alias (smollm2-135m; did you mean "
        f"smollm2-135m?), not in the local Hugging Face cache ({tmp_path / 'hub'}), and the hub is "
        "off (HF_HUB_OFFLINE is set)"
    ]
    # "fast" as work, not seconds: nothing was converted, downloaded or cached before the error
    assert not cache.exists() and not (tmp_path / "hub").exists(), sorted(p.name for p in tmp_path.iterdir())
    assert not run.exists()  # the typo left no run directory behind, so the corrected command just works


@pytest.mark.parametrize("verb", ["predict", "calibrate", "evaluate", "serve", "merge"])
def test_every_command_fails_before_any_work_on_a_misspelt_model(verb: str, tmp_path: Path) -> None:
    (tmp_path / "request.json").write_text(
        json.dumps({"state": "s", "questions": {"q": {"type": "noul", "instructions": "ok?"}}})
    )
    (tmp_path / "dev.jsonl").write_text(json.dumps({**RECORD, "id": "d"}) + "\n")
    (tmp_path / "adapter").mkdir()
    (tmp_path / "adapter" / "adapter_config.json").write_text("{}")
    args = {
        "predict": [str(tmp_path / "request.json")],
        "calibrate": ["--data", str(tmp_path / "dev.jsonl"), "--out", str(tmp_path / "t.json")],
        "evaluate": ["--data", str(tmp_path / "dev.jsonl"), "--out", str(tmp_path / "eval")],
        "serve": [],
        "merge": ["--adapter", str(tmp_path / "adapter"), "--out", str(tmp_path / "merged")],
    }[verb]
    cache = tmp_path / "mydecide-cache"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path / "hub"), "MYDECIDE_CACHE": str(cache)}
    result = subprocess.run(
        [sys.executable, "-m", "mydecide.cli", verb, "--model", "smollm2-136m", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=tmp_path,
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: smollm2-136m: not a local model directory"), lines
    assert "did you mean smollm2-135m?" in lines[0]
    assert not cache.exists() and not (tmp_path / "hub").exists()  # failed before converting or caching anything


class Unreachable(Exception):
    pass


@pytest.mark.parametrize(
    ("raised", "says"),
    [
        (
            Unreachable("[Errno -2] Name or service not known"),
            "the hub cannot be reached ([Errno -2] Name or service not known)",
        ),
        ("missing", "the hub has no model 'someone/smollm-2' (or it is private)"),
    ],
)
def test_a_hub_name_that_is_not_cached_asks_the_hub_once(
    raised: Any, says: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import huggingface_hub
    from huggingface_hub.errors import RepositoryNotFoundError

    from mydecide.hub import HUB_PROBE_TIMEOUT_S, ModelNotFoundError
    from mydecide.modeling import resolve_model_path

    calls = []
    if raised == "missing":  # the hub's answer for a repository it does not have (built without an HTTP response)
        raised = RepositoryNotFoundError.__new__(RepositoryNotFoundError)
        Exception.__init__(raised, "404 Repository Not Found")

    def model_info(name: str, *, timeout: float) -> None:
        calls.append((name, timeout))
        raise raised

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(huggingface_hub, "model_info", model_info)
    with pytest.raises(ModelNotFoundError) as err:
        resolve_model_path("someone/smollm-2")
    assert str(err.value) == (
        f"someone/smollm-2: not a local model directory, not an alias (smollm2-135m), not in "
        f"the local Hugging Face cache ({tmp_path}), and {says}"
    )
    assert calls == [("someone/smollm-2", HUB_PROBE_TIMEOUT_S)]


def test_a_cached_hub_model_needs_no_hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import huggingface_hub

    from mydecide.modeling import resolve_model_path

    snapshot = tmp_path / "models--someone--tiny" / "snapshots" / "abc"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (tmp_path / "models--someone--tiny" / "refs").mkdir()
    (tmp_path / "models--someone--tiny" / "refs" / "main").write_text("abc")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(huggingface_hub, "model_info", lambda *a, **k: pytest.fail("the hub was asked"))
    assert resolve_model_path("someone/tiny") == ("someone/tiny", {})


def test_train_data_given_as_a_file_or_a_missing_directory(tmp_path: Path) -> None:
    data = prepared(tmp_path / "data")
    base = ["train", str(SMOKE), "--model", "smollm2-135m", "--out", str(tmp_path / "run")]
    as_file = CliRunner().invoke(app, [*base, "--data", str(data / "train.jsonl")])
    assert one_line_error(as_file) == (
        f"error: --data {data / 'train.jsonl'} is a file; train reads the directory `mydecide prepare` wrote, "
        f"with train.jsonl and dev.jsonl in it (here: --data {data})"
    )
    data_recipe = REPO / "recipes" / "data" / "demo.yaml"
    as_recipe = CliRunner().invoke(app, [*base, "--data", str(data_recipe)])
    assert one_line_error(as_recipe).endswith(
        f"in it; for a data recipe, run `mydecide prepare {data_recipe} --out DIR` first"
    )
    missing = CliRunner().invoke(app, [*base, "--data", str(tmp_path / "nope")])
    assert "no such directory" in one_line_error(missing)
    (data / "dev.jsonl").write_text("")  # prepared with split.dev_fraction 0: the best adapter would be update 0's
    empty_dev = CliRunner().invoke(app, [*base, "--data", str(data)])
    assert one_line_error(empty_dev) == (
        f"error: {data / 'dev.jsonl'}: file holds no records; train keeps the adapter that is best on dev, so it "
        f"needs dev records (prepare {data} with split.dev_fraction > 0)"
    )
    (data / "dev.jsonl").unlink()
    no_dev = CliRunner().invoke(app, [*base, "--data", str(data)])
    assert one_line_error(no_dev).endswith("no dev.jsonl in it; it is not an output directory of `mydecide prepare`")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("damage", ["mixed", "missing", "bad line"])
def test_train_checks_its_data_before_any_model_is_touched(
    damage: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bad data directory is one line and exit 2 without converting the embedded default (the suite's cache is
    empty, as on a fresh machine) and without loading any model."""
    import mydecide.modeling

    def no_model(*args: Any, **kwargs: Any) -> None:
        pytest.fail("a model was loaded or converted before the data was checked")

    monkeypatch.setattr(mydecide.modeling, "load_model", no_model)
    monkeypatch.setattr(mydecide.modeling, "convert_gguf", no_model)
    data = prepared(tmp_path / "data")
    if damage == "mixed":  # the manifest records another train.jsonl: two prepare runs in one directory
        from mydecide.manifest import write_manifest

        write_manifest(data, {}, ["train.jsonl", "dev.jsonl"])
        (data / "train.jsonl").write_text((data / "dev.jsonl").read_text())
    elif damage == "missing":
        (data / "train.jsonl").unlink()
    else:
        (data / "dev.jsonl").write_text((data / "dev.jsonl").read_text() + "{not json\n")
    result = CliRunner().invoke(
        app, ["train", str(SMOKE), "--model", "smollm2-135m", "--data", str(data), "--out", str(tmp_path / "run")]
    )
    line = one_line_error(result)
    assert ("train.jsonl" if damage != "bad line" else "dev.jsonl") in line
    assert not any(Path(os.environ["MYDECIDE_CACHE"]).iterdir())
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("verb", ["calibrate", "evaluate"])
def test_a_directory_where_a_records_file_is_expected(verb: str, tmp_path: Path) -> None:
    data = prepared(tmp_path / "data")
    result = CliRunner().invoke(
        app, [verb, "--model", "smollm2-135m", "--data", str(data), "--out", str(tmp_path / "out")]
    )
    assert one_line_error(result) == (
        f"error: --data {data} is a directory; this command reads a JSONL file of "
        "decision records: give one of its files (dev.jsonl, train.jsonl)"
    )


def test_a_directory_where_the_temperatures_file_is_expected(tmp_path: Path) -> None:
    (tmp_path / "temperatures.json").write_text("{}")
    (tmp_path / "request.json").write_text(
        json.dumps({"state": "s", "questions": {"q": {"type": "noul", "instructions": "ok?"}}})
    )
    result = CliRunner().invoke(app, ["predict", "--temperatures", str(tmp_path), str(tmp_path / "request.json")])
    assert one_line_error(result) == (
        f"error: {tmp_path} is a directory; --temperatures takes the temperatures.json "
        "file that `mydecide calibrate` wrote (it holds temperatures.json: give that "
        "file)"
    )


def test_a_directory_where_a_request_file_is_expected(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["predict", str(tmp_path)])
    assert (
        one_line_error(result) == f"error: {tmp_path} is a directory; give a JSON file holding one "
        "/v1/systemone request"
    )


def test_a_recipe_for_another_command(tmp_path: Path) -> None:
    data_recipe = REPO / "recipes" / "data" / "demo.yaml"
    result = CliRunner().invoke(app, ["train", str(data_recipe), "--data", str(prepared(tmp_path / "data"))])
    assert one_line_error(result) == f"error: {data_recipe}: this is a data recipe: use `mydecide prepare`"
    back = CliRunner().invoke(app, ["prepare", str(SMOKE)])
    assert one_line_error(back) == f"error: {SMOKE}: this is a training recipe: use `mydecide train`"


USAGE_ERRORS: list[tuple[list[str], str, str | None]] = [
    (["serve", "--port", "70000"], "Invalid value for '--port': Input should be less than or equal to 65535", "serve"),
    (["serve", "--max-questions", "0"], "Invalid value for '--max-questions': Input should be greater than", "serve"),
    (["serve", "--request-timeout", "0"], "Invalid value for '--request-timeout': Input should be greater", "serve"),
    (["serve", "--port", "abc"], "Invalid value for '--port': Input should be a valid integer", "serve"),
    (["prepare", "--engine"], "Option '--engine' requires an argument.", None),  # click gives no command here
    (["train", "--nope"], "No such option: --nope", "train"),
    (["--nope"], "No such option: --nope", ""),
    (["predict"], "Missing argument 'request'", "predict"),
    (["bogus"], "No such command 'bogus'", ""),
]


@pytest.mark.parametrize(("args", "message", "verb"), USAGE_ERRORS, ids=[" ".join(a) for a, _, _ in USAGE_ERRORS])
def test_a_usage_error_is_one_line_naming_the_option(args: list[str], message: str, verb: str) -> None:
    result = CliRunner().invoke(app, args, prog_name="mydecide")
    line = one_line_error(result)
    assert line.startswith(f"error: {message}"), line
    if verb is None:
        assert line == f"error: {message}"
    else:
        assert line.endswith(f"; see `{' '.join(['mydecide', verb]).strip()} --help`"), line
    assert result.stdout == ""


def test_usage_errors_help_and_version_from_the_command_line(tmp_path: Path) -> None:
    """Through main() (python -m mydecide.cli, as the console script): usage errors are one line and 2; --help,
    --version and no arguments at all are as before."""

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-m", "mydecide.cli", *args]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=tmp_path)

    port = run("serve", "--port", "70000")
    assert (port.returncode, port.stdout) == (2, "")
    assert port.stderr == (
        "error: Invalid value for '--port': Input should be less than or equal to 65535; "
        "see `python -m mydecide.cli serve --help`\n"
    )
    unknown = run("prepare", "--bogus")
    assert unknown.returncode == 2 and unknown.stderr.startswith("error: No such option: --bogus")
    assert len(unknown.stderr.splitlines()) == 1
    version = run("--version")
    assert (version.returncode, version.stderr) == (0, "") and version.stdout.startswith("mydecide ")
    helped = run("serve", "--help")
    assert helped.returncode == 0 and "Usage: python -m mydecide.cli serve" in helped.stdout
    bare = run()  # no arguments: the help, and exit 2 (click's no_args_is_help)
    assert bare.returncode == 2 and "Usage: python -m mydecide.cli" in bare.stdout and bare.stderr == ""


def test_an_empty_recipe_is_called_empty_not_a_recipe_for_another_command(tmp_path: Path) -> None:
    for text in ("", "# nothing but a comment\n", "{}\n"):
        recipe = tmp_path / "recipe.yaml"
        recipe.write_text(text)
        result = CliRunner().invoke(app, ["prepare", str(recipe), "--out", str(tmp_path / "out")])
        assert one_line_error(result) == f"error: {recipe}: the recipe is empty; a data recipe needs sources"
    assert not (tmp_path / "out").exists()
    # an empty training recipe is all defaults (as the shipped serve recipe, comments only): train asks for data
    empty = CliRunner().invoke(app, ["train", str(recipe)])
    assert one_line_error(empty).startswith("error: no training data: give --data DIR")


def test_a_recipe_valid_for_several_other_commands_names_none_of_them(tmp_path: Path) -> None:
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("adapter: runs/x/adapter\n")  # calibrate, evaluate, serve and merge all take it
    result = CliRunner().invoke(app, ["train", str(recipe), "--data", str(prepared(tmp_path / "data"))])
    assert one_line_error(result) == f"error: {recipe}: adapter: unknown key"
    recipe.write_text("out: runs/x\n")
    result = CliRunner().invoke(app, ["prepare", str(recipe)])
    assert one_line_error(result) == f"error: {recipe}: sources: Field required"


def test_an_override_is_blamed_on_the_command_line_with_a_did_you_mean(tmp_path: Path) -> None:
    data = str(prepared(tmp_path / "data"))
    typed = CliRunner().invoke(app, ["train", str(SMOKE), "lora.rr=8", "--data", data])
    assert one_line_error(typed) == (
        "error: command-line override lora.rr=8: lora.rr: unknown key (did you mean lora.r?)"
    )
    tagged = CliRunner().invoke(app, ["train", str(SMOKE), "objective.kind=rlcd", "objective.group_sise=4"])
    assert one_line_error(tagged) == (
        "error: command-line override objective.group_sise=4: objective.group_sise: "
        "unknown key (did you mean objective.group_size?)"
    )
    recipe = tmp_path / "typo.yaml"
    recipe.write_text("optim: {lr: 1e-3, batchsize: 8}\n")
    in_file = CliRunner().invoke(app, ["train", str(recipe), "optim.lr=0", "--data", data])
    assert one_line_error(in_file) == (
        f"error: command-line override optim.lr=0: optim.lr: Input should be greater than 0; {recipe}: "
        "optim.batchsize: unknown key (did you mean optim.batch_size?)"
    )


def test_a_bad_command_line_option_of_calibrate_is_one_line(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["calibrate", "--data", str(tmp_path / "dev.jsonl"), "--limit", "0"])
    assert one_line_error(result) == "error: command line: limit: Input should be greater than or equal to 1"


def test_version_and_flag_names() -> None:
    from importlib.metadata import version

    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0 and result.stdout.strip() == f"mydecide {version('mydecide')}"
    predict_help = CliRunner().invoke(app, ["predict", "--help"], terminal_width=200).stdout
    assert "--no-shared-prefix" in predict_help and "--no-no-" not in predict_help


def test_loading_an_adapter_prints_no_peft_future_warning(tiny_llama_dir: Path, tmp_path: Path) -> None:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from mydecide.adapters import weights_fingerprint
    from mydecide.modeling import load_model, peft_warnings_silenced
    from mydecide.training.model_card import record_base_model

    base = AutoModelForCausalLM.from_pretrained(tiny_llama_dir)
    fingerprint = weights_fingerprint(base)
    with peft_warnings_silenced():
        lm = get_peft_model(base, LoraConfig(r=2, target_modules=["q_proj"], task_type="CAUSAL_LM"))
    lm.save_pretrained(tmp_path / "adapter")
    record_base_model(tmp_path / "adapter", str(tiny_llama_dir), fingerprint)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        load_model(str(tiny_llama_dir), tmp_path / "adapter")
    assert [str(w.message) for w in caught if issubclass(w.category, FutureWarning)] == []
    with warnings.catch_warnings(record=True) as caught:  # the warning silenced is real: unsilenced, it shows
        warnings.simplefilter("always")
        get_peft_model(
            AutoModelForCausalLM.from_pretrained(tiny_llama_dir),
            LoraConfig(r=2, target_modules=["q_proj"], task_type="CAUSAL_LM"),
        )
    assert any("is_gradient_checkpointing" in str(w.message) for w in caught)
