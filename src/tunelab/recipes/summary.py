"""A run's summary (summary.json, and what every recipe's `train()` returns, the objective's whatever it is): every
field is a key of the file, in its order."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

# Present only when the run evaluated; best_step and best_eval_loss are always there (None without evaluation).
EVAL_ONLY = ("eval_examples", "eval_tokens_nonpad", "eval_tokens_loss", "eval_tokens_padded", "evaluations", "eval_s")
# Present only for an objective that samples its own completions (objectives.Objective.generates).
GENERATING_ONLY = ("reward_last",)


@dataclass(kw_only=True)
class RunSummary:
    output_dir: str
    model: str
    method: str
    objective: str
    base_quant: str
    nf4_layers: int
    device: str
    device_memory_bytes: int | None
    precision: str
    params_trainable: int
    params_total: int
    params_local: int
    seq_len: int
    micro_batch: int
    grad_accum: int
    packing: bool
    grad_ckpt: bool
    compile: dict | None  # runtime.CompileChoice.as_dict(): mode, chosen, why
    activation_offload: bool
    world_size: int
    # The data's statistics; a generating objective's: its prompts (`prompts`, `prompts_dropped`) and the
    # completions' cap (`response_tokens_max`, where `tunelab eval` caps its generation).
    data: dict
    steps: int
    total_steps: int
    schedule_steps: int | None  # where a schedule fitted to max_minutes ended (schedule_within_limit); None: not fitted
    finished: bool
    early_stopped: bool
    time_limited: bool  # ended by max_minutes before the schedule's end
    loss_first: float | None
    loss_last: float | None
    # Tokens fed (padding included), tokens that are not padding, tokens with loss. A generating objective's: the
    # update's padded rows, its prompts and completions, the completions' tokens.
    tokens_padded: int
    tokens_nonpad: int
    tokens_loss: int
    # Rates over the steady-state window (train/loop.LoopResult.rates).
    tokens_padded_per_s: float
    tokens_nonpad_per_s: float
    tokens_loss_per_s: float
    step_time_s: float
    step_time_median_s: float
    step_time_p90_s: float
    step_time_max_s: float
    steady_window_steps: int
    steady_window_s: float
    rate_window: str
    eval_examples: int | None = None
    eval_tokens_nonpad: int | None = None
    eval_tokens_loss: int | None = None
    eval_tokens_padded: int | None = None
    evaluations: int | None = None
    eval_s: float | None = None
    best_step: int | None = None
    best_eval_loss: float | None = None
    reward_last: float | None = None  # the last logged step's mean reward
    peak_memory_bytes: int
    peak_memory_reserved_bytes: int | None
    peak_memory_absolute_bytes: int
    train_s: float
    elapsed_s: float
    versions: dict

    def as_dict(self) -> dict:
        d = dataclasses.asdict(self)
        if self.eval_examples is None:
            for key in EVAL_ONLY:
                del d[key]
        for key in GENERATING_ONLY:
            if d[key] is None:
                del d[key]
        return d
