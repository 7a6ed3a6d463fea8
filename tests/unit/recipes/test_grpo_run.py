"""recipes/grpo.py: a GRPO run on the tiny Llama writes TRL's metrics, sampled completions, an adapter and the
summary every objective's run returns, and a run resumed from its checkpoint repeats the uninterrupted run's steps
(the sampler's RNG is in the checkpoint)."""

from __future__ import annotations

import json
import shutil

import pytest
from conftest import tiny_train_config, write_jsonl

import tunelab
from tunelab import objectives
from tunelab.recipes.entry import train
from tunelab.recipes.summary import RunSummary

pytestmark = pytest.mark.slow


def prompt_rows():
    return [{"instruction": f"{a} + {b}", "answer": str(a + b)} for a, b in [(1, 2), (3, 4), (5, 6), (7, 8)]]


def grpo_config(model_dir, data, out, *extra):
    return tiny_train_config(
        model_dir,
        data,
        out,
        "objective=grpo",
        "micro_batch=2",
        "grad_accum=1",
        "grpo.num_generations=3",
        "grpo.max_completion_length=6",
        "grpo.log_completions_steps=1",
        "max_steps=4",
        "lr=5e-2",
        "grpo.rewards=[{name: exact_answer}, {name: length, weight: 0.5, args: {max_tokens: 3}}]",
        *extra,
    )


def metrics(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_grpo_run_logs_trl_metrics_and_saves_adapter(tmp_path, tiny_model_dir):
    data = write_jsonl(tmp_path / "prompts.jsonl", prompt_rows())
    out = tmp_path / "run"
    cfg = grpo_config(tiny_model_dir, data, out, "grpo.beta=0.1", "grpo.num_iterations=2")
    summary = tunelab.finetune(cfg)  # the Python API: one RunSummary for every objective
    assert isinstance(summary, RunSummary) and summary.objective == "grpo"
    assert summary.steps == 4 and summary.finished and (out / "adapter" / "adapter_config.json").is_file()
    assert (out / "config.yaml").is_file() and json.loads((out / "summary.json").read_text()) == summary.as_dict()
    assert summary.reward_last is not None and summary.loss_first is not None and summary.data["prompts"] == 4
    assert 0 < summary.tokens_loss < summary.tokens_nonpad and summary.tokens_loss_per_s > 0
    # CPU peak memory as docs/metrics.md defines it: above the RSS before the model loaded, not the process's own
    assert 0 <= summary.peak_memory_bytes < summary.peak_memory_absolute_bytes
    rows = metrics(out)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    for key in (
        "reward",
        "reward_std",
        "rewards/exact_answer/mean",
        "rewards/length/mean",
        "completions/mean_length",
        "completions/clipped_ratio",
        "kl",
        "entropy",
        "clip_ratio/region_mean",
    ):
        assert key in rows[0], key
    assert all(r["completions/mean_length"] <= 6 for r in rows)
    assert trl_grpo_metric_names() <= set(rows[0])
    logged = [json.loads(line) for line in (out / "completions.jsonl").read_text().splitlines()]
    assert {r["step"] for r in logged} == {1, 3}  # generation batches start at steps 1 and 3 (num_iterations 2)


# TRL's GRPOTrainer metrics that do not apply here: tool calls, vLLM's sampling corrections, the entropy bonus, the
# auxiliary loss, the cispo and vespo loss types; and `num_tokens`, which the loop logs as `tokens_nonpad`.
NOT_APPLICABLE = ("tools/", "sampling/", "policy_loss", "entropy_coef", "aux_loss", "cispo", "vespo/", "num_tokens")


def trl_grpo_metric_names() -> set[str]:
    """The metric names the installed TRL's GRPOTrainer logs (`self._metrics[mode]["name"]`), those that apply to a
    run with a KL term and a clipped loss type, read from its source: a renamed or new metric fails this test."""
    import re

    trainer = pytest.importorskip("trl.trainer.grpo_trainer")
    source = open(trainer.__file__).read()
    names = set(re.findall(r'_metrics\[mode\]\["([^"]+)"\]', source))
    assert {"reward", "kl", "entropy", "clip_ratio/region_mean"} <= names  # the pattern still reads TRL's source
    return {n for n in names if not n.startswith(NOT_APPLICABLE)}


def test_resume_repeats_the_uninterrupted_steps(tmp_path, tiny_model_dir):
    data = write_jsonl(tmp_path / "prompts.jsonl", prompt_rows())
    whole = tmp_path / "whole"
    train(grpo_config(tiny_model_dir, data, whole), show_progress=False)
    cut = tmp_path / "cut"
    train(grpo_config(tiny_model_dir, data, cut, "save_steps=2"), show_progress=False)
    # As after a kill at step 4: the checkpoint of step 2, and metrics lines past it that the resume drops.
    shutil.rmtree(cut / "adapter")
    train(grpo_config(tiny_model_dir, data, cut, "save_steps=2", "resume=true"), show_progress=False)
    a, b = metrics(whole), metrics(cut)
    assert [r["step"] for r in b] == [1, 2, 3, 4]
    for x, y in zip(a[2:], b[2:]):
        assert y["reward"] == x["reward"]
        assert y["loss"] == pytest.approx(x["loss"], abs=1e-6)


@pytest.fixture
def clocked(monkeypatch):
    """The loop's `time`, moving 60 s in each step and nowhere else."""
    from tunelab.recipes import grpo
    from tunelab.train import loop

    class Clock:
        now = 1000.0

        def perf_counter(self):
            return self.now

    clock, real_tokens = Clock(), grpo.GrpoSource.step_tokens
    clock.first_extra = 0.0  # seconds more in the first step: a run's warm-up
    clock.later = {}  # from step n (a key, counted from 1) on, each takes this many seconds instead of 60
    clock.steps = 0

    def timed_step(source, step):
        clock.steps += 1
        slower = [s for n, s in clock.later.items() if clock.steps >= n]
        clock.now += (slower[-1] if slower else 60.0) + clock.first_extra
        clock.first_extra = 0.0
        return real_tokens(source, step)

    monkeypatch.setattr(loop, "time", clock)
    monkeypatch.setattr(grpo.GrpoSource, "step_tokens", timed_step)
    return clock


def test_max_minutes_ends_a_grpo_run_between_generation_batches(tmp_path, tiny_model_dir, clocked, capsys):
    data = write_jsonl(tmp_path / "prompts.jsonl", prompt_rows())
    out = tmp_path / "run"
    cfg = grpo_config(
        tiny_model_dir, data, out, "grpo.num_iterations=2", "max_steps=8", "max_minutes=4.5", "log_steps=5"
    )
    summary = train(cfg)
    # A batch (2 updates) is 120 s: after step 2 (120 s) the next ends at 240 <= 270; after step 4 it would end at
    # 360. After step 3 (180 s) one more step would fit, but a run ends only between generation batches.
    assert summary.steps == 4 and summary.total_steps == 8 and summary.time_limited
    assert (out / "adapter" / "adapter_config.json").is_file()
    assert [r["step"] for r in metrics(out)] == [4]  # the last step is logged
    assert "time limit: max_minutes 4.5 ended training after step 4 of 8" in capsys.readouterr().out


def test_a_schedule_within_the_limit_ends_the_run_and_its_decay_where_the_pace_says(
    tmp_path, tiny_model_dir, clocked, capsys
):
    """grpo.schedule_within_limit (the run's schedule_within_limit under its earlier name): after the two warm-up
    steps and one steady one (60 s each on this clock, 180 s gone), 4.5 minutes hold one more, so the run ends at
    step 4 as finished, its cosine decayed from step 3 over the steps left (not cut at 4 of 8); a run resumed from
    step 3 keeps that schedule."""
    import math

    data = write_jsonl(tmp_path / "prompts.jsonl", prompt_rows())
    fitted = ("max_steps=8", "max_minutes=4.5", "log_steps=1", "grpo.schedule_within_limit=true", "save_steps=3")
    out = tmp_path / "run"
    summary = train(grpo_config(tiny_model_dir, data, out, *fitted))
    assert summary.steps == 4 and summary.schedule_steps == 4 and summary.total_steps == 8
    assert summary.finished and not summary.time_limited
    assert "max_minutes 4.5 holds 4 of the 8 steps; the learning-rate schedule now ends at step 4" in (
        capsys.readouterr().out
    )
    # Cosine over 8 steps for steps 1-3; refitted at step 3 to end at 4, the last step's rate is the 4-step cosine's.
    cosine = [5e-2 * 0.5 * (1 + math.cos(math.pi * k / 8)) for k in (0, 1, 2)]
    lrs = [r["lr"] for r in metrics(out)]
    assert lrs == pytest.approx([*cosine, 5e-2 * 0.5 * (1 + math.cos(math.pi * 3 / 4))])
    # Resumed from the checkpoint of step 3: the fitted schedule, not the config's 8 steps.
    shutil.rmtree(out / "adapter")
    summary = train(grpo_config(tiny_model_dir, data, out, *fitted, "resume=true"), show_progress=False)
    assert summary.steps == 4 and [r["lr"] for r in metrics(out)] == pytest.approx(lrs)


def test_leaving_out_equal_reward_groups_trains_the_same_adapter(tmp_path, tiny_model_dir, monkeypatch):
    """β = 0: the update leaves out completions whose group's rewards are all equal (every group but one prompt's
    here, and whole micro-batches), and trains the adapter the full update trains, zero-gradient steps included."""
    import torch
    from safetensors.torch import load_file

    from tunelab.recipes import grpo

    data = write_jsonl(tmp_path / "prompts.jsonl", prompt_rows())
    extra = ("grpo.beta=0.0", f"grpo.rewards=[{{name: '{tmp_path}/r.py:r'}}]", "micro_batch=1", "grad_accum=2")
    left_out, whole = tmp_path / "left-out", tmp_path / "whole"
    cfg = grpo_config(tiny_model_dir, data, left_out, *extra)
    # Rewards that differ within the group of one prompt of the first generation batch, equal (0) elsewhere.
    rewarded = prompt_rows()[grpo.prompt_order(4, 2, 0, cfg.run.seed)[0]]["instruction"]
    (tmp_path / "r.py").write_text(
        "def r(prompts, completions, **row):\n"
        f"    return [float(sum(map(ord, c)) % 7) if {rewarded!r} in p else 0.0 for p, c in zip(prompts, completions)]\n"
    )
    ran = []
    real_generate = grpo.GrpoSource.generate

    def counting_generate(source, generation):
        batch = real_generate(source, generation)
        ran.append([m.rollout.rows for m in batch.micro])
        return batch

    monkeypatch.setattr(grpo.GrpoSource, "generate", counting_generate)
    train(cfg, show_progress=False)
    monkeypatch.setattr(grpo, "trains_on", lambda adv, settings: torch.ones_like(adv, dtype=torch.bool))
    train(grpo_config(tiny_model_dir, data, whole, *extra), show_progress=False)
    rows_left_out, rows_whole = ran[:4], ran[4:]
    assert all(r == [3, 3] for r in rows_whole)
    # The rewarded prompt's micro-batch alone in the two batches that hold it (the first one among them, so
    # AdamW's moments are nonzero in the steps after), nothing run in the two that do not.
    assert sum(r.count(3) for r in rows_left_out) == 2 and rows_left_out.count([0, 0]) == 2
    assert rows_left_out[0] != [0, 0]
    a, b = metrics(left_out), metrics(whole)
    for x, y in zip(a, b):
        assert x["loss"] == pytest.approx(y["loss"], abs=1e-6) and x["reward"] == y["reward"]
        assert x["clip_ratio/region_mean"] == y["clip_ratio/region_mean"]
    wa = load_file(left_out / "adapter" / "adapter_model.safetensors")
    wb = load_file(whole / "adapter" / "adapter_model.safetensors")
    for name in wb:
        torch.testing.assert_close(wa[name], wb[name], atol=1e-6, rtol=1e-5, msg=name)


def test_a_group_left_out_before_a_kept_one_in_the_same_micro_batch_trains_the_same_adapter(
    tmp_path, tiny_model_dir, monkeypatch
):
    """β = 0, two prompts a micro-batch: the first prompt's group has equal rewards and is left out, the second's is
    kept, so the rollout's rows start at the batch's fourth completion; each row takes its own completion's
    advantage (not the left-out ones'), and the adapter is the one the full update trains."""
    import torch
    from safetensors.torch import load_file

    from tunelab.recipes import grpo

    data = write_jsonl(tmp_path / "prompts.jsonl", prompt_rows())
    extra = ("grpo.beta=0.0", f"grpo.rewards=[{{name: '{tmp_path}/r.py:r'}}]", "micro_batch=2", "max_steps=1")
    left_out, whole = tmp_path / "left-out", tmp_path / "whole"
    cfg = grpo_config(tiny_model_dir, data, left_out, *extra)
    rewarded = prompt_rows()[grpo.prompt_order(4, 2, 0, cfg.run.seed)[1]]["instruction"]
    (tmp_path / "r.py").write_text(
        "def r(prompts, completions, **row):\n"
        f"    return [float(sum(map(ord, c)) % 7) if {rewarded!r} in p else 0.0 for p, c in zip(prompts, completions)]\n"
    )
    train(cfg, show_progress=False)
    monkeypatch.setattr(grpo, "trains_on", lambda adv, settings: torch.ones_like(adv, dtype=torch.bool))
    train(grpo_config(tiny_model_dir, data, whole, *extra), show_progress=False)
    assert metrics(left_out)[0]["loss"] == pytest.approx(metrics(whole)[0]["loss"], abs=1e-6)
    wa = load_file(left_out / "adapter" / "adapter_model.safetensors")
    wb = load_file(whole / "adapter" / "adapter_model.safetensors")
    for name in wb:
        torch.testing.assert_close(wa[name], wb[name], atol=1e-6, rtol=1e-5, msg=name)


def test_a_cpu_grpo_run_returns_freed_pages(tmp_path, tiny_model_dir, monkeypatch):
    """GRPO's rollouts change shape every batch, and its RSS grew by 0.3-0.7 GiB a batch with decay off: its setup
    asks jemalloc to free pages lazily, LoRA or not, and never to return them for good (page faults made the
    quickstart 16-29% slower)."""
    from tunelab import allocator

    calls = []
    monkeypatch.setattr(allocator, "decay_freed_pages", lambda ms, returned_ms=None: calls.append((ms, returned_ms)))
    data = write_jsonl(tmp_path / "prompts.jsonl", prompt_rows())
    loaded, load = [], objectives.load
    monkeypatch.setattr(objectives, "load", lambda ref: loaded.append(ref) or load(ref))
    train(grpo_config(tiny_model_dir, data, tmp_path / "run", "max_steps=1"), show_progress=False)
    assert calls == [(allocator.DECAY_MS, -1)]
    # The objective row names the recipe that ran and the loss module it built.
    row = objectives.get("grpo")
    assert loaded[0] == row.recipe and row.loss_module in loaded


def fitted_run(tmp_path, model_dir, out, max_steps: int, max_minutes: int, capsys) -> tuple[dict, str]:
    """A run with grpo.schedule_within_limit under the `clocked` clock: its summary and what it printed."""
    data = write_jsonl(tmp_path / "prompts.jsonl", prompt_rows())
    fitted = (f"max_steps={max_steps}", f"max_minutes={max_minutes}", "log_steps=1", "save_steps=0")
    summary = train(grpo_config(model_dir, data, out, *fitted, "grpo.schedule_within_limit=true"))
    return summary, capsys.readouterr().out


def test_the_schedule_is_fitted_on_the_pace_after_the_warm_up(tmp_path, tiny_model_dir, clocked, capsys):
    """The first step takes 120 s (its warm-up), the next 60 s each: fitted after the steady step 3 (240 s gone), 6
    minutes hold 5 of 10 steps, and the run trains 5 with its cosine decayed within them."""
    clocked.first_extra = 60.0
    out = tmp_path / "run"
    summary, text = fitted_run(tmp_path, tiny_model_dir, out, 10, 6, capsys)
    assert "at 60.0 s a step, max_minutes 6 holds 5 of the 10 steps" in text
    assert summary.steps == 5 and summary.schedule_steps == 5 and not summary.time_limited
    lrs = [r["lr"] for r in metrics(out)]
    assert lrs[-1] < lrs[2] and lrs[3] > 0
    assert summary.train_s <= 6 * 60


def test_the_schedule_is_refitted_after_every_step_when_steps_slow_down(tmp_path, tiny_model_dir, clocked, capsys):
    """120 s, then 60, 60, and 90 s from the fourth step on, in 10 minutes: fitted at step 3 the schedule holds 9
    steps; refitted after each step on the pace since the warm-up (75 s after step 4), it ends at 7 with its
    learning rate decayed, inside the limit."""
    clocked.first_extra, clocked.later = 60.0, {4: 90.0}
    out = tmp_path / "run"
    summary, text = fitted_run(tmp_path, tiny_model_dir, out, 20, 10, capsys)
    assert "at 60.0 s a step, max_minutes 10 holds 9 of the 20 steps" in text
    assert "at 75.0 s a step, max_minutes 10 holds 7 of the 20 steps" in text
    assert summary.steps == 7 and summary.schedule_steps == 7 and not summary.time_limited
    assert metrics(out)[-1]["lr"] < 0.1 * max(r["lr"] for r in metrics(out))
    assert summary.train_s <= 10 * 60


def test_balance_by_reaches_the_prompt_order_and_a_missing_field_fails_before_the_model_loads(
    tmp_path, tiny_model_dir, monkeypatch
):
    from tunelab.errors import TunelabError
    from tunelab.model import load as mload
    from tunelab.recipes import grpo

    rows = [dict(r, kind=i % 2) for i, r in enumerate(prompt_rows())]
    data = write_jsonl(tmp_path / "prompts.jsonl", rows)
    seen = []
    order = grpo.prompt_order
    monkeypatch.setattr(grpo, "prompt_order", lambda *a: seen.append(a[-1]) or order(*a))
    train(grpo_config(tiny_model_dir, data, tmp_path / "run", "max_steps=1", "grpo.balance_by=kind"), False)
    assert seen == [[0, 1, 0, 1]]
    monkeypatch.setattr(mload, "load_model", lambda *a, **k: pytest.fail("the model loaded"))
    with pytest.raises(TunelabError, match="prompt 1 has no 'digits' to balance by"):
        train(grpo_config(tiny_model_dir, data, tmp_path / "bad", "grpo.balance_by=digits"), False)


def test_report_to_tensorboard_logs_every_metrics_record_of_a_grpo_run(tmp_path, tiny_model_dir, capsys):
    """The GRPO row has the trackers capability: TensorBoard gets each metrics.jsonl record, TRL's names, same steps."""
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    data = write_jsonl(tmp_path / "prompts.jsonl", prompt_rows())
    out = tmp_path / "run"
    train(grpo_config(tiny_model_dir, data, out, "max_steps=2", "report_to=tensorboard"))
    assert f"tensorboard: logging to {out / 'tensorboard'}" in capsys.readouterr().out
    acc = EventAccumulator(str(out / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    logged = {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
    rows = metrics(out)
    assert sorted(logged) == sorted(k for k in rows[0] if k != "step")
    for tag, points in logged.items():
        assert [s for s, _ in points] == [1, 2], tag
        assert [v for _, v in points] == pytest.approx([r[tag] for r in rows], rel=1e-6, abs=1e-30), tag
    assert {"reward", "loss", "completions/mean_length", "rewards/exact_answer/mean"} <= set(logged)
