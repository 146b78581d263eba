"""Two real CPU processes (`accelerate launch --multi_gpu --num_processes 2`, CUDA hidden: DDP over gloo): the
learning-rate schedule advances once per update, every process saves and reloads its own RNG state, and a run killed
after a checkpoint resumes to the uninterrupted run's losses and weights.

FSDP cannot be run here: with no GPU, Accelerate 1.x sets its distributed type to MULTI_CPU and wraps the model in
DDP whatever `--use_fsdp` says (the FSDP branch of AcceleratorState only applies to GPU-like types), so what this
file tests is DDP (README, "Distributed training: what is tested")."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import launch, train_rows, write_task

pytestmark = pytest.mark.slow  # three two-process runs: about 3 minutes on two cores

# runs mydecide's CLI with save_checkpoint wrapped so that every process dies right after the checkpoint of update 3
KILL_AFTER_CHECKPOINT_3 = """
import sys
from mydecide.training import checkpoints

real = checkpoints.save_checkpoint

def save_then_die(accelerator, run, update, *args):
    saved = real(accelerator, run, update, *args)
    if update == 3:
        raise SystemExit(3)
    return saved

checkpoints.save_checkpoint = save_then_die
from mydecide.cli import main

sys.argv = ["mydecide", *sys.argv[1:]]
main()
"""


def test_two_process_run_schedule_checkpoints_and_resume(tiny_llama_dir: Path, tmp_path: Path) -> None:
    import torch
    from safetensors.torch import load_file

    data = write_task(tmp_path / "data", 64, 8)
    straight = tmp_path / "straight"
    result = launch(tmp_path, tiny_llama_dir, data, straight)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "× 2 process(es)" in result.stderr
    rows = train_rows(straight)
    # one scheduler step per update, as on one process (Accelerate's default would step it twice per update)
    assert [rows[u]["lr"] for u in range(1, 7)] == pytest.approx([5e-3 * (1 - u / 6) for u in range(1, 7)])
    newest = straight / "checkpoints" / "update-000006"
    assert {"random_states_0.pkl", "random_states_1.pkl", "trainer_state.json"} <= {p.name for p in newest.iterdir()}

    killed = tmp_path / "killed"
    script = tmp_path / "kill_after_checkpoint_3.py"
    script.write_text(KILL_AFTER_CHECKPOINT_3, encoding="utf-8")
    result = launch(tmp_path, tiny_llama_dir, data, killed, script=script)
    assert result.returncode != 0
    assert [p.name for p in (killed / "checkpoints").iterdir()] == ["update-000003"]
    result = launch(tmp_path, tiny_llama_dir, data, killed, "--resume")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "resumed from update-000003 at update 3/6" in result.stderr
    got = train_rows(killed)
    for update in (4, 5, 6):
        assert got[update]["loss"] == pytest.approx(rows[update]["loss"], rel=1e-5, abs=1e-7), update
    a = load_file(straight / "last" / "adapter_model.safetensors")
    b = load_file(killed / "last" / "adapter_model.safetensors")
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=1e-5, atol=1e-6)
