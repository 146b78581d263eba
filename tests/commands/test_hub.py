"""A hub round trip without the network: `mydecide push` against a stand-in for ``HfApi`` (its calls checked), then
what it uploaded placed in a Hugging Face cache of the hub's own layout and pulled back by hub id, offline
(`--model acme/tiny-base --adapter acme/tiny-decider`, HF_HUB_OFFLINE=1), answering as the local directories do."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from mydecide.cli import app

REPO = "acme/tiny-decider"
BASE = "acme/tiny-base"
REQUEST = {
    "state": "The invoice was charged twice.",
    "questions": {
        "refund": {"type": "noul", "instructions": "Does the customer want money back?"},
        "team": {"type": "choice", "instructions": "Which team?", "criteria": ["billing", "support", "sales"]},
    },
}


@pytest.fixture(scope="module")
def run(tiny_llama_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run directory: RUN/adapter (a LoRA on the tiny Llama with random B weights, its render config and its base
    recorded as the hub id it is pulled by) and RUN/temperatures.json."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from mydecide.adapters import weights_fingerprint
    from mydecide.calibration.temperatures import TEMPERATURES_FORMAT
    from mydecide.modeling import save_render_config
    from mydecide.prompt import RenderConfig
    from mydecide.training.model_card import model_card, record_base_model

    root = tmp_path_factory.mktemp("hub-run")
    torch.manual_seed(0)
    lm = AutoModelForCausalLM.from_pretrained(tiny_llama_dir)
    fingerprint = weights_fingerprint(lm)
    lora = get_peft_model(lm, LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():
        for name, parameter in lora.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0.0, 0.5)
    adapter = root / "adapter"
    lora.save_pretrained(adapter)
    save_render_config(adapter, RenderConfig(option_form="letters"))
    record_base_model(adapter, BASE, fingerprint)
    (adapter / "README.md").write_text(str(model_card(BASE, "# Decision-model adapter (best on dev)\n\nTrained.\n")))
    temperatures = {"format": TEMPERATURES_FORMAT, "types": {"noul": 0.5, "choice": 2.0}}
    (root / "temperatures.json").write_text(json.dumps(temperatures))
    return root


class FakeHub:
    """``HfApi`` as push calls it: what it was asked, and the bytes each uploaded file held."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.uploaded: dict[str, bytes] = {}

    def create_repo(self, repo_id: str, **kwargs: Any) -> str:
        self.calls.append(("create_repo", (repo_id, kwargs)))
        return f"https://hub.invalid/{repo_id}"

    def create_commit(self, repo_id: str, operations: list[Any], **kwargs: Any) -> Any:
        self.calls.append(("create_commit", (repo_id, kwargs)))
        for op in operations:
            source = op.path_or_fileobj
            self.uploaded[op.path_in_repo] = source if isinstance(source, bytes) else Path(source).read_bytes()
        return type("CommitInfo", (), {"commit_url": f"https://hub.invalid/{repo_id}/commit/1"})()


def fill_cache(cache: Path, repo: str, files: dict[str, bytes]) -> Path:
    """``files`` as the hub cache holds a downloaded snapshot: blobs by hash, a snapshot of links, refs/main."""
    root = cache / f"models--{repo.replace('/', '--')}"
    commit = hashlib.sha1(repo.encode()).hexdigest()
    for name, data in files.items():
        blob = root / "blobs" / hashlib.sha256(data).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        link = root / "snapshots" / commit / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    (root / "refs").mkdir(parents=True, exist_ok=True)
    (root / "refs" / "main").write_text(commit)
    return root / "snapshots" / commit


@pytest.fixture(scope="module")
def pushed(run: Path) -> FakeHub:
    from mydecide.commands.push import push

    hub = FakeHub()
    assert push(run, REPO, api=hub) == f"https://hub.invalid/{REPO}/commit/1"
    return hub


def test_push_uploads_the_adapter_its_render_config_temperatures_and_a_card_in_one_commit(
    run: Path, pushed: FakeHub
) -> None:
    from huggingface_hub import ModelCard

    assert pushed.calls == [
        ("create_repo", (REPO, {"repo_type": "model", "private": False, "exist_ok": True})),
        ("create_commit", (REPO, {"commit_message": f"mydecide push: adapter on {BASE}", "repo_type": "model"})),
    ]
    adapter = run / "adapter"
    expected = ["adapter_config.json", "adapter_model.safetensors", "mydecide_render.json", "mydecide_base.json"]
    assert sorted(pushed.uploaded) == sorted([*expected, "temperatures.json", "README.md"])
    for name in expected:
        assert pushed.uploaded[name] == (adapter / name).read_bytes(), name
    assert pushed.uploaded["temperatures.json"] == (run / "temperatures.json").read_bytes()
    card = ModelCard(pushed.uploaded["README.md"].decode())
    assert card.data.to_dict() == {
        "base_model": BASE,
        "library_name": "peft",
        "tags": ["mydecide", "lora", "decision-model"],
    }
    assert card.text.lstrip().startswith("# Decision-model adapter (best on dev)\n\n## From the hub\n")
    serve = f"mydecide serve --model {BASE} --adapter {REPO} --temperatures $(hf download {REPO} temperatures.json)"
    assert serve in card.text and card.text.rstrip().endswith("Trained.")


def test_push_refuses_an_adapter_without_its_render_config_before_any_upload(
    run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import shutil

    adapter = tmp_path / "adapter"
    shutil.copytree(run / "adapter", adapter)
    (adapter / "mydecide_render.json").unlink()
    hub = FakeHub()
    monkeypatch.setattr("huggingface_hub.HfApi", lambda: hub)
    result = CliRunner().invoke(app, ["push", str(tmp_path), "--repo", REPO])
    assert result.exit_code == 2 and hub.calls == []
    assert result.output.strip().splitlines()[-1] == (
        f"error: {adapter}: no mydecide_render.json; an adapter is pushed with the render config it was trained with"
    )


def test_pull_by_hub_id_offline_answers_like_the_local_directories(
    run: Path, pushed: FakeHub, tiny_llama_dir: Path, tmp_path: Path
) -> None:
    cache = tmp_path / "hub"
    fill_cache(cache, BASE, {p.name: p.read_bytes() for p in tiny_llama_dir.iterdir() if p.is_file()})
    snapshot = fill_cache(cache, REPO, pushed.uploaded)
    (tmp_path / "request.json").write_text(json.dumps(REQUEST))
    env = {**os.environ, "HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    predict = [sys.executable, "-m", "mydecide.cli", "predict", str(tmp_path / "request.json"), "--device", "cpu"]
    by_hub = subprocess.run(
        [*predict, "--model", BASE, "--adapter", REPO, "--temperatures", str(snapshot / "temperatures.json")],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert by_hub.returncode == 0, by_hub.stderr
    local = CliRunner().invoke(
        app,
        [
            "predict",
            str(tmp_path / "request.json"),
            "--device",
            "cpu",
            "--model",
            str(tiny_llama_dir),
            "--adapter",
            str(run / "adapter"),
            "--temperatures",
            str(run / "temperatures.json"),
        ],
    )
    assert local.exit_code == 0, local.output
    hub_answers, local_answers = json.loads(by_hub.stdout)["answers"], json.loads(local.stdout)["answers"]
    assert hub_answers["refund"]["noul"] == pytest.approx(local_answers["refund"]["noul"], abs=1e-6)
    assert list(hub_answers["team"]["probabilities"].values()) == pytest.approx(
        list(local_answers["team"]["probabilities"].values()), abs=1e-6
    )
    plain = subprocess.run(  # and the adapter moved the answers: it was applied, not dropped
        [*predict, "--model", BASE], capture_output=True, text=True, env=env, timeout=300
    )
    assert plain.returncode == 0, plain.stderr
    assert json.loads(plain.stdout)["answers"]["refund"]["noul"] != pytest.approx(
        hub_answers["refund"]["noul"], abs=1e-4
    )


def test_an_adapter_hub_id_missing_from_the_cache_offline_is_one_line(tmp_path: Path) -> None:
    env = {**os.environ, "HF_HUB_CACHE": str(tmp_path / "empty"), "HF_HUB_OFFLINE": "1"}
    probe = "from mydecide.hub import local_adapter; local_adapter('acme/absent')"
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == (
        f"FileNotFoundError: acme/absent: no such adapter directory, and not in the local Hugging Face cache "
        f"({tmp_path / 'empty'}) with the hub unreachable or off (HF_HUB_OFFLINE)"
    )
