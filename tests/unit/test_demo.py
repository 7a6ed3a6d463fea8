"""The demo's time budget: training is fitted to what `--minutes` leaves, and a budget too small is refused."""

import pytest

from tunelab.commands import demo


def test_fitted_rows_scale_with_the_time_left_after_compilation():
    assert demo.rows_within_budget(18_000, predicted_s=600, fixed_s=60, budget_s=900) == 18_000
    # 540 s for 18,000 rows is 0.03 s a row; 300 s left after 60 s of compilation holds 10,000.
    assert demo.rows_within_budget(18_000, predicted_s=600, fixed_s=60, budget_s=360) == 10_000
    assert demo.rows_within_budget(18_000, predicted_s=600, fixed_s=60, budget_s=30) == 0


def test_a_budget_too_small_to_learn_is_one_line_naming_minutes(tiny_model_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "run"
    (tmp_path / "c.yaml").write_text("")
    code = demo.main(
        [
            str(tmp_path / "c.yaml"),
            "--minutes",
            "0.01",
            "--skip-base",
            "--train-rows",
            "2000",
            "--test-rows",
            "20",
            f"model={tiny_model_dir}",
            f"output_dir={out}",
            f"data.path={out / 'data' / 'train.jsonl'}",
            "data.template=compact",
            "seq_len=64",
            "micro_batch=4",
            "precision=fp32",
            "compile=false",
        ]
    )
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1 and "--minutes 0.01" in err and "raise --minutes" in err
    assert not (out / "adapter").exists()


@pytest.mark.parametrize("minutes", ["0", "-3", "nan", "inf"])
def test_minutes_must_be_positive(minutes, capsys):
    with pytest.raises(SystemExit) as e:
        demo.main(["/dev/null", "--minutes", minutes])
    assert e.value.code == 2 and "--minutes must be positive" in capsys.readouterr().err


def test_base_rows_must_be_at_least_one(capsys):
    with pytest.raises(SystemExit) as e:
        demo.main(["/dev/null", "--base-rows", "0"])
    assert e.value.code == 2 and "--base-rows must be at least 1, got 0" in capsys.readouterr().err


def test_a_cut_recipe_keeps_enough_optimizer_steps_with_a_smaller_micro_batch():
    assert demo.smaller_micro_batch(16, steps=205) == 16  # the whole recipe is left alone
    assert demo.smaller_micro_batch(16, steps=30) == 2  # 30 -> 60 -> 120 -> 240 steps
    assert demo.smaller_micro_batch(16, steps=60) == 4
    assert demo.smaller_micro_batch(16, steps=100) == 8
    assert demo.smaller_micro_batch(16, steps=5) == demo.MIN_MICRO_BATCH  # never below the floor
    assert demo.smaller_micro_batch(2, steps=5) == 2


def test_an_earlier_runs_checkpoints_are_refused_before_any_data_is_written(tmp_path, capsys):
    out = tmp_path / "run"
    (out / "checkpoints" / "step-0000020").mkdir(parents=True)
    (tmp_path / "c.yaml").write_text("")
    code = demo.main([str(tmp_path / "c.yaml"), "--curve-every", "20", f"output_dir={out}"])
    (line,) = capsys.readouterr().err.splitlines()
    assert code == 2 and "holds checkpoints of an earlier run (newest step-0000020); resume=true" in line
    assert not (out / "data").exists()


def _file_prediction(monkeypatch, path):
    """plan's prediction faked from the rows file: 0.1 s a row at micro-batch 16, 0.2 at smaller ones (more steps,
    more launches a token), 40 s of compile, a packed row of 5 examples."""
    from types import SimpleNamespace

    from tunelab.recipes import predict

    def prediction(cfg):
        n, mb = len(path.read_text().splitlines()), cfg.batch.micro_batch
        return SimpleNamespace(
            work=SimpleNamespace(optimizer_steps=n // (5 * mb)),
            speed=SimpleNamespace(train_s=(0.1 if mb == 16 else 0.2) * n, tokens_per_s=100.0),
            overheads=SimpleNamespace(compile_s=40.0),
            memory=SimpleNamespace(total=1 << 30),
            efficiency=SimpleNamespace(label="assumed"),
        )

    monkeypatch.setattr(predict, "local_prediction", prediction)
    return prediction


def test_a_smaller_micro_batch_keeps_enough_steps_and_the_rows_are_fitted_again_at_it(tmp_path, monkeypatch):
    from rich.console import Console

    from tunelab.config import load_config

    path = tmp_path / "train.jsonl"
    _file_prediction(monkeypatch, path)
    cfg = load_config("configs/quickstart.yaml", [])  # micro_batch 16
    rows = [{"i": i} for i in range(4_000)]
    smaller, fit = demo.smaller_batch_within(cfg, Console(quiet=True), rows, path, left_s=540.0)
    # 4,000 rows make 50 steps at 16, 200 at 4; at 4 a row costs 0.2 s: (540 - 40) / 0.2 rows fit.
    assert smaller.batch.micro_batch == 4 and fit == 2_500
    same, fit = demo.smaller_batch_within(smaller, Console(quiet=True), rows, path, left_s=540.0)
    assert same is smaller and fit == 4_000  # 200 steps at 4 already: the caller's rows stand


def test_a_cut_run_gets_more_rows_than_fit_and_a_schedule_fitted_to_its_limit(tmp_path, monkeypatch):
    """plan says 2,000 of 18,000 rows fit 240 s at micro-batch 16, too few steps: at 2 they make 200, and 1,000
    rows fit there. Training gets OVERSUPPLY times that, its limit, and its schedule fitted to the limit, so a
    noisy prediction neither starves the run nor cuts it mid-schedule."""
    import json
    from types import SimpleNamespace

    from rich.console import Console

    from tunelab.config import load_config

    path = tmp_path / "train.jsonl"
    predicted = _file_prediction(monkeypatch, path)
    rows = [{"i": i} for i in range(18_000)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = load_config("configs/quickstart.yaml", [])
    args = SimpleNamespace(minutes=15.0)
    cfg, _ = demo.cut_to_budget(args, cfg, Console(quiet=True), rows, path, predicted(cfg), left_s=240.0)
    assert cfg.batch.micro_batch == 2
    assert len(path.read_text().splitlines()) == demo.OVERSUPPLY * 1_000
    assert cfg.run.max_minutes == 4.0 and cfg.run.schedule_within_limit
    cfg, _ = demo.cut_to_budget(args, load_config("configs/quickstart.yaml", []), Console(quiet=True), rows[:100], path,
                             predicted(cfg), left_s=10_000.0)  # fmt: skip
    assert cfg.batch.micro_batch == 16 and cfg.run.schedule_within_limit  # everything fits: nothing cut


def test_the_training_peak_on_cpu_counts_from_before_any_model_loaded():
    # The run's own peak is relative to the RSS at its start, after the base model's scoring left the allocator
    # holding pages; the demo's figure is the training's absolute peak above the RSS before anything loaded.
    summary = {"peak_memory_bytes": 1_000, "peak_memory_absolute_bytes": 5_000}
    assert demo.training_peak(summary, start_rss=2_000) == 3_000
    assert demo.training_peak(summary, start_rss=4_500) == 1_000  # never below what the run itself measured
    assert demo.training_peak(summary, start_rss=None) == 1_000  # CUDA: the allocator's own peak


def test_training_is_limited_to_what_the_budget_leaves_or_the_configs_own_limit_if_shorter():
    from tunelab.config import load_config

    cfg = load_config("configs/quickstart.yaml", [])
    assert cfg.run.max_minutes == 0
    assert demo.with_time_limit(cfg, 600.0).run.max_minutes == 10.0
    assert demo.with_time_limit(cfg, 600.0).run.schedule_within_limit
    assert demo.with_time_limit(cfg, -5.0).run.max_minutes > 0  # never 0, which would mean no limit
    own = load_config("configs/quickstart.yaml", ["max_minutes=4"])
    assert demo.with_time_limit(own, 600.0).run.max_minutes == 4.0


def test_the_demo_trains_under_the_time_its_budget_leaves_and_says_when_it_stopped_there(monkeypatch, tmp_path, capsys):
    """demo.run end to end with scoring and training replaced: the base model is scored on the first --base-rows
    held-out rows, the tuned one on all; the training config it hands over carries max_minutes = budget - slack -
    time spent - the base scoring's time per row over every held-out row - the setup reserve."""
    import json
    from types import SimpleNamespace

    from tunelab.recipes import entry

    scored = {"accuracy": 0.5, "n": 4, "seconds": 100.0, "by_digits": {"2": {"n": 4, "accuracy": 0.5}}}
    scored_rows = []

    def fake_score(cfg, rows, adapter):
        scored_rows.append((len(rows), adapter is not None))
        return {**scored, "n": len(rows)}

    monkeypatch.setattr(demo, "score", fake_score)
    handed = {}

    def fake_train(cfg):
        handed["cfg"] = cfg
        steps = 5
        return SimpleNamespace(as_dict=lambda: {
            "steps": steps, "total_steps": 9, "time_limited": True, "loss_first": 2.0, "loss_last": 1.0,
            "train_s": 60.0, "tokens_nonpad_per_s": 1.0, "tokens_padded_per_s": 1.0, "tokens_loss_per_s": 1.0,
            "peak_memory_bytes": 1, "peak_memory_absolute_bytes": 1,
        })  # fmt: skip

    monkeypatch.setattr(entry, "train", fake_train)
    out = tmp_path / "demo"
    code = demo.main(
        [
            "configs/quickstart.yaml", "--minutes", "30", "--train-rows", "1200", "--test-rows", "8",
            "--base-rows", "2", f"output_dir={out}", f"data.path={out}/data/train.jsonl",
        ]
    )  # fmt: skip
    assert code == 0
    limit = handed["cfg"].run.max_minutes * 60
    assert scored_rows == [(2, False), (8, True)]
    # 100 s for 2 rows: the tuned model's 8 are reserved 400 s.
    most = 30 * 60 - demo.END_SLACK_S - 4 * scored["seconds"] - demo.SETUP_RESERVE_S
    assert most - 30 < limit < most  # data, plan and this test's overheads took some seconds
    printed = capsys.readouterr().out
    words = " ".join(printed.split())  # rich wraps at the terminal's width
    assert "on 2 of the 8 held-out rows" in words and "base: the first 2 of the 8 rows" in words
    assert "training stopped at its time limit after 5 of 9 steps" in printed
    result = json.loads((out / "eval.json").read_text())
    assert result["train"]["time_limited"] and result["train"]["total_steps"] == 9
