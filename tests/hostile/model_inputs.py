"""Category resume-adapters, part 3 (issue 64): training values no library can use, hostile model files (a pickled
payload, chat templates Jinja refuses), devices this machine lacks, a request file past the body limit, and a run
copied with hard links (``cp -al``) then resumed."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from assets import Env
from harness import SMOKE, Probe, Run
from judge import train_whole
from prepare_inputs import accept, refuse
from resume import res_setup, res_with, resume_probe


def model_input_probes(env: Env) -> list[Probe]:
    """Each a traceback, or accepted without a word, in issue 64's list."""
    T = ["train", SMOKE, "--model", "model", "--data", "data", "--out", "fresh", "optim.max_steps=2"]
    pred = ["predict", "request.json", "--model", "model"]
    P: list[Probe] = []

    def add(*a: Any, **kw: Any) -> None:
        P.append(resume_probe(env, *a, **kw))

    for cid, override, names in [
        ("train-epochs-inf", "optim.epochs=.inf", ("optim.epochs",)),  # was an OverflowError
        ("train-lr-inf", "optim.lr=.inf", ("optim.lr",)),  # trained to NaN
        ("train-max-state-tokens-0", "prompt.max_state_tokens=0", ("max_state_tokens",)),  # a useless adapter
        ("train-seed-negative", "seed=-1", ("seed",)),  # numpy's traceback
        ("train-seed-over-32-bits", "seed=4294967296", ("seed",)),
        ("train-targets-nosuch", "lora.target_modules=[q_proj, nosuch_proj]", ("nosuch_proj",)),  # peft's
    ]:
        add(cid, f"train with {override}", res_setup, [*T, override], refuse(*names), owned=("fresh",))
    add("predict-device-bogus", "predict --device bogus", res_setup, [*pred, "--device", "bogus"], refuse("bogus"))
    add(
        "predict-device-cuda",
        "predict --device cuda on a machine without one (CUDA_VISIBLE_DEVICES is empty)",
        res_setup,
        [*pred, "--device", "cuda"],
        refuse("cuda"),
    )
    for cid, template in [
        ("template-sandbox", "{{ ''.__class__.__mro__[1].__subclasses__() }}"),
        ("template-raises", "{{ raise_exception('System role not supported') }}"),
        ("template-unparsable", "{% if %}"),
    ]:
        add(
            f"predict-{cid}",
            f"the model's chat_template.jinja is {template!r}",
            res_with(lambda w, t=template: (w / "model" / "chat_template.jinja").write_text(t)),
            [*pred, "--device", "cpu"],
            refuse("model", "chat template"),
        )
    add(
        "predict-pickled-weights",
        "the model's weights are a pytorch_model.bin whose pickle would create a file when loaded",
        res_with(_pickled_weights),
        [*pred, "--device", "cpu"],
        accept(
            lambda w, r: "exit 0 on weights holding a pickle",
            "refused naming the model",
            refuse_ok=True,
            names=("model", "pickled"),
        ),
    )
    add(
        "predict-body-over-limit",
        "predict on a 2 MB request file (the server's body limit is 1 MB; it was read whole, whatever its size)",
        res_with(_big_request),
        [*pred, "--device", "cpu"],
        refuse("request.json", "max_body_bytes"),
    )
    resume = ["train", SMOKE, "--model", env.llama, "--data", env.data, "optim.max_steps=10", "--out", "snap"]
    add(
        "resume-hard-linked-copy",
        "cp -al run snap, then train --resume snap with 2 more updates: run/metrics.jsonl must stay as it was",
        res_with(_hard_linked_copy),
        [*resume, "--resume", "--allow-change", "optim.max_steps", "optim.max_steps=12"],
        accept(_snap_resumed, "snap resumed, whole; run's files (sharing their inodes) unchanged"),
        owned=("snap",),
    )
    return P


def _pickled_weights(where: Path) -> None:
    import torch

    class Payload:
        def __reduce__(self) -> tuple[Any, ...]:
            return (os.mkdir, (str(where / "ran"),))

    (where / "model" / "model.safetensors").unlink()
    torch.save({"model.embed_tokens.weight": Payload()}, where / "model" / "pytorch_model.bin")


def _big_request(where: Path) -> None:
    body = json.loads((where / "request.json").read_text())
    body["state"] = "x" * 2_000_000
    (where / "request.json").write_text(json.dumps(body))


def _hard_linked_copy(where: Path) -> None:
    shutil.copytree(where / "run", where / "snap", copy_function=os.link)


def _snap_resumed(where: Path, run: Run) -> str | None:
    problem = train_whole(where / "snap")
    if problem:
        return problem
    lines = (where / "snap" / "metrics.jsonl").read_text().splitlines()
    original = (where / "run" / "metrics.jsonl").read_text().splitlines()
    return None if len(lines) > len(original) else "snap/metrics.jsonl gained no line"
