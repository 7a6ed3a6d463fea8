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


def test_peer_rounds_go_to_the_results_database_as_every_record(tmp_path, monkeypatch):
    """`bench peers trl-grpo` stores each side's run in bench's one database (bench/store.py), its completion
    figures under `generation`, readable by `bench export` and `tunelab report` as any record."""
    from tunelab.bench import loops, store
    from tunelab.report import sections

    cfg = grpo_config()
    rates = grpo_peer.window_rates([0.0, 2.0, 4.0], [6.0, 8.0], grpo_peer.rows_per_batch(cfg), 1, 1)
    versions = {"torch": "2.13", "transformers": "5.25", "peft": "0.21.2", "trl": "1.16"}
    runs = [
        grpo_peer._record(kind, cfg, "fp32", "cpu", rates, 2**30, versions) for kind in (grpo_peer.KIND, grpo_peer.PEER)
    ]
    monkeypatch.setattr(grpo_peer, "grpo_rounds", lambda *a, **k: runs)
    db = tmp_path / "bench.sqlite"
    m = loops.Measuring(steps=2, warmup=1, db=db, catalog_gpu=None, as_json=True)
    (row,) = loops.grpo_peer_rounds(cfg, [grpo_peer.PEER], 1, m)
    assert row["completions_per_s_ratio"] == 1.0
    assert not list(tmp_path.glob("*.jsonl"))  # no second store beside it
    stored = store.query(db, objective="grpo")
    assert [r["kind"] for r in stored] == [grpo_peer.KIND, grpo_peer.PEER]
    for r in stored:
        assert r["generation"]["completions_per_s"] == rates["completions_per_s"]
        assert r["generation"]["completions_per_step"] == 24 and r["generation"]["trl_version"] == "1.16"
        assert r["step_time_median_s"] == 2.0 and r["peak_memory_bytes"] == 2**30
        assert r["config"]["objective"] == "grpo"
    assert len(sections.load_db(db)) == 2
