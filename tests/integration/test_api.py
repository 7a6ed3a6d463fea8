"""docs/api.md's example runs as written: its shell command, then its Python, in a scratch folder with the
repository's configs beside it; and the API's answers are the CLI's."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil

import pytest
from conftest import REPO

import tunelab
from tunelab.cli import main
from tunelab.errors import TunelabError

pytestmark = pytest.mark.integration

API = REPO / "docs" / "api.md"


def blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", API.read_text(), flags=re.S)


def test_the_api_pages_example_runs(tmp_path, monkeypatch, capsys):
    shutil.copytree(REPO / "configs", tmp_path / "configs")
    monkeypatch.chdir(tmp_path)
    for line in blocks("bash")[0].strip().splitlines():
        argv = shlex.split(line)
        assert argv[0] == "tunelab"
        assert main(argv[1:]) == 0
    (code,) = blocks("python")
    exec(compile(code, str(API), "exec"), {})
    out = capsys.readouterr().out
    assert re.search(r"rtx-4090: [\d.]+ min, peak [\d.]+ GiB", out) and "h100-sxm:" in out
    assert re.search(r"3 steps, loss [\d.]+ -> [\d.]+", out)
    summary = json.loads((tmp_path / "runs/api/run/summary.json").read_text())
    assert summary["steps"] == 3 and summary["micro_batch"] == 4 and summary["seq_len"] == 128
    gguf = tmp_path / "runs/api/quickstart.gguf"
    assert gguf.stat().st_size > 100 * 2**20 and str(gguf.relative_to(tmp_path)) in out


def test_plan_returns_what_the_cli_prints(capsys):
    argv = ["--config", "configs/llama2-7b-lora.yaml", "--examples", "2000", "--gpu", "rtx-4090,a100-80gb"]
    os.chdir(REPO)
    assert main(["plan", *argv, "--json", "micro_batch=2"]) == 0
    printed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    results = tunelab.estimate("configs/llama2-7b-lora.yaml", gpu="rtx-4090,a100-80gb", examples=2000, micro_batch=2)
    assert [r.single.time_s for r in results] == [p["time_s"] for p in printed]
    assert [r.single.memory.total for r in results] == [p["peak_memory_bytes"] for p in printed]


def test_bad_input_is_the_clis_one_line():
    with pytest.raises(TunelabError, match=r"unknown key 'learning_rate'; did you mean 'lr'"):
        tunelab.load_config(None, learning_rate=1e-3)
    with pytest.raises(TunelabError, match="export format must be one of"):
        tunelab.export("runs/x/adapter", "out", "onnx")
    cfg = tunelab.load_config(None, **{"lora.r": 8, "seq_len": 128, "lora.targets": ["q_proj", "v_proj"]})
    assert (cfg.adapter.lora.r, cfg.batch.seq_len, cfg.adapter.lora.targets) == (8, 128, ["q_proj", "v_proj"])
    with pytest.raises(TunelabError, match="overrides and settings apply to a config file"):
        tunelab.estimate(cfg, lr=1e-3)
