"""Category resume-adapters, part 2: damaged adapters read by predict and serve, an adapter on another base,
calibrating on training data, broken or absurd temperatures."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from assets import Env
from harness import Expect, Probe
from judge import (
    any_of,
    warned,
    warning_lines,
)
from prepare_inputs import accept, refuse
from resume import predict_ok, res_setup, res_with, resume_probe, set_json, truncate


def adapter_probes(env: Env) -> list[Probe]:
    """Damaged adapters, another base, the wrong directory as --adapter."""
    pred = ["predict", "request.json", "--model", "model", "--device", "cpu"]
    P: list[Probe] = []

    def add(*a: Any, **kw: Any) -> None:
        P.append(resume_probe(env, *a, **kw))

    # damaged adapters, read by predict
    ad = [*pred, "--adapter", "run/adapter"]
    add(
        "adapter-truncated",
        "adapter_model.safetensors cut in half",
        res_with(lambda w: truncate(w / "run/adapter/adapter_model.safetensors")),
        ad,
        refuse("adapter_model.safetensors"),
    )
    add(
        "adapter-empty-weights",
        "adapter_model.safetensors empty",
        res_with(lambda w: (w / "run/adapter/adapter_model.safetensors").write_bytes(b"")),
        ad,
        refuse("adapter_model.safetensors"),
    )
    add(
        "adapter-no-weights",
        "adapter_model.safetensors deleted",
        res_with(lambda w: (w / "run/adapter/adapter_model.safetensors").unlink()),
        ad,
        refuse("adapter_model.safetensors"),
    )
    add(
        "adapter-config-broken",
        "adapter_config.json not JSON",
        res_with(lambda w: (w / "run/adapter/adapter_config.json").write_text("{'r': 4,")),
        ad,
        refuse("adapter_config.json"),
    )
    add(
        "adapter-config-missing",
        "adapter_config.json deleted",
        res_with(lambda w: (w / "run/adapter/adapter_config.json").unlink()),
        ad,
        refuse("adapter_config.json"),
    )
    add(
        "adapter-wrong-r",
        "adapter_config.json says r=8 (weights are r=4)",
        res_with(lambda w: set_json(w / "run/adapter/adapter_config.json", r=8)),
        ad,
        refuse("adapter"),
    )
    add(
        "adapter-wrong-targets",
        "adapter_config.json targets a module that does not exist",
        res_with(lambda w: set_json(w / "run/adapter/adapter_config.json", target_modules=["nosuch_proj"])),
        ad,
        refuse("adapter"),
    )
    add(
        "adapter-render-broken",
        "mydecide_render.json not JSON",
        res_with(lambda w: (w / "run/adapter/mydecide_render.json").write_text("{")),
        ad,
        refuse("mydecide_render.json"),
    )
    add(
        "adapter-base-json-missing",
        "mydecide_base.json deleted (the base is no longer known)",
        res_with(lambda w: (w / "run/adapter/mydecide_base.json").unlink()),
        ad,
        Expect("a warning that the base cannot be checked, or a refusal", accept=warned("base")),
    )
    add(
        "adapter-other-base",
        "the adapter on another tiny llama of the same shapes",
        res_setup,
        ["predict", "request.json", "--model", "model_b", "--device", "cpu", "--adapter", "run/adapter"],
        refuse("--allow-other-base"),
    )
    add(
        "adapter-other-base-allowed",
        "… with --allow-other-base (says so, then answers)",
        res_setup,
        [
            "predict",
            "request.json",
            "--model",
            "model_b",
            "--device",
            "cpu",
            "--adapter",
            "run/adapter",
            "--allow-other-base",
        ],
        accept(
            any_of(lambda w, r: predict_ok(w, r) or (None if warning_lines(r) else "no warning line")),
            "answers, with a warning",
        ),
    )
    add(
        "adapter-is-run-dir",
        "--adapter run (the run, not run/adapter)",
        res_setup,
        [*pred, "--adapter", "run"],
        refuse("run"),
    )
    add(
        "adapter-is-model",
        "--adapter model (a base model directory)",
        res_setup,
        [*pred, "--adapter", "model"],
        refuse("model"),
    )
    add("adapter-ok", "the intact adapter (control)", res_setup, ad, accept(predict_ok, "a well-formed response"))
    add(
        "serve-truncated-adapter",
        "serve with a truncated adapter (subprocess)",
        res_with(lambda w: truncate(w / "run/adapter/adapter_model.safetensors")),
        ["serve", "--model", "model", "--adapter", "run/adapter", "--port", "0", "--device", "cpu"],
        refuse("adapter_model.safetensors"),
        subprocess_=True,
        timeout=60,
    )
    return P


def calibration_probes(env: Env) -> list[Probe]:
    """Calibrating on training data; evaluating with broken or absurd temperatures."""
    P: list[Probe] = []

    def add(*a: Any, **kw: Any) -> None:
        P.append(resume_probe(env, *a, **kw))

    # calibrating on training data
    cal = ["calibrate", "--model", "model", "--adapter", "run/adapter", "-q", "--out", "t.json", "--data"]
    add(
        "calibrate-train-split",
        "calibrate on data/train.jsonl",
        res_setup,
        [*cal, "data/train.jsonl"],
        refuse("train"),
    )
    add(
        "calibrate-train-copy",
        "calibrate on a copy of the train split elsewhere",
        res_with(lambda w: shutil.copy(w / "data/train.jsonl", w / "mydev.jsonl")),
        [*cal, "mydev.jsonl"],
        Expect("refused (it is the adapter's training data) or a warning", accept=warned("train")),
    )
    add(
        "calibrate-dev-plus-train",
        "calibrate on dev + train concatenated, inside the data directory",
        res_with(
            lambda w: (w / "data/devplus.jsonl").write_text(
                (w / "data/dev.jsonl").read_text() + (w / "data/train.jsonl").read_text()
            )
        ),
        [*cal, "data/devplus.jsonl"],
        refuse("train"),
    )
    add(
        "calibrate-dev-plus-train-elsewhere",
        "calibrate on dev + train concatenated, copied elsewhere",
        res_with(
            lambda w: (w / "devplus.jsonl").write_text(
                (w / "data/dev.jsonl").read_text() + (w / "data/train.jsonl").read_text()
            )
        ),
        [*cal, "devplus.jsonl"],
        Expect("refused or warned: it shares states with the training split", accept=warned("train")),
    )
    add(
        "evaluate-temps-broken",
        "evaluate with a broken temperatures.json",
        res_with(lambda w: (w / "temps.json").write_text("{")),
        [
            "evaluate",
            "--model",
            "model",
            "--adapter",
            "run/adapter",
            "--data",
            "data/dev.jsonl",
            "--out",
            "ev",
            "-q",
            "-t",
            "temps.json",
        ],
        refuse("temps.json"),
    )
    add(
        "evaluate-temps-absurd",
        "evaluate with a temperature of 1e9 in temperatures.json",
        res_with(lambda w: _absurd_temperature(w / "temps.json")),
        [
            "evaluate",
            "--model",
            "model",
            "--adapter",
            "run/adapter",
            "--data",
            "data/dev.jsonl",
            "--out",
            "ev",
            "-q",
            "-t",
            "temps.json",
        ],
        refuse("temperature"),
    )
    return P


def _absurd_temperature(path: Path) -> None:
    obj = json.loads(path.read_text())
    for info in obj["types"].values():
        info["temperature"] = 1e9
    path.write_text(json.dumps(obj))
