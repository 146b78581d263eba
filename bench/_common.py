"""What every bench script shares: where the repository and the results are, and ``mydecide`` imported from this
checkout (the repository root goes first on ``sys.path``); and, for the benches that run the seed article's
reference scripts side by side with mydecide, where those scripts are and how they are made ready to run.

A script runs with bench/ as its own directory on ``sys.path``, so it starts with ``from _common import ROOT, ...``
before it imports ``mydecide``.

The seed scripts (``prepare_data.py``, ``decision_format.py``, ``train.py``, ``evaluate.py``, ``serve.py``) are not
part of mydecide and are never copied into this repository: :func:`find_seed_scripts` looks for them at run time in
``<repository root>/../shared/seed-scripts/`` (or a folder given with ``--seed-scripts``), and :func:`seed_copy`
copies them into a temporary folder outside the repository with the one change their README prescribes for a fair
CPU comparison: ``decision_format.load`` in fp32 instead of bfloat16.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
RESULTS = BENCH / "results"  # each bench writes RESULTS / "<name>.json"

sys.path.insert(0, str(ROOT))

SEED_SCRIPTS = ROOT.parent / "shared" / "seed-scripts"  # where the seed's reference scripts live, if anywhere
SEED_FILES = ("decision_format.py", "train.py", "serve.py", "evaluate.py", "prepare_data.py")
SEED_BF16 = "dtype=torch.bfloat16"  # decision_format.load's default: a GPU setting
SEED_FP32 = "dtype=torch.float32"  # the best setting on a CPU without bf16 kernels (the seed README's patch)


def find_seed_scripts(folder: Path | None = None, needed: tuple[str, ...] = SEED_FILES) -> tuple[Path | None, str]:
    """(the seed scripts' folder, "") or (None, why not): ``folder`` if given, else :data:`SEED_SCRIPTS`."""
    where = Path(folder).expanduser().resolve() if folder is not None else SEED_SCRIPTS
    if not where.is_dir():
        return None, f"the seed article's scripts are not at {where} (pass --seed-scripts DIR)"
    missing = [name for name in needed if not (where / name).is_file()]
    if missing:
        return None, f"{where} lacks {', '.join(missing)} of the seed article's scripts"
    return where, ""


def seed_copy(source: Path, dest: Path) -> Path:
    """Copy the seed scripts from ``source`` into ``dest`` (outside the repository) and load in fp32 there.

    The copy differs from the original in one place: ``dtype=torch.bfloat16`` → ``dtype=torch.float32`` in
    decision_format.py (it must occur exactly once, else the scripts are not the ones this bench knows: an error)."""
    dest = Path(dest).resolve()
    if dest == ROOT or ROOT in dest.parents:
        raise ValueError(f"{dest}: the seed scripts are never copied into the repository ({ROOT})")
    dest.mkdir(parents=True, exist_ok=True)
    for name in SEED_FILES:
        if (source / name).is_file():
            shutil.copyfile(source / name, dest / name)  # contents only: the originals are read-only
    text = (dest / "decision_format.py").read_text(encoding="utf-8")
    if text.count(SEED_BF16) != 1:
        raise ValueError(
            f"{source / 'decision_format.py'}: expected {SEED_BF16!r} exactly once (found {text.count(SEED_BF16)}); "
            "the fp32 patch of the seed README does not apply to these scripts"
        )
    (dest / "decision_format.py").write_text(text.replace(SEED_BF16, SEED_FP32), encoding="utf-8")
    return dest


def null_adapter(base: str, dest: Path, r: int = 8) -> Path:
    """An untrained LoRA adapter for ``base`` in ``dest`` (peft's default init: B = 0, so merged it changes no
    weight): what the seed's serve.py needs as ``ADAPTER`` to serve the base model itself."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    config = LoraConfig(r=r, lora_alpha=2 * r, target_modules="all-linear", task_type="CAUSAL_LM")
    peft_model = get_peft_model(model, config)
    assert all(float(p.detach().abs().max()) == 0.0 for n, p in peft_model.named_parameters() if "lora_B" in n)
    peft_model.save_pretrained(dest)
    return Path(dest)


def free_port() -> int:
    """A TCP port free on loopback now (for a server a bench starts)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_healthy(url: str, server: subprocess.Popen, timeout: float, name: str = "the server") -> None:
    """Until ``url`` answers 200, or raise RuntimeError: ``server`` exited, or ``timeout`` seconds passed."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"{name} exited with status {server.returncode} before it was healthy")
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(1.0)
    raise RuntimeError(f"{name} was not healthy at {url} within {timeout:.0f} s")
