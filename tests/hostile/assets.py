"""The environment every case runs in: a temporary directory, and the shared assets built once (lazily) in it: a
tiny tokenizer, two tiny Llamas, prepared data, one trained and calibrated run."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import random
import shutil
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from harness import ROOT, SMOKE, cli
from wire import Server


def load_conftest() -> Any:
    spec = importlib.util.spec_from_file_location("mydecide_probe_conftest", ROOT / "tests" / "conftest.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


WORDS = [
    "alpha",
    "bravo",
    "charlie",
    "delta",
    "echo",
    "foxtrot",
    "golf",
    "hotel",
    "india",
    "juliet",
    "kilo",
    "lima",
    "mike",
    "november",
    "oscar",
    "papa",
    "quebec",
    "romeo",
    "sierra",
    "tango",
    "uniform",
    "victor",
    "whiskey",
    "xray",
    "yankee",
    "zulu",
    "amber",
    "basalt",
    "cobalt",
    "dune",
    "ember",
    "fjord",
    "granite",
]


def sentence(rng: random.Random, n: int = 9) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def record(i: int, rng: random.Random, kind: str | None = None) -> dict[str, Any]:
    """A valid record: a noul (task 'outage') or a choice (task 'route') with a distinct state."""
    kind = kind or ("noul" if i % 2 == 0 else "choice")
    state = f"Ticket {i}: {sentence(rng)} (ref {i * 7919 % 10007})"
    if kind == "noul":
        return {
            "id": f"r{i}",
            "task": "outage",
            "state": state,
            "question": {"type": "noul", "instructions": "Is a production system down?"},
            "answer": rng.random() < 0.5,
        }
    team = rng.choice(["billing", "engineering", "support"])
    return {
        "id": f"r{i}",
        "task": "route",
        "state": state,
        "question": {
            "type": "choice",
            "instructions": "Which team should handle this ticket?",
            "criteria": {"billing": "money", "engineering": "bugs", "support": "help"},
        },
        "answer": team,
    }


def jsonl_text(rows: Iterable[Any]) -> str:
    return "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows)


class Env:
    """The temporary directory, and the shared assets built once (lazily) inside it."""

    def __init__(self, root: Path):
        self.root = root
        self.assets = root / "assets"
        self.cases = root / "cases"
        self.tok = self.assets / "tokenizer"
        self.llama = self.assets / "llama"
        self.llama_b = self.assets / "llama_seed1"  # same shapes, another seed
        self.rows = self.assets / "rows.jsonl"
        self.data = self.assets / "data"
        self.run = self.assets / "run"
        self.adapter = self.run / "adapter"
        self.temps = self.assets / "temperatures.json"
        self.evaldata = self.assets / "evaldata"  # dev.jsonl / test.jsonl of 150-odd rows, another train split
        self.ev = self.assets / "ev"  # an earlier evaluate output
        self.big = self.assets / "big.jsonl"  # 15,000 rows: prepare runs a few seconds
        self.server: Server | None = None
        self.background: dict[str, threading.Thread] = {}
        self.background_results: dict[str, dict[str, Any]] = {}
        self._built: set[str] = set()
        self.setup_log: list[str] = []

    def case_dir(self, cid: str) -> Path:
        path = self.cases / cid
        if path.exists():
            unlock(path)
            shutil.rmtree(path)
        path.mkdir(parents=True)
        return path

    # the assets, each built once
    def need(self, *names: str) -> None:
        for name in names:
            if name not in self._built:
                getattr(self, f"_build_{name}")()
                self._built.add(name)

    def _log(self, line: str) -> None:
        self.setup_log.append(line)
        print(f"[setup] {line}", flush=True)

    def _build_models(self) -> None:
        started = time.monotonic()
        conf = load_conftest()
        self.assets.mkdir(parents=True, exist_ok=True)
        fast = conf.build_tokenizer(self.tok)
        for out, seed_shift in ((self.llama, 0), (self.llama_b, 1)):
            shutil.copytree(self.tok, out)
            import torch

            original = torch.manual_seed
            torch.manual_seed = lambda seed, _o=original, _s=seed_shift: _o(seed + _s)  # build_llama seeds with 0
            try:
                conf.build_llama(out, len(fast))
            finally:
                torch.manual_seed = original
        self._log(f"tiny tokenizer + 2 tiny llamas in {time.monotonic() - started:.1f}s")

    def _build_data(self) -> None:
        rng = random.Random(0)
        self.assets.mkdir(parents=True, exist_ok=True)
        self.rows.write_text(jsonl_text(record(i, rng) for i in range(90)))
        (self.assets / "data.yaml").write_text(
            f"sources:\n  - {{kind: jsonl, path: {self.rows}}}\nsplit: {{dev_fraction: 0.2, seed: 13}}\n"
        )
        run = cli(["prepare", self.assets / "data.yaml", "--out", self.data], self.assets)
        assert run.code == 0, run.output
        rng = random.Random(5)
        (self.assets / "evalrows.jsonl").write_text(jsonl_text(record(1000 + i, rng) for i in range(300)))
        (self.assets / "evaldata.yaml").write_text(
            f"sources:\n  - {{kind: jsonl, path: {self.assets / 'evalrows.jsonl'}}}\n"
            "split: {dev_fraction: 0.25, test_fraction: 0.25, seed: 13}\n"
        )
        run = cli(["prepare", self.assets / "evaldata.yaml", "--out", self.evaldata], self.assets)
        assert run.code == 0, run.output
        rng = random.Random(9)
        self.big.write_text(jsonl_text(record(5000 + i, rng) for i in range(15_000)))
        self._log(f"data: {run.output.strip().splitlines()[-1]}")

    def _build_run(self) -> None:
        self.need("models", "data")
        started = time.monotonic()
        run = cli(
            ["train", SMOKE, "--model", self.llama, "--data", self.data, "--out", self.run, "optim.max_steps=10"],
            self.assets,
            timeout=600,
        )
        assert run.code == 0, run.output[-3000:]
        self._log(f"trained {self.run} (10 updates) in {time.monotonic() - started:.1f}s")
        started = time.monotonic()
        run = cli(
            [
                "calibrate",
                "--model",
                self.llama,
                "--adapter",
                self.adapter,
                "--data",
                self.data / "dev.jsonl",
                "--out",
                self.temps,
                "-q",
            ],
            self.assets,
            timeout=600,
        )
        assert run.code == 0, run.output[-3000:]
        run = cli(
            [
                "evaluate",
                "--model",
                self.llama,
                "--adapter",
                self.adapter,
                "--data",
                self.data / "dev.jsonl",
                "--out",
                self.ev,
                "--no-base",
                "-q",
            ],
            self.assets,
            timeout=600,
        )
        assert run.code == 0, run.output[-3000:]
        self._log(f"calibrated + evaluated in {time.monotonic() - started:.1f}s")


def unlock(path: Path) -> None:
    """Give back every permission chmod took under path, so it can be deleted."""
    for dirpath, dirnames, filenames in os.walk(path, followlinks=False, onerror=lambda e: None):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            with contextlib.suppress(OSError):
                if not p.is_symlink():
                    os.chmod(p, 0o755 if p.is_dir() else 0o644)
    for p in [path, *path.rglob("*")] if path.exists() else []:
        with contextlib.suppress(OSError):
            if p.is_dir() and not p.is_symlink():
                os.chmod(p, 0o755)


def copy_tree(src: Path, dst: Path) -> None:
    shutil.copytree(src, dst, symlinks=True)
