"""The sections of the training config, each a `kw_only` dataclass that declares its settings once and checks them
in its own `validate` (the objective's sections are in objective.py), and TrainConfig, the config made of them,
whose `validate` runs each section's and then the rules across sections (rules.py). Components take the sections
they need (`cfg.batch`, `cfg.adapter`, ...), never the whole config."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Union

from .. import hub, methods, optimizers
from ..errors import TunelabError
from ..modelref import EMBEDDED
from ..runtime import COMPILE_MODES, compile_mode
from . import rules
from .fields import (
    TARGET_PRESETS,
    Attention,
    BaseQuant,
    Bf16Update,
    Format,
    Method,
    OptimizerName,
    Precision,
    ReportTo,
    Scheduler,
    Template,
    Weights,
    cli,
    inline,
)
from .objective import ObjectiveConfig
from .origins import Origins, _check, _choice


@dataclass(kw_only=True)
class MixSource:
    """One source of data.mix: a file or hub dataset, its relative weight, its own format/template if any."""

    path: str | None = None
    weight: float = 1.0
    format: Format | None = None
    template: Template | None = None


@dataclass(kw_only=True)
class DataConfig:
    # A file, or a hub dataset `hf://owner/name[@revision][/subset][:split]`.
    path: str | None = None
    # Several sources drawn by weight instead of one path (data/pipeline.py: mix).
    mix: list[MixSource] = field(default_factory=list)
    format: Format = "alpaca"
    # Prompt template of the alpaca format; `compact` drops Alpaca's 30-token preamble.
    template: Template = "alpaca"
    train_on_inputs: bool = False
    max_examples: int | None = None

    @property
    def given(self) -> bool:
        """Whether the config names training data: data.path or data.mix."""
        return self.path is not None or bool(self.mix)

    def spec(self, seq_len: int, seed: int, builder: str, reserve: int = 0):
        """What the data pipeline reads (data/pipeline.DataSpec): this section with each mixture source's format and
        template resolved, rows cut at `seq_len`, a mixture drawn by `seed`, examples built by `builder` (the
        objective's data builder; `reserve` tokens of seq_len kept for generated completions). data/ sits below this
        module (config names its templates), so it takes a spec."""
        from ..data.pipeline import DataSpec, MixPart

        mix = tuple(MixPart(m.path, m.weight, m.format or self.format, m.template or self.template) for m in self.mix)
        return DataSpec(
            self.path,
            self.format,
            self.template,
            self.train_on_inputs,
            seq_len,
            self.max_examples,
            mix,
            seed,
            builder=builder,
            reserve=reserve,
        )

    @property
    def label(self) -> str:
        """The training data in a message: its path, or the mixture's sources and weights."""
        if not self.mix:
            return str(self.path)
        return "mix of " + ", ".join(f"{m.path} (weight {m.weight:g})" for m in self.mix)

    def validate(self, where: Origins) -> None:
        if self.format != "alpaca" and self.template != "alpaca":
            raise TunelabError(
                f"{where('data.template', 'data.format')}: data.template applies to the alpaca format only; "
                f"drop it for {self.format!r}"
            )
        if self.max_examples is not None:
            _check(where, "data.max_examples", self.max_examples >= 1, "must be at least 1")
        if self.path is not None and self.mix:
            raise TunelabError(
                f"{where('data.path', 'data.mix')}: data.path and data.mix are exclusive; "
                "train on one source or list them all under data.mix"
            )
        if hub.is_hub_data(self.path):
            hub.parse_data(self.path, f"{where('data.path')}: data.path")
        for i, part in enumerate(self.mix):
            name = f"data.mix[{i}]"
            if not part.path:
                raise TunelabError(
                    f"{where(f'{name}.path')}: {name}.path is missing; each source needs a file or hf://owner/name"
                )
            if hub.is_hub_data(part.path):
                hub.parse_data(part.path, f"{where(f'{name}.path')}: {name}.path")
            _check(where, f"{name}.weight", part.weight > 0, f"must be positive, got {part.weight:g}")
            fmt = part.format or self.format
            # `alpaca`, data.template's default, is accepted with any format, as at the top level.
            if part.template is not None and fmt != "alpaca" and part.template != "alpaca":
                at = where(f"{name}.template", f"{name}.format", "data.format")
                raise TunelabError(f"{at}: {name}.template applies to the alpaca format only; drop it for {fmt!r}")


@dataclass(kw_only=True)
class LoraConfig:
    r: int = cli(16)
    alpha: float = 32.0
    dropout: float = 0.0
    # A list of module names, or one of TARGET_PRESETS.
    targets: Union[list[str], str] = "all-linear"
    # Mixture-of-Experts models: train the routers too (saved whole beside the adapter); frozen by default.
    router: bool = False

    def validate(self, where: Origins) -> None:
        if isinstance(self.targets, str):
            _choice(where, "lora.targets", self.targets, TARGET_PRESETS)
        elif not self.targets:
            raise TunelabError(
                f"{where('lora.targets')}: lora.targets is empty; name modules (e.g. [q_proj, v_proj]) or a preset"
            )
        _check(where, "lora.r", self.r >= 1, f"must be at least 1, got {self.r}")
        _check(
            where,
            "lora.alpha",
            self.alpha > 0,
            f"must be positive (the adapter's scale is alpha / r), got {self.alpha}",
        )
        _check(where, "lora.dropout", 0 <= self.dropout < 1, f"must be in [0, 1), got {self.dropout}")


@dataclass(kw_only=True)
class AdapterConfig:
    """What trains: the method (methods.py's registry), the frozen base's quantization, the LoRA shape."""

    method: Method = cli("lora")
    # Quantization of the frozen base: qlora implies nf4; goat-style recipes use int8 under plain LoRA.
    base_quant: BaseQuant = "none"
    # The trained weights' dtype under full fine-tuning: fp32 master weights, or bf16 (half the bytes, and no
    # fp32 residual stream), updated as optimizer.bf16_update says.
    weights: Weights = cli("fp32")
    lora: LoraConfig = field(default_factory=LoraConfig)

    @property
    def row(self) -> methods.Method:
        return methods.get(self.method)

    @property
    def quant(self) -> str:
        """The base's quantization the run uses: the method's own (qlora: nf4), else base_quant as given."""
        return methods.effective_base_quant(self.method, self.base_quant)

    def validate(self, where: Origins) -> None:
        self.lora.validate(where)
        if self.base_quant in self.row.refused_base_quants:
            raise TunelabError(f"{where('base_quant', 'method')}: {self.row.refusal}")
        if self.weights != "fp32" and not self.row.trains_base:
            raise TunelabError(
                f"{where('weights', 'method')}: weights: {self.weights} applies to method full (adapters train in "
                "fp32 over the frozen base); drop weights"
            )


@dataclass(kw_only=True)
class EvalConfig:
    # Held-out rows: a fraction of data.path (chosen by `seed`, never trained on) or a file of its own.
    split: float | None = None
    path: str | None = None
    # Optimizer steps between evaluations; null evaluates at each save_steps checkpoint. Always at the end.
    steps: int | None = None
    # Evaluate at most this many held-out examples; a split still holds out its whole fraction.
    max_rows: int | None = None
    early_stopping_patience: int | None = None
    keep_best: bool = True

    @property
    def enabled(self) -> bool:
        return self.split is not None or self.path is not None

    def spec(self, seed: int):
        """The held-out data the pipeline splits off or reads (data/pipeline.HeldOutSpec), or None without any."""
        from ..data.pipeline import HeldOutSpec

        return HeldOutSpec(self.split, self.path, self.max_rows, seed) if self.enabled else None

    def every(self, save_steps: int) -> int:
        """Optimizer steps between evaluations: eval.steps, else the run's save_steps (0: only at the end)."""
        return self.steps if self.steps is not None else save_steps

    def validate(self, where: Origins) -> None:
        if self.split is not None and self.path is not None:
            raise TunelabError(
                f"{where('eval.split', 'eval.path')}: eval.split and eval.path are exclusive; "
                "hold out a fraction or name a file, not both"
            )
        if self.split is not None:
            _check(
                where,
                "eval.split",
                0 < self.split <= 0.5,
                f"must be in (0, 0.5] (the fraction of data.path held out), got {self.split}",
            )
        if hub.is_hub_data(self.path):
            hub.parse_data(self.path, f"{where('eval.path')}: eval.path")
        for name, value in (
            ("eval.steps", self.steps),
            ("eval.max_rows", self.max_rows),
            ("eval.early_stopping_patience", self.early_stopping_patience),
        ):
            if value is not None:
                _check(where, name, value >= 1, f"must be at least 1 (or null), got {value}")
                if not self.enabled:
                    raise TunelabError(
                        f"{where(name)}: {name} needs held-out data; set eval.split (e.g. 0.1) or eval.path"
                    )


@dataclass(kw_only=True)
class BatchConfig:
    """How the data is cut into steps: row length, rows per micro-batch and per optimizer step, how long."""

    seq_len: int = cli(512)
    micro_batch: int = cli(8)
    grad_accum: int = cli(1)
    epochs: float = cli(1.0)
    max_steps: int | None = None
    packing: bool = cli(True)

    def validate(self, where: Origins) -> None:
        _check(where, "seq_len", self.seq_len >= 8, f"must be at least 8, got {self.seq_len}")
        for name in ("micro_batch", "grad_accum"):
            value = getattr(self, name)
            _check(where, name, value >= 1, f"must be at least 1, got {value}")
        _check(where, "epochs", self.epochs > 0, f"must be positive, got {self.epochs}")
        if self.max_steps is not None:
            _check(
                where,
                "max_steps",
                self.max_steps >= 1,
                f"must be at least 1 (or null for a full run), got {self.max_steps}",
            )


@dataclass(kw_only=True)
class OptimizerConfig:
    lr: float = 2e-4
    lr_scheduler: Scheduler = "cosine"
    warmup_ratio: float = 0.03
    weight_decay: float = 0.0
    max_grad_norm: float = cli(1.0)
    # optimizers.py's registry: adamw, adamw_8bit and paged_adamw_8bit (bitsandbytes), adafactor.
    optimizer: OptimizerName = cli("adamw")
    # Update each parameter in its gradient hook and free its gradient (train/optim.py): no whole-model gradient
    # buffer. Needs grad_accum 1 and max_grad_norm 0 (no gradient norm exists before the updates).
    optimizer_in_backward: bool = cli(False)
    # How an update is written to bf16 weights (weights: bf16): stochastic rounding, a Kahan compensation buffer
    # (2 more bytes per parameter), or nearest (plain rounding: small updates are lost).
    bf16_update: Bf16Update = "stochastic"

    @property
    def row(self) -> optimizers.Optimizer:
        return optimizers.get(self.optimizer)

    def validate(self, where: Origins) -> None:
        _check(where, "lr", self.lr > 0, f"must be positive, got {self.lr}")
        _check(where, "weight_decay", self.weight_decay >= 0, f"must be 0 or positive, got {self.weight_decay}")
        _check(
            where,
            "max_grad_norm",
            self.max_grad_norm >= 0,
            f"must be positive, or 0 for no clipping; got {self.max_grad_norm}",
        )
        _check(where, "warmup_ratio", 0 <= self.warmup_ratio < 1, f"must be in [0, 1), got {self.warmup_ratio}")


@dataclass(kw_only=True)
class ComputeConfig:
    """Where and how the step computes: device, precision, and the speed/memory levers that change no result."""

    precision: Precision = cli("auto")
    device: str = "auto"
    grad_ckpt: bool = cli(False)
    # torch.compile each decoder block (recipes/finetune.py: compile_blocks): fused element-wise passes. `auto`
    # compiles when plan predicts the one-off compile is paid back within the run (runtime.compile_choice).
    compile: Union[bool, str] = "auto"
    # Keep the activations saved for backward in pinned host memory instead of the device's (model/offload.py):
    # long sequences on one GPU, at the cost of a copy each way per layer.
    activation_offload: bool = False
    # Packed-row attention (model/attention.py): auto is flex on CUDA (flash-attn's varlen kernels where
    # installed) and per-sequence slots on CPU; sdpa is transformers' own, with a block-diagonal mask.
    attention: Attention = "auto"

    def __post_init__(self) -> None:
        # compile is a bool (YAML true/false force it) or auto: the words true and false (a quoted YAML value, a
        # keyword argument) are the booleans, normalised where the section is made so that validate() only checks.
        self.compile = {"true": True, "false": False}.get(compile_mode(self.compile), self.compile)

    def validate(self, where: Origins) -> None:
        _choice(where, "compile", compile_mode(self.compile), COMPILE_MODES)


@dataclass(kw_only=True)
class MoeConfig:
    """Mixture-of-Experts models' settings (families.MOE_FAMILIES); a dense model takes none of them."""

    # The most loaded expert's tokens over the mean expert's, which sets the expert part's step time in plan
    # (plan/steptime.py): 1 is uniform routing, the assumption; a run's measured load replaces it.
    imbalance: float = cli(
        1.0, "an MoE model's most loaded expert's tokens over the mean's, at least 1 (default 1: uniform)"
    )

    def validate(self, where: Origins) -> None:
        _check(
            where,
            "moe.imbalance",
            1 <= self.imbalance < math.inf,
            f"must be at least 1 (the most loaded expert over the mean one), got {self.imbalance}",
        )


@dataclass(kw_only=True)
class RunConfig:
    """Where the run writes, how often, how long at most, and its seed."""

    output_dir: str = "runs/default"
    resume: Union[bool, str] = False
    seed: int = 42
    save_steps: int = 0
    save_total_limit: int = 2
    log_steps: int = 10
    # Training time allowed, over every resume of the run (0: none). The run ends, and saves as a finished run,
    # after the last optimizer step that its mean step time says still ends within it: a run sized by a
    # prediction keeps a wall-clock budget when the machine is slower than predicted.
    max_minutes: float = 0.0
    # With max_minutes: once the warm-up steps are done, and after every step from then on, the run and its
    # learning-rate schedule end at the last step that the measured pace says fits, so the schedule decays within
    # the limit instead of being cut mid-way (train/loop.ScheduleToLimit); give the run more data than the limit holds.
    schedule_within_limit: bool = False
    # Also send metrics.jsonl's records to an experiment tracker (train/trackers.py).
    report_to: ReportTo = "none"

    def validate(self, where: Origins) -> None:
        for name in ("save_total_limit", "log_steps"):
            value = getattr(self, name)
            _check(where, name, value >= 1, f"must be at least 1, got {value}")
        _check(
            where, "seed", 0 <= self.seed < 2**32, f"must be in [0, 2**32), as numpy's generators need; got {self.seed}"
        )
        _check(where, "output_dir", bool(self.output_dir.strip()), "is empty; name the folder the run writes to")
        _check(where, "save_steps", self.save_steps >= 0, "must be 0 (only the final save) or positive")
        _check(
            where,
            "max_minutes",
            0 <= self.max_minutes < math.inf,
            f"must be 0 (no limit) or a positive number of minutes, got {self.max_minutes}",
        )
        _check(
            where,
            "schedule_within_limit",
            not self.schedule_within_limit or self.max_minutes > 0,
            "fits the schedule to max_minutes, which is not set; set max_minutes or drop it",
        )


@dataclass(kw_only=True)
class TrainConfig:
    model: str = cli(
        EMBEDDED,
        "catalog model (meta-llama/Llama-3.1-8B or its short id llama-3.1-8b), hub id, local directory or .gguf",
    )
    # Let transformers import Python files shipped with the model (custom architectures). That code runs with
    # the user's permissions, so only a config that names a model it trusts turns this on.
    trust_remote_code: bool = False
    adapter: AdapterConfig = inline(default_factory=AdapterConfig)
    objective: ObjectiveConfig = inline(default_factory=ObjectiveConfig)
    data: DataConfig = field(default_factory=DataConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    batch: BatchConfig = inline(default_factory=BatchConfig)
    optimizer: OptimizerConfig = inline(default_factory=OptimizerConfig)
    compute: ComputeConfig = inline(default_factory=ComputeConfig)
    moe: MoeConfig = field(default_factory=MoeConfig)
    run: RunConfig = inline(default_factory=RunConfig)

    def data_specs(self):
        """(the training data's spec, the held-out data's or None), as data/pipeline.prepare_split takes them."""
        row = self.objective.row
        reserve = self.objective.grpo.max_completion_length if row.generates else 0
        spec = self.data.spec(self.batch.seq_len, self.run.seed, row.data_builder, reserve)
        return spec, self.eval.spec(self.run.seed)

    def validate(self, where: Origins | str = "config") -> None:
        """Every check that needs no model or data: each section's own, then the rules across sections, each
        error named by the origin of the setting it is about (`where`, or a file name for all settings)."""
        if isinstance(where, str):
            where = Origins(where)
        for f in dataclasses.fields(self):
            section = getattr(self, f.name)
            if dataclasses.is_dataclass(section):
                section.validate(where)
        rules.check(self, where)
