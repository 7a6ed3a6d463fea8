"""bench/grpo_peer.py: TRL's GRPOConfig gets tunelab's completions per optimizer step and generation batch, its
reward wraps tunelab's, and the window's rates count what the steps generated."""

from __future__ import annotations

import pytest

from tunelab import config as cfgmod
from tunelab.bench import grpo_peer
from tunelab.train import rewards


def grpo_config(*overrides: str) -> cfgmod.TrainConfig:
    return cfgmod.load_config(
        None,
        [
            "objective=grpo",
            "data.path=prompts.jsonl",
            "grpo.rewards=[{name: exact_answer}]",
            "grpo.num_generations=4",
            "micro_batch=2",
            "grad_accum=3",
            *overrides,
        ],
    )


def trl_completions(args: dict) -> tuple[int, int]:
    """(completions per optimizer step, per generation batch) as TRL 1.16's GRPOConfig derives them."""
    per_step = args["per_device_train_batch_size"] * args["gradient_accumulation_steps"]
    return per_step, args["per_device_train_batch_size"] * args["steps_per_generation"]


@pytest.mark.parametrize("overrides", [(), ("grpo.num_generations=8",), ("grad_accum=1", "micro_batch=4")])
def test_equal_completions_per_step_and_generation_batch(overrides):
    cfg = grpo_config(*overrides)
    args = grpo_peer.trl_grpo_args(cfg)
    rows = cfg.batch.micro_batch * cfg.batch.grad_accum * cfg.objective.grpo.num_generations
    assert trl_completions(args) == (rows, rows) == (grpo_peer.rows_per_batch(cfg),) * 2
    assert args["num_generations"] == cfg.objective.grpo.num_generations
    # Every micro-batch holds whole groups, as tunelab's do.
    assert args["per_device_train_batch_size"] % args["num_generations"] == 0


def test_the_loss_settings_are_tunelabs():
    cfg = grpo_config("grpo.beta=0.04", "grpo.num_iterations=2", "grpo.loss_type=bnpo", "grpo.epsilon_high=0.28")
    args = grpo_peer.trl_grpo_args(cfg)
    g = cfg.objective.grpo
    assert (args["beta"], args["num_iterations"], args["loss_type"]) == (0.04, 2, "bnpo")
    assert (args["epsilon"], args["epsilon_high"]) == (g.epsilon, 0.28)
    assert args["max_completion_length"] == g.max_completion_length and args["use_vllm"] is False


def test_trl_config_accepts_the_settings(tmp_path):
    pytest.importorskip("trl")
    from trl import GRPOConfig

    cfg = grpo_config("device=cpu")
    args = GRPOConfig(output_dir=str(tmp_path), max_steps=3, **grpo_peer.trl_grpo_args(cfg))
    assert args.generation_batch_size == grpo_peer.rows_per_batch(cfg)


def test_wrapped_reward_scores_as_tunelab_does():
    fn = grpo_peer.trl_reward(rewards.load("exact_answer"), ["answer"])
    got = fn(prompts=["1+1", "2+2"], completions=["= 2", "= 5"], completion_ids=None, answer=["2", "4"], other=[0, 0])
    assert got == [1.0, 0.0] and fn.__name__ == "exact_answer"


def test_window_rates_count_generated_completions():
    # Steps end at 10, 12, 14 s: two windowed steps, 16 completions each, a new batch every step.
    r = grpo_peer.window_rates([10.0, 12.0, 14.0], [24.0, 20.0], rows=16, iterations=1, warmup=1)
    assert r["completions_per_s"] == r["completions_per_s_window"] == pytest.approx(32 / 4)
    assert r["completion_tokens_per_s_window"] == pytest.approx((24 + 20) * 16 / 4)
    assert r["completion_tokens_per_s"] == pytest.approx(22 * 16 / 2)
    # A step paused by another process: the window's rate drops, the median step's does not.
    paused = grpo_peer.window_rates([0.0, 2.0, 302.0, 304.0], [8.0] * 3, 16, 1, 1)
    assert paused["completions_per_s"] == pytest.approx(8) and paused["completions_per_s_window"] < 1
    # num_iterations 2: a generation batch every other step.
    assert grpo_peer.window_rates([0.0, 1.0, 2.0], [8.0, 8.0], 16, 2, 1)["completions_per_s"] == pytest.approx(8)
