"""FSDP under `accelerate launch` on two CPU processes: what Accelerate 1.15 does, pinned so that a release that
changes it fails here (docs/guide.md, "Distributed training").

- `--config_file recipes/accelerate/fsdp.yaml` (distributed_type: FSDP): Accelerate does not shard on CPU. The
  training loop asks for a CPU accelerator, so the run is MULTI_CPU, the model wrapped in DDP: the same losses as
  `--multi_gpu` (DDP over gloo) to 1e-6, a checkpoint holding the whole LoRA weights (no shards), the adapter whole.
- `--use_fsdp` without a config: refused at launch with ``RuntimeError: There are currently no available devices
  found, must be one of 'XPU', 'CUDA', 'MLU', 'NPU', 'MUSA', or 'HPU'.``
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO, SMOKE, TWO_CPU_PROCESSES, write_task

pytestmark = pytest.mark.slow  # three two-process launches on the tiny model: about 2 minutes on two cores

ARGS = ["optim.max_steps=3", "save_every=3", "eval_every=100"]
REFUSAL = (
    "RuntimeError: There are currently no available devices found, must be one of 'XPU', 'CUDA', 'MLU', 'NPU', "
    "'MUSA', or 'HPU'."
)


def launch(how: list[str], model: Path, data: Path, out: Path) -> subprocess.CompletedProcess[str]:
    cmd = [
        *how,
        "-m",
        "mydecide.cli",
        "train",
        str(SMOKE),
        "--model",
        str(model),
        "--data",
        str(data),
        "--out",
        str(out),
    ]
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}
    return subprocess.run([*cmd, *ARGS], capture_output=True, text=True, timeout=400, env=env)


def losses(run: Path) -> list[float]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in rows if r["kind"] == "train"]


def test_the_fsdp_config_runs_ddp_on_cpu_with_ddp_losses_and_whole_weights(
    tiny_llama_dir: Path, tmp_path: Path
) -> None:
    from safetensors.torch import load_file

    data = write_task(tmp_path / "data", 32, 8)
    with_fsdp_config = [*TWO_CPU_PROCESSES]
    with_fsdp_config[with_fsdp_config.index("--multi_gpu")] = "--config_file=" + str(
        REPO / "recipes" / "accelerate" / "fsdp.yaml"
    )
    fsdp = launch(with_fsdp_config, tiny_llama_dir, data, tmp_path / "fsdp")
    assert fsdp.returncode == 0, fsdp.stderr[-3000:]
    assert "× 2 process(es)" in fsdp.stderr
    ddp = launch(TWO_CPU_PROCESSES, tiny_llama_dir, data, tmp_path / "ddp")
    assert ddp.returncode == 0, ddp.stderr[-3000:]
    assert losses(tmp_path / "fsdp") == pytest.approx(losses(tmp_path / "ddp"), rel=1e-6, abs=1e-7)
    assert len(losses(tmp_path / "fsdp")) == 3
    checkpoint = tmp_path / "fsdp" / "checkpoints" / "update-000003"
    weights = load_file(checkpoint / "model.safetensors")  # the whole LoRA weights, not FSDP shards
    adapter = load_file(tmp_path / "fsdp" / "last" / "adapter_model.safetensors")
    assert len(weights) >= len(adapter) > 0 and not list(checkpoint.glob("pytorch_model_fsdp*"))


def test_use_fsdp_without_a_gpu_is_refused_at_launch(tiny_llama_dir: Path, tmp_path: Path) -> None:
    accelerate = str(Path(sys.executable).parent / "accelerate")
    how = [accelerate, "launch", "--use_fsdp", "--num_processes", "2", "--num_machines", "1"]
    how += ["--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", "0"]
    result = launch(how, tiny_llama_dir, write_task(tmp_path / "data", 8, 4), tmp_path / "run")
    assert result.returncode != 0
    assert REFUSAL in result.stderr
