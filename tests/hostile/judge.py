"""The judges: class each case by what actually happened (a command's run, a group of runs, an HTTP answer), and
the checks that a command's outputs are whole. The classes are listed in probe.py's docstring."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from harness import Case, Expect, Run
from wire import Resp, Server


def nonempty_lines(text: str) -> list[str]:
    return [line.strip() for line in text.replace("\r", "\n").splitlines() if line.strip()]


def is_warning(line: str) -> bool:
    return line.startswith("[mydecide] warning:")


def warning_lines(run: Run) -> list[str]:
    return [line for line in nonempty_lines(run.output) if "warning" in line.lower()]


def tracebacky(run: Run, allowed_codes: Iterable[int] = (0, 2, 130)) -> bool:
    return "Traceback" in run.output or (run.code is not None and run.code not in tuple(allowed_codes))


def refusal_problem(run: Run) -> str | None:
    """None when the output is one `error:` line (warnings allowed, nothing after it); else why it is not."""
    lines = nonempty_lines(run.output)
    errors = [i for i, line in enumerate(lines) if line.startswith("error:")]
    if not errors:
        return "no 'error:' line"
    if len(errors) > 1:
        return f"{len(errors)} 'error:' lines"
    after = [line for line in lines[errors[0] + 1 :] if not is_warning(line)]
    if after:
        return f"{len(after)} line(s) after the error line"
    if len(lines[errors[0]]) > 1000:
        return f"an error line of {len(lines[errors[0]])} characters"
    return None


def error_line(run: Run) -> str:
    return next((line for line in nonempty_lines(run.output) if line.startswith("error:")), "")


def judge_cli(case: Case, run: Run, expect: Expect, where: Path, changed: list[str]) -> None:
    """Class one command's run (see the module docstring)."""
    flags: list[str] = []
    case.code = run.code
    case.seconds = round(run.seconds, 2)
    case.output = run.output[:300]
    case.output_tail = run.output[-300:] if len(run.output) > 300 else ""
    if run.timed_out:
        flags.append("hang")
    if changed:
        flags.append("data-lost")
        case.notes.append("changed or deleted: " + ", ".join(changed[:8]))
    if tracebacky(run):
        flags.append("traceback")
    if run.code == 2:
        problem = refusal_problem(run)
        if problem:
            flags.append("multi-line")
            case.notes.append(problem)
        elif not expect.refuse:
            flags.append("refused-valid")
        else:
            line = error_line(run).lower()
            missing = [n for n in expect.names if n.lower() not in line]
            if missing:
                flags.append("vague")
                case.notes.append(f"the error line does not name {missing}")
    elif run.code == 0:
        problem = expect.accept(where, run) if expect.accept else "exit 0 on input that should be refused"
        if problem:
            flags.append("silent" if expect.bad_input else "broken-output")
            case.notes.append(problem)
    case.finish(flags, "handled" if run.code == 2 else "accepted-ok")


def judge_runs(
    case: Case,
    runs: list[tuple[str, Run]],
    changed: list[str],
    problems: list[str],
    *,
    good: str,
    extra_flags: Iterable[str] = (),
) -> None:
    """Class a group of subprocess runs (interrupts, concurrency): each run's traceback / hang / one-line rule, the
    user files, and ``problems`` (outputs not whole: 'broken-output'; anything else already in flags)."""
    flags: list[str] = list(extra_flags)
    for label, run in runs:
        killed_by_us = label == "interrupted" and run.code is not None and run.code < 0
        if run.timed_out:
            flags.append("hang")
            case.notes.append(f"{label}: did not end in time")
        if "Traceback" in run.output or (run.code is not None and not killed_by_us and run.code not in (0, 2, 130)):
            flags.append("traceback")
            case.notes.append(f"{label}: exit {run.code}" + (", Traceback" if "Traceback" in run.output else ""))
        if run.code == 2:
            problem = refusal_problem(run)
            if problem:
                flags.append("multi-line")
                case.notes.append(f"{label}: {problem}")
    if changed:
        flags.append("data-lost")
        case.notes.append("changed or deleted: " + ", ".join(changed[:8]))
    for problem in problems:
        flags.append("broken-output")
        case.notes.append(problem)
    case.code = runs[-1][1].code if runs else None
    case.seconds = round(sum(run.seconds for _, run in runs), 2)
    case.output = " | ".join(f"{label}: exit {run.code}: {run.output.strip()[-160:]}" for label, run in runs)[:300]
    case.finish(flags, good)


def judge_http(
    case: Case,
    resp: Resp,
    *,
    refuse_ok: bool,
    accept: Callable[[dict], str | None] | None,
    server: Server,
    log_from: int,
    closed_ok: bool = False,
) -> None:
    flags: list[str] = []
    case.code = resp.status
    case.size = len(resp.body)
    case.seconds = round(resp.seconds, 3)
    case.output = resp.body[:300].decode("utf-8", "replace") if resp.status is not None else resp.error
    log = server.log_since(log_from)
    if "Traceback" in log:
        flags.append("traceback")
        case.notes.append("Traceback in the server log: " + log[log.find("Traceback") :][:200].replace("\n", " | "))
    if server.popen.poll() is not None:
        flags.append("5xx")
        case.notes.append(f"the server exited ({server.popen.returncode})")
    if resp.error == "timeout":
        flags.append("hang")
    elif resp.status is None:
        if not closed_ok:
            flags.append("5xx")
            case.notes.append(f"the connection closed without an answer ({resp.error})")
    elif resp.status >= 500:
        flags.append("5xx")
    elif 400 <= resp.status < 500:
        try:
            error = json.loads(resp.body)["error"]
            assert isinstance(error, str) and error
        except Exception:
            error = None
            case.notes.append('the error body is not {"error": "..."}')
        if len(resp.body) > 2048:
            flags.append("multi-line")
            case.notes.append(f"an error body of {len(resp.body)} bytes")
        elif not refuse_ok:
            flags.append("refused-valid")
        elif error is None and resp.status not in (404, 405):
            flags.append("vague")
    elif 200 <= resp.status < 300:
        if accept is None:
            flags.append("silent")
        else:
            try:
                problem = accept(json.loads(resp.body)) if resp.body else None
            except ValueError:
                problem = "the answer is not JSON"
            if problem:
                flags.append("silent" if refuse_ok else "broken-output")
                case.notes.append(problem)
    good = "handled" if resp.status is None or (resp.status and resp.status >= 400) else "accepted-ok"
    case.finish(flags, good)


# ------------------------------------------------------------------------------------------------ output checks


def read_jsonl(path: Path) -> list[Any]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def prepare_whole(out: Path) -> str | None:
    """None when out/manifest.json exists and every output it lists has its sha256."""
    manifest = out / "manifest.json"
    if not manifest.is_file():
        return f"{out.name}/manifest.json missing"
    try:
        outputs = json.loads(manifest.read_text())["outputs"]
    except (ValueError, KeyError) as err:
        return f"manifest.json unreadable: {err}"
    for name, info in outputs.items():
        path = out / name
        if not path.is_file():
            return f"{name} listed in the manifest is missing"
        if hashlib.sha256(path.read_bytes()).hexdigest() != info.get("sha256"):
            return f"{name} does not match its sha256 in manifest.json"
    return None


def conservation(out: Path) -> dict[str, int]:
    return json.loads((out / "manifest.json").read_text())["conservation"]


def kept_all(n: int, out: str = "out") -> Callable[[Path, Run], str | None]:
    def check(where: Path, run: Run) -> str | None:
        problem = prepare_whole(where / out)
        if problem:
            return problem
        c = conservation(where / out)
        if c["kept"] != n or c["rejected"] or c["removed"]:
            return f"expected all {n} rows kept, got kept {c['kept']} rejected {c['rejected']} removed {c['removed']}"
        return None

    return check


def rejected_line(line: int, *words: str, file: str = "rows.jsonl") -> Callable[[Path, Run], str | None]:
    """The row at ``file:line`` is in rejects.jsonl (its reason containing ``words``) and the outputs are whole."""

    def check(where: Path, run: Run) -> str | None:
        out = where / "out"
        problem = prepare_whole(out)
        if problem:
            return problem
        rejects = read_jsonl(out / "rejects.jsonl")
        hits = [r for r in rejects if str(r.get("where", "")).endswith(f"{file}:{line}")]
        if not hits:
            return f"{file}:{line} is not in rejects.jsonl (rejected: {conservation(out)['rejected']})"
        reason = " ".join(str(r.get("reason", "")) for r in hits).lower()
        missing = [w for w in words if w.lower() not in reason]
        if missing:
            return f"rejected, but the reason does not say {missing}: {reason[:120]}"
        return None

    return check


def warned(*words: str) -> Callable[[Path, Run], str | None]:
    def check(where: Path, run: Run) -> str | None:
        for line in warning_lines(run):
            if all(w.lower() in line.lower() for w in words):
                return None
        return f"no warning line saying {list(words)}"

    return check


def any_of(*checks: Callable[[Path, Run], str | None]) -> Callable[[Path, Run], str | None]:
    def check(where: Path, run: Run) -> str | None:
        problems = [c(where, run) for c in checks]
        return None if any(p is None for p in problems) else "; ".join(p for p in problems if p)

    return check


def file_ok(rel: str, test: Callable[[Path], bool] | None = None) -> Callable[[Path, Run], str | None]:
    def check(where: Path, run: Run) -> str | None:
        path = where / rel
        if not path.exists():
            return f"{rel} was not written"
        try:
            if test is not None and not test(path):
                return f"{rel} is not whole"
        except Exception as err:
            return f"{rel} unreadable: {type(err).__name__}: {err}"
        return None

    return check


def temperatures_whole(path: Path) -> bool:
    return "types" in json.loads(path.read_text())


def evaluate_whole(out: Path, records: int | None = None) -> str | None:
    try:
        report = json.loads((out / "report.json").read_text())
        predictions = read_jsonl(out / "predictions.jsonl")
    except (OSError, ValueError) as err:
        return f"evaluate output not whole: {type(err).__name__}: {err}"
    if not isinstance(report, dict):
        return "report.json is not an object"
    if records is not None and len(predictions) != records:
        return f"predictions.jsonl has {len(predictions)} lines, expected {records}"
    return None


def adapter_whole(adapter: Path) -> str | None:
    try:
        from safetensors.torch import load_file

        json.loads((adapter / "adapter_config.json").read_text())
        weights = load_file(str(adapter / "adapter_model.safetensors"))
        if not weights:
            return f"{adapter.name}: no weights"
    except Exception as err:
        return f"{adapter.name} does not load: {type(err).__name__}: {err}"
    return None


def train_whole(run_dir: Path) -> str | None:
    for sub in ("adapter", "last"):
        problem = adapter_whole(run_dir / sub)
        if problem:
            return problem
    try:
        rows = read_jsonl(run_dir / "metrics.jsonl")
        json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError) as err:
        return f"metrics.jsonl / summary.json not whole: {type(err).__name__}: {err}"
    keys = [(r.get("kind"), r.get("update")) for r in rows if r.get("kind") in ("train", "dev")]
    duplicated = sorted({k for k in keys if keys.count(k) > 1}, key=str)
    if duplicated:
        return f"metrics.jsonl repeats update numbers {duplicated[:6]}"
    return None


def merged_whole(out: Path) -> str | None:
    if not (out / "config.json").is_file() or not list(out.glob("*.safetensors")):
        return f"{out.name}: no config.json / weights"
    return None
