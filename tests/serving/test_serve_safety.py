"""What the server shows and whom it trusts: temperatures checked at startup, no paths in /health, the Host
header, ambiguous Authorization headers."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from mydecide.calibration.temperatures import TEMPERATURE_RANGE, load_temperatures
from mydecide.cli import app

fastapi_testclient = pytest.importorskip("fastapi.testclient")
TestClient = fastapi_testclient.TestClient

URL = "/v1/systemone"
BODY = {"state": "The checkout fails.", "questions": {"q": {"type": "noul", "instructions": "Is it down?"}}}


@pytest.fixture(scope="module")
def model(tiny_llama_dir: Path):
    from mydecide.modeling import load_model

    return load_model(str(tiny_llama_dir), device="cpu")


# ------------------------------------------------------------------------------------------------ temperatures

BAD_TEMPERATURES = [
    ('{"types": {"choice": 5e-324}}', "types.choice: temperature 5e-324 is outside"),
    ('{"types": {"noul": {"temperature": 1e6}}}', "types.noul: temperature 1000000.0 is outside"),
    ('{"types": {"choise": {"temperature": 1.5}}}', "types.choise: unknown question type 'choise'"),
    ('{"types": {}, "buckets": {"chioce": {"3-4": 1.2}}}', "buckets.chioce: unknown question type 'chioce'"),
    ('{"types": {}, "buckets": {"choice": {"3-5": 1.2}}}', "buckets.choice.3-5: unknown option-count bucket '3-5'"),
]


@pytest.mark.parametrize(("content", "message"), BAD_TEMPERATURES, ids=[m for _, m in BAD_TEMPERATURES])
def test_a_temperature_out_of_range_or_a_misspelt_type_is_an_error_naming_it(
    tmp_path: Path, content: str, message: str
) -> None:
    path = tmp_path / "temperatures.json"
    path.write_text(content)
    with pytest.raises(ValueError, match=message) as err:
        load_temperatures(path)
    assert str(path) in str(err.value)


def test_the_range_is_the_one_calibrate_fits_in(tmp_path: Path) -> None:
    """Whatever `mydecide calibrate` can write (T at the edges of its search), serve accepts."""
    from mydecide.calibration.temperatures import LOG_T_BOUNDS

    low, high = TEMPERATURE_RANGE
    assert low == pytest.approx(math.exp(LOG_T_BOUNDS[0]), rel=1e-6) and high == pytest.approx(
        math.exp(LOG_T_BOUNDS[1]), rel=1e-6
    )
    path = tmp_path / "t.json"
    path.write_text(
        json.dumps(
            {
                "types": {"choice": math.exp(LOG_T_BOUNDS[0]), "noul": math.exp(LOG_T_BOUNDS[1])},
                "buckets": {"choice": {"27+": 2.0, "5-8": {"fallback": "too few"}}},
            }
        )
    )
    table = load_temperatures(path)
    assert table("choice", 3) == pytest.approx(low) and table("choice", 40) == 2.0


def test_serve_refuses_a_bad_temperatures_file_at_startup_in_one_line(tiny_llama_dir: Path, tmp_path: Path) -> None:
    path = tmp_path / "temperatures.json"
    path.write_text('{"types": {"choice": 5e-324}}')
    result = CliRunner().invoke(app, ["serve", "--model", str(tiny_llama_dir), "--temperatures", str(path)])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "types.choice: temperature 5e-324 is outside" in lines[0]


WARNING = "[mydecide] warning: --api-key shows the key to every local user (ps, /proc); set MYDECIDE_API_KEY instead"


@pytest.mark.parametrize("given", ["flag", "environment"])
def test_a_key_on_the_command_line_is_warned_about_and_the_environment_is_not(
    given: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MYDECIDE_API_KEY", raising=False)
    command = ["serve", "--model", str(tmp_path / "absent")]
    if given == "flag":
        result = CliRunner().invoke(app, [*command, "--api-key", "s3cret-key"])
    else:
        result = CliRunner().invoke(app, command, env={"MYDECIDE_API_KEY": "s3cret-key"})
    assert result.exit_code == 2 and "s3cret-key" not in result.output
    assert (WARNING in result.output.splitlines()) is (given == "flag")


@pytest.mark.parametrize("key", ["clé-secrète", "two words", "tab\there", ""])
def test_a_key_no_client_can_send_is_refused_at_startup_without_showing_it(
    key: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MYDECIDE_API_KEY", raising=False)
    command = ["serve", "--model", str(tmp_path / "absent")]
    if key:
        result = CliRunner().invoke(app, command, env={"MYDECIDE_API_KEY": key})
    else:  # an empty variable counts as unset; an empty --api-key would turn auth off without a word
        result = CliRunner().invoke(app, [*command, "--api-key", key])
    assert result.exit_code == 2
    expected = (
        "error: --api-key (or MYDECIDE_API_KEY) is empty: set a key, or pass --no-auth to serve without one"
        if not key
        else "error: --api-key (or MYDECIDE_API_KEY) holds a character that no client can send in an Authorization "
        "header: use printable ASCII without spaces"
    )
    assert result.output.strip().splitlines() == ([expected] if key else [WARNING, expected])


def test_serve_refuses_a_device_torch_lacks_before_it_starts(tmp_path: Path, tiny_llama_dir: Path) -> None:
    """The model loads in the server's startup, after 'serving on …' was printed: the device is checked first."""
    result = CliRunner().invoke(app, ["serve", "--model", str(tiny_llama_dir), "--device", "bogus"])
    assert result.exit_code == 2
    assert result.output.strip() == "error: device 'bogus': not a device torch knows (cpu, cuda, cuda:1, mps …)"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["batching.max_pending=0"], "batching.max_pending is 0: every request would be answered 503 (busy)"),
        (
            ["limits.min_choice_options=5", "limits.max_choice_options=4"],
            "limits.min_choice_options 5 is above limits.max_choice_options 4: every choice question would be refused",
        ),
        (
            ["limits.min_score_levels=3", "limits.max_score_levels=2"],
            "limits.min_score_levels 3 is above limits.max_score_levels 2: every score question would be refused",
        ),
    ],
)
def test_serve_refuses_settings_that_fail_every_request_before_loading(
    overrides: list[str], message: str, tmp_path: Path
) -> None:
    recipe = tmp_path / "serve.yaml"
    recipe.write_text("log_level: info\n")
    result = CliRunner().invoke(app, ["serve", str(recipe), *overrides, "--model", str(tmp_path / "absent")])
    assert result.exit_code == 2 and result.output.strip() == f"error: serve: {message}"


# ----------------------------------------------------------------------------------------------------- /health


def test_health_shows_no_filesystem_path(model, tiny_llama_dir: Path) -> None:
    from mydecide.serving.app import create_app

    with TestClient(create_app(model)) as c:  # no name given: the model's own name is its directory
        health = c.get("/health").json()
        answer = c.post(URL, json=BODY).json()
    assert health["status"] == "ok"
    assert str(tiny_llama_dir) not in json.dumps(health) and "/" not in health["model"]
    assert health["model"] == tiny_llama_dir.name
    assert answer["model"] == tiny_llama_dir.name


# ------------------------------------------------------------------------------------------------- Host header


def test_only_allowed_host_headers_are_answered(model) -> None:
    from mydecide.serving.app import create_app

    with TestClient(create_app(model, allowed_hosts=["localhost", "127.0.0.1", "::1"])) as c:
        for host in ("localhost", "localhost:8741", "127.0.0.1:8741", "[::1]:8741", "LOCALHOST"):
            assert c.post(URL, json=BODY, headers={"host": host}).status_code == 200, host
        for host in ("evil.example", "evil.example:8741", "localhost.evil.example", ""):
            r = c.post(URL, json=BODY, headers={"host": host})
            assert r.status_code == 400, host
            assert "Host header" in r.json()["error"] and "--allowed-hosts" in r.json()["error"]
            assert c.get("/health", headers={"host": host}).status_code == 400  # a rebound page reads nothing
    with TestClient(create_app(model, allowed_hosts=["*"])) as c:
        assert c.post(URL, json=BODY, headers={"host": "anything.example"}).status_code == 200


def test_serve_defaults_to_loopback_hosts_without_an_api_key() -> None:
    from mydecide.serving.server import default_allowed_hosts

    assert set(default_allowed_hosts("127.0.0.1", api_key=None)) == {"localhost", "127.0.0.1", "::1"}
    assert "192.168.1.5" in default_allowed_hosts("192.168.1.5", api_key=None)
    assert default_allowed_hosts("0.0.0.0", api_key=None) == ["localhost", "127.0.0.1", "::1"]
    assert default_allowed_hosts("0.0.0.0", api_key="k") == ["*"]


# ----------------------------------------------------------------------------------------------- Authorization


def test_duplicate_authorization_headers_are_refused(model) -> None:
    from mydecide.serving.app import create_app

    with TestClient(create_app(model, api_key="s3cret")) as c:
        good = ("authorization", "Bearer s3cret")
        assert c.post(URL, json=BODY, headers=[good]).status_code == 200
        for headers in (
            [good, ("authorization", "Bearer wrong")],
            [("authorization", "Bearer wrong"), good],
            [good, good],
        ):
            r = c.post(URL, json=BODY, headers=headers)
            assert r.status_code == 401 and "one Authorization header" in r.json()["error"], headers


# -------------------------------------------------------------------------------------------- odd HTTP requests


def test_a_client_that_leaves_mid_body_is_a_4xx_not_an_internal_error() -> None:
    import asyncio

    from starlette.requests import Request

    from mydecide.serving.app import ApiError, read_body

    messages = [{"type": "http.request", "body": b'{"state": ', "more_body": True}, {"type": "http.disconnect"}]

    async def receive() -> dict:
        return messages.pop(0)

    scope = {"type": "http", "method": "POST", "path": URL, "headers": [(b"content-length", b"100")]}
    with pytest.raises(ApiError) as err:
        asyncio.run(read_body(Request(scope, receive), 1000, 5.0))
    assert err.value.status == 400 and "closed the connection" in err.value.message


def test_a_compressed_body_is_refused_and_long_paths_are_not_echoed(model) -> None:
    from mydecide.serving.app import create_app

    with TestClient(create_app(model)) as c:
        r = c.post(URL, json=BODY, headers={"content-encoding": "gzip"})
        assert r.status_code == 415 and "Content-Encoding" in r.json()["error"]
        r = c.get("/" + "a" * 10_000)
        assert r.status_code == 404 and len(r.json()["error"]) < 300
        assert c.post(URL, json=BODY, headers={"content-encoding": "identity"}).status_code == 200


NOT_UTF8 = [
    ("UTF-16 with a byte order mark", json.dumps(BODY).encode("utf-16"), "UTF-16 or UTF-32 byte order mark"),
    ("UTF-16 without one", json.dumps(BODY).encode("utf-16-le"), "NUL bytes"),
    ("UTF-32", json.dumps(BODY).encode("utf-32"), "UTF-16 or UTF-32 byte order mark"),
    ("UTF-8 with a byte order mark", json.dumps(BODY).encode("utf-8-sig"), "UTF-8 byte order mark"),
    ("Latin-1", json.dumps({**BODY, "state": "Café"}, ensure_ascii=False).encode("latin-1"), "not UTF-8 text"),
    ("an encoded lone surrogate", b'{"state": "\xed\xa0\x80", "questions": {}}', "not UTF-8 text"),
]


@pytest.mark.parametrize(("case", "raw", "message"), NOT_UTF8, ids=[c[0] for c in NOT_UTF8])
def test_a_body_that_is_not_plain_utf8_is_a_400(model, case: str, raw: bytes, message: str) -> None:
    from mydecide.serving.app import create_app
    from mydecide.serving.request import RequestError, decode_body

    with pytest.raises(RequestError, match="invalid JSON"):  # predict reads request files the same way
        decode_body(raw)
    with TestClient(create_app(model, warm_up=False)) as c:
        r = c.post(URL, content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 400, (case, r.text)
    assert r.json()["error"].startswith("invalid JSON: ") and message in r.json()["error"], (case, r.json())


def test_a_charset_other_than_utf8_is_a_415(model) -> None:
    from mydecide.serving.app import create_app

    raw = json.dumps(BODY).encode()
    with TestClient(create_app(model, warm_up=False)) as c:
        for content_type in (
            "application/json; charset=utf-16",
            "application/json;charset=latin-1",
        ):
            r = c.post(URL, content=raw, headers={"content-type": content_type})
            assert r.status_code == 415, (content_type, r.text)
            assert "charset" in r.json()["error"] and "UTF-8" in r.json()["error"], r.json()
        for content_type in (
            "application/json",
            "application/json; charset=UTF-8",
            'application/json; charset="utf-8"',
        ):
            assert c.post(URL, content=raw, headers={"content-type": content_type}).status_code == 200, content_type
        # what a web page can send without asking (a form, text/plain) is not JSON to this server
        for media in ("text/plain", "application/x-www-form-urlencoded"):
            r = c.post(URL, content=raw, headers={"content-type": media})
            message = f"Content-Type {media!r} is not accepted: send the body as application/json"
            assert (r.status_code, r.json()) == (415, {"error": message})
        assert c.post(URL, content=raw).status_code == 200  # no Content-Type at all: read as UTF-8 JSON


def test_browser_origins_are_refused_unless_allowed(model) -> None:
    """Any web page could make its visitors' browsers spend the server's CPU; only allowed origins may (issue 64)."""
    from mydecide.serving.app import create_app

    page = {"origin": "https://evil.example"}
    with TestClient(create_app(model, warm_up=False)) as c:
        r = c.post(URL, json=BODY, headers=page)
        message = "requests from the web page origin 'https://evil.example' are not allowed (serve --allow-origin)"
        assert (r.status_code, r.json()) == (403, {"error": message})
        assert c.post("/v1/decisions", json={"input": "x", "questions": []}, headers=page).status_code == 403
        assert c.post(URL, json=BODY).status_code == 200  # no Origin: not a browser page
    with TestClient(create_app(model, warm_up=False, allowed_origins=["https://app.example"])) as c:
        assert c.post(URL, json=BODY, headers={"origin": "https://app.example"}).status_code == 200
        assert c.post(URL, json=BODY, headers=page).status_code == 403
