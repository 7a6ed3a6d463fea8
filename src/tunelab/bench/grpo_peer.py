"""`tunelab bench peers trl-grpo`: TRL's GRPOTrainer beside tunelab's GRPO on the same model, prompts, rewards and
completions per optimizer step, measured the same way.

TRL counts its batch in completions: `per_device_train_batch_size` completions per micro-batch,
`gradient_accumulation_steps` micro-batches per optimizer step, a generation batch of
`per_device_train_batch_size x steps_per_generation` completions reused for `num_iterations` passes. tunelab counts
prompts: `micro_batch x grad_accum` prompts x G completions per generation batch, each optimizer step over all of
it. So TRL gets `micro_batch x G` completions per micro-batch, tunelab's grad_accum and steps_per_generation =
grad_accum: each optimizer step of both sees the same prompts x G completions (`trl_grpo_args`). No vLLM (TRL's
generation is transformers' `generate` with a KV cache), the same sampling settings, LoRA, beta, epsilon,
num_iterations, loss_type, scale_rewards and lr; tunelab's rewards wrapped as TRL reward functions (through
rewards.score, so TRL's rewards are tunelab's).

Both sides are measured over the steady-state window (optimizer steps after `warmup`): completions per second
(the headline: prompts x G completions per generation batch, generation batches per step 1 / num_iterations, over
the median step; the window's total is kept beside it),
completion tokens per second (the completions' real lengths: an untuned model that does not stop at EOS writes
to the cap on both sides, a tuned one stops earlier), the median step and peak memory. Each run is its own
process (points.in_fresh_process), interleaved with the other side's over rounds.
"""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from .. import config as cfgmod
from ..errors import TunelabError

KIND = "tunelab"
PEER = "trl-grpo"
METRICS = ("completions_per_s", "completion_tokens_per_s", "step_time_median_s", "peak_memory_bytes")


def rows_per_batch(cfg: cfgmod.TrainConfig) -> int:
    """Completions per generation batch: prompts (micro_batch x grad_accum) x G."""
    return cfg.batch.micro_batch * cfg.batch.grad_accum * cfg.objective.grpo.num_generations


def trl_grpo_args(cfg: cfgmod.TrainConfig) -> dict[str, Any]:
    """TRL GRPOConfig's settings for tunelab's `cfg`: equal completions per optimizer step and generation batch."""
    g, b = cfg.objective.grpo, cfg.batch
    weights = [r.weight for r in g.rewards]
    return dict(
        per_device_train_batch_size=b.micro_batch * g.num_generations,
        gradient_accumulation_steps=b.grad_accum,
        steps_per_generation=b.grad_accum,
        num_generations=g.num_generations,
        max_completion_length=g.max_completion_length,
        temperature=g.temperature,
        top_p=g.top_p,
        beta=g.beta,
        epsilon=g.epsilon,
        epsilon_high=g.clip_high,
        num_iterations=g.num_iterations,
        loss_type=g.loss_type,
        scale_rewards=g.scale_rewards,
        reward_weights=weights,
        learning_rate=cfg.optimizer.lr,
        max_grad_norm=cfg.optimizer.max_grad_norm,
        lr_scheduler_type="constant",
        warmup_steps=0,
        seed=cfg.run.seed,
        use_vllm=False,
        use_cpu=cfg.compute.device == "cpu",
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        log_completions=False,
        shuffle_dataset=True,
    )


def trl_reward(reward, fields: list[str]):
    """tunelab's reward as a TRL reward function: TRL's lists of row fields become rows, scored by rewards.score
    (the same call and checks as tunelab's run); NaN (a None from the function) goes back as None."""
    from ..train import rewards

    def fn(prompts, completions, completion_ids=None, **kwargs):
        rows = [{k: kwargs[k][i] for k in fields if k in kwargs} for i in range(len(completions))]
        ids = completion_ids or [[] for _ in completions]
        values = rewards.score([reward], prompts, completions, ids, rows, list(range(1, len(rows) + 1)))[:, 0]
        return [None if math.isnan(v) else v for v in values.tolist()]

    fn.__name__ = reward.name
    return fn


def _trl_callback(warmup: int, device):
    from transformers import TrainerCallback

    from ..device import synchronize

    class Window(TrainerCallback):
        """Step end times after `warmup` (a sync at each edge) and the logged completion lengths."""

        def __init__(self) -> None:
            self.times: list[float] = []
            self.lengths: dict[int, float] = {}

        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == warmup or state.global_step >= state.max_steps:
                synchronize(device)
            if state.global_step >= warmup:
                self.times.append(time.perf_counter())

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "completions/mean_length" in logs:
                self.lengths[state.global_step] = float(logs["completions/mean_length"])

    return Window()


# The record's own figures that the runs table keeps under `generation` (bench/store.py).
GENERATION_KEYS = (
    "completions_per_s",
    "completion_tokens_per_s",
    "completions_per_s_window",
    "completion_tokens_per_s_window",
    "completion_mean_length",
    "prompts_per_batch",
    "num_generations",
    "completions_per_step",
    "max_completion_length",
    "num_iterations",
    "beta",
    "loss_type",
    "lora",
)


def store_row(record: dict, cfg: cfgmod.TrainConfig, warmup: int) -> dict:
    """`record` (a run of either side) as a row of bench's results database (bench/store.py), where every bench
    record goes: the columns every point has, GRPO's own figures under `generation`, TRL's version beside them."""
    versions = record.get("versions") or {}
    return {
        "kind": record["kind"],
        "label": f"grpo {record['completions_per_step']} completions/step",
        "objective": cfg.objective.name,
        "device": record["device"],
        "torch_version": versions.get("torch"),
        "transformers_version": versions.get("transformers"),
        "peft_version": versions.get("peft"),
        "model": record["model"],
        "method": cfg.adapter.method,
        "precision": record["precision"],
        "micro_batch": cfg.batch.micro_batch,
        "grad_accum": cfg.batch.grad_accum,
        "seq_len": cfg.batch.seq_len,
        "packing": False,
        "grad_ckpt": cfg.compute.grad_ckpt,
        "warmup_steps": warmup,
        "steps": record.get("steady_window_steps"),
        "step_time_s": record.get("step_time_median_s"),
        "step_time_median_s": record.get("step_time_median_s"),
        "steady_window_s": record.get("steady_window_s"),
        "rate_basis": "median step",  # completions_per_s: bench/grpo_peer.window_rates
        "peak_memory_bytes": record.get("peak_memory_bytes"),
        "generation": {**{k: record[k] for k in GENERATION_KEYS if k in record}, "trl_version": versions.get("trl")},
        "config": cfgmod.to_dict(cfg),
    }


def window_rates(step_ends: list[float], lengths: list[float], rows: int, iterations: int, warmup: int) -> dict:
    """Rates over the window: `step_ends` are the end times of step `warmup` and every step after it, `lengths` the
    mean completion length each windowed step's generation batch had."""
    if len(step_ends) < 2:
        raise TunelabError(f"the GRPO run ended before its steady-state window (after {warmup} warm-up steps)")
    seconds = step_ends[-1] - step_ends[0]
    steps = len(step_ends) - 1
    per_step = rows / iterations  # completions generated per optimizer step
    mean_length = statistics.fmean(lengths) if lengths else float("nan")
    median = statistics.median(b - a for a, b in zip(step_ends, step_ends[1:]))
    return {
        # The headline from the median step: a shared machine that pauses a process (another job's exclusive
        # timing) adds its pause to one step, which the median leaves out and the window's total does not.
        "completions_per_s": per_step / median,
        "completion_tokens_per_s": per_step * mean_length / median,
        "completions_per_s_window": steps * per_step / seconds,
        "completion_tokens_per_s_window": sum(lengths) * per_step / seconds,
        "completion_mean_length": mean_length,
        "step_time_median_s": median,
        "steady_window_steps": steps,
        "steady_window_s": seconds,
    }


def run_trl_grpo(cfg: cfgmod.TrainConfig, steps: int, warmup: int) -> dict:
    """TRL's GRPOTrainer for `steps` optimizer steps (the first `warmup` unmeasured); its record."""
    from datasets import Dataset
    from transformers import set_seed
    from transformers.trainer_callback import PrinterCallback
    from trl import GRPOConfig, GRPOTrainer

    from .. import sources
    from ..data.pipeline import prepare
    from ..device import device_name, library_versions, pick_device, pick_precision
    from ..memwatch import MemoryWatch
    from ..model import load as mload
    from ..train import rewards
    from .peers import _lora_config

    dev = pick_device(cfg.compute.device)
    precision = pick_precision(cfg.compute.precision, dev)  # tunelab's: bf16 where the device has it
    memwatch = MemoryWatch(dev)
    memwatch.start()
    source = sources.resolve(cfg.model, cfg.trust_remote_code)
    tokenizer = sources.load_tokenizer(source)
    prompts = prepare(cfg.data_specs()[0], tokenizer)
    fields = sorted({k for row in prompts.rows for k in row} - {"prompt", "completion", "completion_ids"})
    data = Dataset.from_list(
        [{**{k: row.get(k) for k in fields}, "prompt": text} for row, text in zip(prompts.rows, prompts.texts)]
    )
    funcs = [trl_reward(r, fields) for r in rewards.load_all(cfg.objective.grpo.rewards)]
    set_seed(cfg.run.seed)
    model = mload.load_model(source, precision.compute, "none", dev)
    with tempfile.TemporaryDirectory(prefix="tunelab-peer-trl-grpo-") as out:
        args = GRPOConfig(
            output_dir=out,
            max_steps=steps,
            bf16=precision.name == "bf16",
            fp16=precision.name == "fp16",
            # The device tunelab resolved (`device: auto` on a CPU included): TRL refuses bf16 off a GPU without it.
            **{**trl_grpo_args(cfg), "use_cpu": dev.type == "cpu"},
        )
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=funcs,
            args=args,
            train_dataset=data,
            processing_class=tokenizer,
            peft_config=_lora_config(model, cfg.adapter.lora),
        )
        trainer.remove_callback(PrinterCallback)
        window = _trl_callback(warmup, dev)
        trainer.add_callback(window)
        trainer.train()
    lengths = [window.lengths.get(s, float("nan")) for s in range(warmup + 1, steps + 1)]
    g = cfg.objective.grpo
    rates = window_rates(window.times, lengths, rows_per_batch(cfg), g.num_iterations, warmup)
    return _record(PEER, cfg, precision.name, device_name(dev), rates, memwatch.read().peak_bytes, library_versions())


def _record(kind: str, cfg, precision: str, name: str, rates: dict, peak: int, versions: dict) -> dict:
    g = cfg.objective.grpo
    return {
        "kind": kind,
        "model": cfg.model,
        "device": name,
        "precision": precision,
        "prompts_per_batch": cfg.batch.micro_batch * cfg.batch.grad_accum,
        "num_generations": g.num_generations,
        "completions_per_step": rows_per_batch(cfg),
        "max_completion_length": g.max_completion_length,
        "num_iterations": g.num_iterations,
        "beta": g.beta,
        "loss_type": g.loss_type,
        "lora": dataclasses.asdict(cfg.adapter.lora),
        **rates,
        "peak_memory_bytes": peak,
        "versions": {k: versions.get(k) for k in ("torch", "transformers", "peft", "trl")},
        "timestamp": time.time(),
    }


def run_tunelab_grpo(cfg: cfgmod.TrainConfig, steps: int, warmup: int) -> dict:
    """tunelab's GRPO for `steps` optimizer steps; its record from metrics.jsonl's per-step `elapsed_s` (step time
    only, as TRL's window: no setup) and completion lengths."""
    from ..device import device_name, library_versions, pick_device, pick_precision
    from ..recipes import entry

    with tempfile.TemporaryDirectory(prefix="tunelab-grpo-bench-") as out:
        run_cfg = dataclasses.replace(
            cfg,
            batch=dataclasses.replace(cfg.batch, max_steps=steps),
            run=dataclasses.replace(cfg.run, save_steps=0, log_steps=1, resume=False, output_dir=out),
        )
        summary = entry.train(run_cfg, show_progress=False)
        records = [json.loads(line) for line in (Path(out) / "metrics.jsonl").read_text().splitlines()]
    ends = [r["elapsed_s"] for r in records if r["step"] >= warmup]
    if warmup == 0:
        ends = [0.0, *ends]
    lengths = [r["completions/mean_length"] for r in records if r["step"] > warmup]
    g = cfg.objective.grpo
    rates = window_rates(ends, lengths, rows_per_batch(cfg), g.num_iterations, warmup)
    dev = pick_device(cfg.compute.device)
    precision = pick_precision(cfg.compute.precision, dev).name
    return _record(KIND, cfg, precision, device_name(dev), rates, summary.peak_memory_bytes, library_versions())


def _in_child(kind: str, cfg, steps: int, warmup: int) -> dict:
    from ..libraries import quiet_libraries

    quiet_libraries()
    return run_trl_grpo(cfg, steps, warmup) if kind == PEER else run_tunelab_grpo(cfg, steps, warmup)


def grpo_rounds(cfg: cfgmod.TrainConfig, rounds: int, steps: int, warmup: int, log=print) -> list[dict]:
    """tunelab's GRPO and TRL's, interleaved `rounds` times, each in a fresh process; their records."""
    from .points import in_fresh_process

    if rounds < 1:
        raise TunelabError(f"--rounds must be at least 1, got {rounds}")
    records = []
    for round_ in range(1, rounds + 1):
        for kind in (KIND, PEER):
            log(f"[round {round_}/{rounds}] {kind}")
            records.append(in_fresh_process(_in_child, kind, cfg, steps, warmup))
    return records


def compare_grpo(records: list[dict]) -> list[dict]:
    """tunelab over TRL on each metric, from the means over their runs (a throughput ratio above 1: tunelab is
    faster; a memory ratio below 1: tunelab needs less)."""
    ours = [r for r in records if r["kind"] == KIND]
    theirs = [r for r in records if r["kind"] == PEER]
    if not ours or not theirs:
        raise TunelabError("compare: need both tunelab's and trl-grpo's runs")
    row: dict[str, Any] = {"kind": PEER, "runs": len(theirs), "tunelab_runs": len(ours)}
    for m in (*METRICS, "completion_mean_length"):
        mine, peer = statistics.fmean(r[m] for r in ours), statistics.fmean(r[m] for r in theirs)
        row[f"tunelab_{m}"], row[m] = mine, peer
        row[f"{m}_ratio"] = mine / peer if peer else float("nan")
    row["tunelab_completions_per_s_runs"] = [r["completions_per_s"] for r in ours]
    row["completions_per_s_runs"] = [r["completions_per_s"] for r in theirs]
    return [row]
