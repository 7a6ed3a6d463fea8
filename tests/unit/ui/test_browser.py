"""`tunelab ui` in a real browser: headless Chromium (Debian's `chromium`, which `make install` installs) driven by
Playwright pointed at the system browser, never a downloaded one. The page's plan equals `tunelab plan --json`, a
run started from the page shows its new steps as they are logged and stops as Ctrl-C stops it, and the Try it box
gives `tunelab eval`'s greedy completion. Screenshots go to $TUNELAB_UI_SCREENSHOTS when set (docs/img/ for the
guide), else to the test's temporary folder."""

from __future__ import annotations

import json
import os
import shutil
import socket
import threading
import time
from pathlib import Path

import pytest
from conftest import make_addition_rows, tiny_train_config, write_jsonl

from tunelab.cli import main
from tunelab.train import checkpoint

pytestmark = pytest.mark.slow

CHROMIUM = os.environ.get("TUNELAB_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
# How soon a new metrics line must show on a running run's page (the bound).
FOLLOW_S = 10
VIEWPORT = {"width": 1280, "height": 900}


@pytest.fixture(scope="module")
def browser():
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install playwright)")
    if not Path(CHROMIUM).is_file():
        pytest.skip(
            f"no Chromium at {CHROMIUM}: apt-get install chromium (make install tries), or set TUNELAB_CHROMIUM"
        )
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        yield b
        b.close()


@pytest.fixture(scope="module")
def site(tmp_path_factory, tiny_model_dir):
    """The ui over a fresh runs folder, with one shipped config: a tiny run that logs every step."""
    pytest.importorskip("uvicorn", reason="the ui extra is not installed (pip install 'tunelab[ui]')")
    import uvicorn

    from tunelab.ui.server import build_app

    root = tmp_path_factory.mktemp("ui")
    runs, configs = root / "runs", root / "configs"
    runs.mkdir()
    configs.mkdir()
    data = write_jsonl(root / "train.jsonl", make_addition_rows())
    (configs / "tiny.yaml").write_text(
        f"model: {tiny_model_dir}\ndata:\n  path: {data}\n  template: compact\nseq_len: 64\nmicro_batch: 4\n"
        "max_steps: 100000\nlog_steps: 1\nsave_steps: 5\nprecision: fp32\ncompile: false\nlr: 1.0e-2\n"
    )
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(build_app(runs, configs), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    yield {"url": f"http://127.0.0.1:{port}/", "runs": runs, "root": root, "data": data}
    server.should_exit = True
    thread.join(timeout=60)


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport=VIEWPORT)
    yield context.new_page()
    context.close()


def _shot(page, name: str, tmp_path: Path) -> None:
    folder = Path(os.environ.get("TUNELAB_UI_SCREENSHOTS") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(folder / f"ui-{name}.png"), full_page=True)


def test_plan_form_equals_plan_json(site, page, capsys, tmp_path):
    page.goto(site["url"])
    page.fill("input[name=model]", "meta-llama/Llama-3.2-1B")
    page.select_option("#plan-method", "qlora")
    page.fill("input[name=seq_len]", "2048")
    page.fill("input[name=micro_batch]", "2")
    page.check("input[name=grad_ckpt]")
    page.fill("input[name=examples]", "20000")
    page.fill("input[name=mean_tokens]", "600")
    for gpu in ("rtx-4090", "a100-80gb", "h100-sxm"):
        page.check(f"input[name=gpu][value={gpu}]")
    page.click("#plan-submit")
    page.wait_for_selector(".gpu-table >> nth=2")

    argv = ["plan", "model=meta-llama/Llama-3.2-1B", "objective=sft", "--method", "qlora", "--seq-len", "2048"]
    argv += ["--micro-batch", "2", "--packing", "--grad-ckpt", "--examples", "20000", "--mean-tokens", "600"]
    assert main([*argv, "--gpu", "rtx-4090,a100-80gb,h100-sxm", "--json"]) == 0
    cli = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    shown = page.eval_on_selector_all(
        ".gpu-table",
        "tables => tables.map(t => [t.dataset.gpu, [...t.querySelectorAll('td[data-key]')]"
        ".map(td => [td.dataset.key, td.dataset.value])])",
    )
    assert [gpu for gpu, _ in shown] == [r["gpu"] for r in cli]
    for (_, cells), record in zip(shown, cli):
        assert {k for k, _ in cells} >= {"time_s", "peak_memory_bytes", "fits", "max_micro_batch", "step_s.matmul_s"}
        for key, value in cells:
            expected = record
            for part in key.split(".", 1):
                expected = expected[part]
            assert value == str(expected).lower() if isinstance(expected, bool) else float(value) == expected, key
    assert page.locator("#chart-time canvas").count() == 1 and page.locator("#chart-memory .membar").count() == 3
    _shot(page, "plan", tmp_path)


def _last_step(metrics: Path) -> int:
    lines = [json.loads(x) for x in metrics.read_text().splitlines() if x.strip()] if metrics.is_file() else []
    return max((r["step"] for r in lines if "loss" in r), default=0)


def test_started_run_is_followed_and_stopped(site, page, tmp_path):
    out = site["runs"] / "live"
    page.goto(site["url"])
    page.click("#tab-start")
    page.select_option("#start-config", "tiny.yaml")
    page.fill("#start-overrides", f"output_dir={out}")
    page.click("#start-submit")
    command = page.wait_for_selector(".job code").text_content()
    assert command.startswith("tunelab train --config ") and command.endswith(f"tiny.yaml output_dir={out}")

    deadline = time.time() + 120  # the child process imports torch first: slow under a loaded machine
    while _last_step(out / "metrics.jsonl") < 2:
        assert time.time() < deadline, "the run logged no step"
        time.sleep(0.2)
    page.click("#tab-runs")
    page.click("tr[data-run=live]")
    for _ in range(2):  # the page keeps following: a step logged now shows within FOLLOW_S
        logged = _last_step(out / "metrics.jsonl")
        page.wait_for_function(
            f"Number(document.querySelector('#run-step').dataset.step) >= {logged}", timeout=FOLLOW_S * 1000
        )
    assert page.text_content("#run-status") == "running"
    assert page.text_content("#run-eta") and page.locator("#chart-loss canvas").count() == 1
    _shot(page, "runs", tmp_path)

    while not checkpoint.list_checkpoints(out / "checkpoints"):
        assert time.time() < deadline, "no checkpoint written"
        time.sleep(0.2)
    page.click("#tab-start")
    page.click(".job button")
    page.wait_for_selector("text=exit status 130", timeout=150_000)  # a loaded machine: the step ends first
    kept = checkpoint.list_checkpoints(out / "checkpoints")
    assert kept and checkpoint.verify(kept[-1]) is None  # Ctrl-C left its checkpoints whole
    page.click("#tab-runs")
    page.click("tr[data-run=live]")
    page.wait_for_function("document.querySelector('#run-status').textContent === 'stopped'", timeout=5000)


def test_bench_database_as_table_and_chart(site, page):
    from tunelab.bench import store

    db = site["runs"] / "bench" / "bench.sqlite"
    for mb, rate, mfu in ((2, 1500.0, 0.21), (4, 2100.0, 0.29)):
        store.insert(db, {"kind": "tunelab", "label": f"micro_batch={mb}", "tokens_nonpad_per_s": rate, "mfu": mfu})
    page.goto(site["url"])
    page.click("#tab-runs")
    page.click("a[data-db='bench/bench.sqlite']")
    page.wait_for_selector("#bench-table tbody tr >> nth=1")
    cells = page.eval_on_selector_all("#bench-table tbody tr", "rows => rows.map(r => r.innerText)")
    assert "micro_batch=2" in cells[0] and "1,500" in cells[0] and "0.210" in cells[0] and "micro_batch=4" in cells[1]
    assert page.locator("#chart-bench canvas").count() == 1


def test_try_it_equals_eval(site, page, tmp_path, capsys, tiny_model_dir):
    from tunelab.recipes.finetune import finetune

    run = site["runs"] / "tuned"
    finetune(tiny_train_config(tiny_model_dir, site["data"], run, "max_steps=6", "compile=false"), show_progress=False)
    prompt, budget = "123 + 456", 12
    rows = write_jsonl(tmp_path / "one.jsonl", [{"instruction": prompt, "output": "", "answer": "579"}])
    predictions = tmp_path / "predictions.jsonl"
    argv = ["eval", "--adapter", str(run / "adapter"), "--data", str(rows), "--max-new-tokens", str(budget)]
    assert main([*argv, "--predictions", str(predictions), "--json"]) == 0
    capsys.readouterr()
    expected = json.loads(predictions.read_text())["response"]

    page.goto(site["url"])
    page.click("#tab-try")
    page.wait_for_selector("#try-run option[value=tuned]", state="attached")
    page.select_option("#try-run", "tuned")
    page.fill("#try-prompt", prompt)
    page.fill("input[name=max_new_tokens]", str(budget))
    page.click("#try-submit")
    page.wait_for_function("!document.querySelector('#try-submit').disabled", timeout=60_000)
    assert page.text_content("#try-error") == ""
    assert page.text_content("#try-tuned") == expected
    assert page.text_content("#try-base") != "…"
    _shot(page, "try", tmp_path)


def test_measured_and_predicted_read_with_labels_and_units(site, page):
    """The demo's run as its closing table shows it: labels, not keys; tokens/s as tokens/s; its peak memory."""
    from tunelab.figures import FIGURES

    run = site["runs"] / "demo-like"
    run.mkdir()
    (run / "config.yaml").write_text("model: embedded\n")
    summary = {"finished": True, "train_s": 300.0, "tokens_padded_per_s": 139.0, "peak_memory_bytes": 0.83 * 2**30}
    (run / "summary.json").write_text(json.dumps(summary))
    recorded = {
        "train": {**summary, "peak_memory_bytes": 2.13 * 2**30},
        "predicted": {"train_s": 360.0, "tokens_padded_per_s": 167.0, "peak_memory_bytes": 1.8 * 2**30},
    }
    (run / "eval.json").write_text(json.dumps(recorded))
    page.goto(site["url"])
    page.click("#tab-runs")
    page.click("tr[data-run=demo-like]")
    table = page.locator("#run-comparison")
    table.locator("tbody tr").first.wait_for()
    rows = [[c.strip() for c in r.split("\t")] for r in table.locator("tbody").inner_text().strip().splitlines()]
    assert rows == [
        ["training time", "5.0 min", "6.0 min"],
        ["tokens/s fed (padded)", "139 tokens/s", "167 tokens/s"],
        ["peak memory", "2.13 GiB", "1.80 GiB"],
    ]
    assert not any(key in table.inner_text() for key in FIGURES)  # no raw key shown
    assert page.locator("#run-mem").inner_text() == "2.13 GiB"  # the run's header agrees with its table
