"""report_to: the config key, the missing-package error before anything is written, W&B's offline default, and a
tiny run whose TensorBoard scalars are metrics.jsonl's records, name for name and step for step."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import tiny_train_config, write_jsonl

from tunelab.cli import main
from tunelab.config import load_config
from tunelab.errors import TunelabError
from tunelab.train import trackers


def test_report_to_defaults_to_none_and_is_validated():
    assert load_config(None).run.report_to == "none"
    assert load_config(None, ["report_to=wandb"]).run.report_to == "wandb"
    with pytest.raises(TunelabError, match=r"report_to must be one of none, tensorboard, wandb; got 'tensorbord' "):
        load_config(None, ["report_to=tensorbord"])


def test_none_sets_up_nothing(tmp_path):
    trackers.check_available("none")
    assert trackers.setup("none", tmp_path) is None


@pytest.mark.parametrize("report_to", ["tensorboard", "wandb"])
def test_a_missing_package_is_one_line_naming_the_pip_install(monkeypatch, report_to):
    monkeypatch.setattr(trackers, "installed", lambda module: module != report_to)
    with pytest.raises(
        TunelabError, match=rf"report_to: {report_to} needs the {report_to} package.*pip install {report_to}"
    ):
        trackers.check_available(report_to)


def test_a_missing_package_fails_train_before_anything_is_written(monkeypatch, tmp_path, tiny_model_dir, capsys):
    monkeypatch.setattr(trackers, "installed", lambda module: False)
    out = tmp_path / "out"
    data = write_jsonl(tmp_path / "d.jsonl", [{"instruction": "1", "output": "2"}])
    config = tmp_path / "c.yaml"
    config.write_text(f"model: {tiny_model_dir}\ndata:\n  path: {data}\noutput_dir: {out}\nreport_to: wandb\n")
    rc = main(["train", "--config", str(config), "--quiet"])
    err = capsys.readouterr().err
    assert rc == 2 and err.splitlines() == [
        "tunelab train: error: report_to: wandb needs the wandb package, which is not installed; "
        "pip install wandb, or set report_to: none"
    ]
    assert not out.exists()


def test_wandb_runs_offline_without_an_api_key(tmp_path):
    setup = trackers.setup("wandb", tmp_path / "run", env={})
    assert setup.project == "tunelab"
    assert setup.init_kwargs == {"wandb": {"name": "run", "dir": str(tmp_path / "run"), "mode": "offline"}}
    (note,) = setup.notes
    assert note.startswith("wandb: no WANDB_API_KEY set, so logging offline to ") and "\n" not in note


@pytest.mark.parametrize(
    "env", [{"WANDB_API_KEY": "k"}, {"WANDB_MODE": "online"}, {"WANDB_MODE": "disabled", "WANDB_PROJECT": "p"}]
)
def test_wandb_with_a_key_or_a_chosen_mode_is_left_to_wandb(tmp_path, env):
    setup = trackers.setup("wandb", tmp_path / "run", env=env)
    assert "mode" not in setup.init_kwargs["wandb"] and setup.notes == ()
    assert setup.project == env.get("WANDB_PROJECT", "tunelab")


def test_tensorboard_writes_under_output_dir_and_purges_past_a_resume(tmp_path):
    fresh = trackers.setup("tensorboard", tmp_path)
    assert fresh.project == "tensorboard" and fresh.init_kwargs == {"tensorboard": {}}
    assert str(tmp_path / "tensorboard") in fresh.notes[0]
    assert trackers.setup("tensorboard", tmp_path, resume_step=4).init_kwargs == {"tensorboard": {"purge_step": 5}}


def test_flat_config_gives_trackers_scalars_only():
    flat = trackers.flat_config({"lr": 1e-4, "lora": {"targets": ["q", "v"], "r": 8}, "max_steps": None, "x": True})
    assert flat == {"lr": 1e-4, "lora.targets": "q,v", "lora.r": 8, "max_steps": "null", "x": True}


def read_metrics(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def tensorboard_scalars(out: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(out / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def jsonl_scalars(out: Path) -> dict[str, list[tuple[int, float]]]:
    series: dict[str, list[tuple[int, float]]] = {}
    for record in read_metrics(out):
        for key, value in record.items():
            if key != "step":
                series.setdefault(key, []).append((record["step"], value))
    return series


def assert_same_series(tb: dict, jl: dict) -> None:
    assert sorted(tb) == sorted(jl)
    for tag, points in jl.items():
        assert [s for s, _ in tb[tag]] == [s for s, _ in points], tag
        # TensorBoard stores float32.
        assert [v for _, v in tb[tag]] == pytest.approx([v for _, v in points], rel=1e-6, abs=1e-30), tag


@pytest.mark.slow
def test_tensorboard_scalars_are_the_metrics_records(tiny_model_dir, tmp_path, addition_rows, capsys):
    pytest.importorskip("tensorboard")
    from tunelab.recipes.finetune import finetune

    data = write_jsonl(tmp_path / "add.jsonl", addition_rows)
    out = tmp_path / "run"
    cfg = tiny_train_config(
        tiny_model_dir, data, out, "max_steps=4", "log_steps=2", "eval.split=0.25", "eval.steps=2",
        "report_to=tensorboard",
    )  # fmt: skip
    finetune(cfg)
    assert f"tensorboard: logging to {out / 'tensorboard'}" in capsys.readouterr().out
    tb, jl = tensorboard_scalars(out), jsonl_scalars(out)
    assert {"loss", "lr", "tokens_loss_per_s", "peak_memory_bytes", "eval_loss", "eval_tokens", "eval_s"} <= set(jl)
    assert [s for s, _ in jl["loss"]] == [2, 4] and [s for s, _ in jl["eval_loss"]] == [2, 4]
    assert_same_series(tb, jl)


@pytest.mark.slow
def test_a_resumed_run_shows_each_step_once(tiny_model_dir, tmp_path, addition_rows):
    """The killed run logged past its last checkpoint; the resumed one purges those steps as metrics.jsonl drops
    them, so TensorBoard reads the resumed run's values."""
    pytest.importorskip("tensorboard")
    from tunelab.recipes.finetune import finetune
    from tunelab.train.loop import Measurement

    data = write_jsonl(tmp_path / "add.jsonl", addition_rows)
    out = tmp_path / "run"
    args = ("max_steps=6", "log_steps=1", "save_steps=2", "report_to=tensorboard", "lr_scheduler=constant")
    finetune(tiny_train_config(tiny_model_dir, data, out, *args), show_progress=False, measure=Measurement(stop_at=3))
    assert [s for s, _ in jsonl_scalars(out)["loss"]] == [1, 2, 3]
    finetune(tiny_train_config(tiny_model_dir, data, out, *args, "resume=true", "seed=7"), show_progress=False)
    jl = jsonl_scalars(out)
    assert [s for s, _ in jl["loss"]] == [1, 2, 3, 4, 5, 6]
    assert_same_series(tensorboard_scalars(out), jl)


@pytest.mark.slow
def test_wandb_offline_run_holds_every_metrics_record(tiny_model_dir, tmp_path, addition_rows, monkeypatch):
    """Without a key, W&B logs offline under output_dir/wandb; its run file holds every name and value that
    metrics.jsonl has (W&B stores each value as its JSON text)."""
    pytest.importorskip("wandb")
    from tunelab.recipes.finetune import finetune

    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("WANDB_SILENT", "true")
    data = write_jsonl(tmp_path / "add.jsonl", addition_rows)
    out = tmp_path / "run"
    cfg = tiny_train_config(
        tiny_model_dir, data, out, "max_steps=4", "log_steps=2", "eval.split=0.25", "eval.steps=2", "report_to=wandb"
    )
    finetune(cfg, show_progress=False)
    runs = sorted((out / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(runs) == 1
    stored = runs[0].read_bytes()
    records = read_metrics(out)
    assert {"loss", "eval_loss"} <= {k for r in records for k in r}
    missing = [
        (r["step"], k) for r in records for k, v in r.items() if k != "step" and json.dumps(v).encode() not in stored
    ]
    assert not missing, missing
