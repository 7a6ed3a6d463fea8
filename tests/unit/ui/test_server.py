"""The ui's HTTP side without a browser: access rules, the runs browser's paths, and the Plan API against
`tunelab plan --json` for the same inputs."""

import json
import os
import shlex
import socket

import pytest
from starlette.testclient import TestClient

from tunelab.access import access_token, check_port, host_name, is_loopback
from tunelab.cli import main
from tunelab.errors import TunelabError
from tunelab.ui.server import build_app


def _client(tmp_path, token=None, host="127.0.0.1:7860"):
    runs = tmp_path / "runs"
    runs.mkdir(exist_ok=True)
    return TestClient(build_app(runs, tmp_path / "configs", token), base_url=f"http://{host}")


def test_token_required_on_every_request(tmp_path):
    c = _client(tmp_path, token="s3cret", host="192.168.1.20:7860")
    for path in ("/", "/api/runs", "/api/choices", "/static/app.js", "/api/file?path=x"):
        assert c.get(path).status_code == 403, path
        assert c.get(path, headers={"X-Tunelab-Token": "wrong"}).status_code == 403, path
    assert c.post("/api/plan", json={}).status_code == 403
    assert c.get("/api/runs", headers={"X-Tunelab-Token": "s3cret"}).status_code == 200
    opened = c.get("/?token=s3cret")  # the printed URL: the page, and a cookie its own requests then carry
    assert opened.status_code == 200 and "tunelab" in opened.text
    assert c.get("/api/runs").status_code == 200


def test_loopback_without_token_checks_host_and_json(tmp_path):
    assert _client(tmp_path).get("/api/runs").status_code == 200
    assert _client(tmp_path, host="localhost:7860").get("/api/runs").status_code == 200
    # A page on another origin that rebinds its name to 127.0.0.1 still sends its own Host.
    assert _client(tmp_path, host="attacker.example:7860").get("/api/runs").status_code == 403
    # A cross-site form cannot send JSON: a POST of anything else is refused.
    assert (
        _client(tmp_path).post("/api/start", content="config=x", headers={"content-type": "text/plain"}).status_code
        == 403
    )
    assert host_name("[::1]:7860") == "[::1]" and host_name("127.0.0.1:1") == "127.0.0.1"


def test_access_token_for_hosts():
    assert is_loopback("127.0.0.1") and is_loopback("localhost") and is_loopback("::1")
    assert not is_loopback("0.0.0.0") and not is_loopback("example.org")
    assert access_token("127.0.0.1", None) is None
    generated = access_token("0.0.0.0", None)
    assert generated and len(generated) >= 24 and generated != access_token("0.0.0.0", None)
    assert access_token("0.0.0.0", "mine") == "mine"
    with pytest.raises(TunelabError):
        access_token("0.0.0.0", " ")


def test_a_taken_port_or_unknown_host_is_one_line():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(TunelabError, match="cannot listen there"):
            check_port("127.0.0.1", taken.getsockname()[1])
    with pytest.raises(TunelabError, match="unknown host"):
        check_port("no-such-host.invalid", 7860)


def test_runs_browser_serves_only_files_under_runs(tmp_path):
    c = _client(tmp_path)
    runs = tmp_path / "runs"
    (runs / "r").mkdir()
    (runs / "r" / "config.yaml").write_text("model: embedded\n")
    (tmp_path / "outside.txt").write_text("private")
    os.symlink(tmp_path / "outside.txt", runs / "r" / "leak.txt")
    assert c.get("/api/file", params={"path": "r/config.yaml"}).text == "model: embedded\n"
    for bad in ("../outside.txt", "r/../../outside.txt", "r/leak.txt", "/etc/passwd", "r/%2e%2e/%2e%2e/outside.txt"):
        r = c.get("/api/file", params={"path": bad})
        assert r.status_code == 400 and "private" not in r.text, bad
    assert c.get("/api/run", params={"name": "../"}).status_code == 400


def test_plan_api_equals_cli_json(tmp_path, capsys):
    form = {
        "model": "meta-llama/Llama-3.2-1B",
        "method": "qlora",
        "objective": "sft",
        "seq_len": "1024",
        "micro_batch": "2",
        "packing": True,
        "grad_ckpt": True,
        "examples": "5000",
        "mean_tokens": "300",
        "gpu": ["rtx-4090", "h100-sxm"],
        "price_per_hour": "1.5",
    }
    out = _client(tmp_path).post("/api/plan", json=form).json()
    argv = shlex.split(out["command"])[1:]
    assert argv[:2] == ["plan", "model=meta-llama/Llama-3.2-1B"] and "--price-per-hour" in argv
    assert main(argv) == 0
    cli = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert out["records"] == cli and [r["gpu"] for r in cli] == ["rtx-4090", "h100-sxm"]


def test_bad_input_is_one_line(tmp_path):
    c = _client(tmp_path)
    r = c.post("/api/plan", json={"model": "meta-llama/Llama-3.2-1B", "seq_len": "many", "examples": "10"})
    assert r.status_code == 400 and "seq_len" in r.json()["error"]
    r = c.post("/api/plan", json={"model": "meta-llama/Llama-3.2-1B", "gpu": ["no-such-gpu"], "examples": "10"})
    assert r.status_code == 400 and "no-such-gpu" in r.json()["error"]
    r = c.post("/api/start", json={"config": "../x.yaml"})
    assert r.status_code == 400 and "not one of the configs" in r.json()["error"]
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "tiny.yaml").write_text("model: embedded\n")
    r = c.post("/api/start", json={"config": "tiny.yaml", "overrides": [f"output_dir={tmp_path / 'elsewhere'}"]})
    assert r.status_code == 400 and "not under" in r.json()["error"]
    r = c.post("/api/start", json={"config": "tiny.yaml", "overrides": ["lora.rr=3"]})
    assert r.status_code == 400 and "lora.rr" in r.json()["error"]
    assert c.post("/api/generate", json={"run": "../x", "prompt": "hi"}).status_code == 400


def test_a_started_run_stops_on_sigint_even_where_the_server_ignores_it():
    """A server started with SIGINT ignored (a background job of a script, a test runner's worker) passes that on
    to its children across exec; the page's Stop must still end a run as Ctrl-C does."""
    import signal
    import subprocess
    import sys

    from tunelab.ui.jobs import CHILD

    waiting = CHILD.replace("from tunelab.cli import main; sys.exit(main())", "import time; time.sleep(30)")
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        child = subprocess.Popen([sys.executable, "-c", waiting], stderr=subprocess.DEVNULL)
    finally:
        signal.signal(signal.SIGINT, before)
    import time

    time.sleep(1.0)
    child.send_signal(signal.SIGINT)
    assert child.wait(timeout=20) != 0  # KeyboardInterrupt, not the 30 s sleep's clean exit
    assert "from tunelab.cli import main; sys.exit(main())" in CHILD


def test_serve_refuses_a_taken_port_in_one_line_before_loading(capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        assert main(["serve", "--port", str(taken.getsockname()[1]), "--model", "no-such-model"]) == 2
    error = capsys.readouterr().err.strip()
    assert "cannot listen there" in error and len(error.splitlines()) == 1  # before the (missing) model is looked up
