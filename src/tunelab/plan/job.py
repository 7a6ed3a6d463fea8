"""What plan reads of a training config: its sections, as config/ declares and validates them, plus the one
choice that is plan's own (the stack it predicts). plan copies no setting; a variant is `job.but(key=value)`
with the key a user writes."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from .. import methods, objectives, optimizers
from ..config import (
    AdapterConfig,
    BatchConfig,
    ComputeConfig,
    MoeConfig,
    ObjectiveConfig,
    OptimizerConfig,
    RunConfig,
    TrainConfig,
    published,
)
from ..errors import TunelabError
from .hfstack import LOSS_KERNELS, HfStack


@dataclass(frozen=True)
class Stack:
    """What plan models of a training stack's step beyond the config's settings."""

    name: str
    # Whether the stack's step is the HF Trainer + PEFT one, its choices an HfStack spec (plan/hfstack.py): the
    # head over every fed position, padded or padding-free feeding, HF's attention, PEFT's unfused LoRA, never
    # compiled blocks; else tunelab's own step from the config alone.
    hf: bool = False
    description: str = ""


# `hf-peft`: an HF Trainer + PEFT script, its choices under their TrainingArguments names (`--hf KEY=VALUE`).
STACK_ROWS = {
    "tunelab": Stack("tunelab", description="tunelab's own run of this config"),
    "hf-peft": Stack("hf-peft", hf=True, description="the HF Trainer + PEFT script with the same settings"),
}
STACKS = tuple(STACK_ROWS)


@dataclass(frozen=True)
class Parts:
    """What another tool's run does to memory that tunelab's settings do not name, each priced by its own term
    (plan/memory.py; docs/formulas.md, "Memory from its parts"): set by `plan --from`'s readers, defaults tunelab's."""

    loss_kernel: str = ""  # hfstack.LOSS_KERNELS; "": the stack's own (tunelab's chunked head, the HF spec's)
    ckpt_every: int = 1  # with grad_ckpt, one decoder layer in every N checkpointed (torchtune's selective ac_option)
    zero_stage: int = 0  # DeepSpeed ZeRO's stage on one GPU (its buffers, memory.zero_buffer_bytes); 0: none
    double_quant: bool = True  # an NF4 base's absmaxes quantized again (bnb_4bit_use_double_quant)
    gptq_bits: int = 0  # a GPTQ base of these bits (memory.gptq_bytes) in place of NF4; 0: none
    # Every trained tensor, its gradient and its torch.optim states in bf16 (torchtune's `dtype: bf16` builds the
    # model, LoRA's adapters included, in bf16, and torch.optim keeps states in the parameter's dtype).
    pure_bf16: bool = False

    def check(self) -> Parts:
        if self.loss_kernel and self.loss_kernel not in LOSS_KERNELS:
            raise TunelabError(f"loss kernel {self.loss_kernel!r}: choose from {', '.join(LOSS_KERNELS)}")
        if self.ckpt_every < 1:
            raise TunelabError(f"checkpointing every {self.ckpt_every} layers: must be 1 or more")
        if self.zero_stage not in (0, 1, 2, 3):
            raise TunelabError(f"DeepSpeed ZeRO stage {self.zero_stage}: one of 0, 1, 2, 3")
        return self

    def label(self) -> str:
        """The parts that differ from tunelab's own, as KEY=VALUE (empty when none does)."""
        default = Parts()
        return ", ".join(
            f"{f.name}={getattr(self, f.name)}"
            for f in dataclasses.fields(self)
            if getattr(self, f.name) != getattr(default, f.name)
        )


@dataclass(frozen=True, kw_only=True)
class Job:
    adapter: AdapterConfig = field(default_factory=AdapterConfig)
    objective: ObjectiveConfig = field(default_factory=ObjectiveConfig)
    batch: BatchConfig = field(default_factory=BatchConfig)
    compute: ComputeConfig = field(default_factory=ComputeConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    run: RunConfig = field(default_factory=RunConfig)
    moe: MoeConfig = field(default_factory=MoeConfig)
    eval_every: int = 0  # optimizer steps between evaluations (EvalConfig.every); used when lengths hold some out
    stack: str = "tunelab"  # STACKS
    hf: HfStack | None = None  # the HF script's choices where the stack row is HF's (Stack.hf), else None
    parts: Parts = field(default_factory=Parts)  # another tool's memory parts (plan --from), else tunelab's

    @classmethod
    def of(cls, cfg: TrainConfig, stack: str = "tunelab", hf: HfStack | None = None, parts: Parts | None = None) -> Job:
        return cls(
            adapter=cfg.adapter,
            objective=cfg.objective,
            batch=cfg.batch,
            compute=cfg.compute,
            optimizer=cfg.optimizer,
            run=cfg.run,
            moe=cfg.moe,
            eval_every=cfg.eval.every(cfg.run.save_steps),
            stack=stack,
            hf=(hf or HfStack()) if STACK_ROWS[stack].hf else None,
            parts=(parts or Parts()).check(),
        )

    def but(self, **changes) -> Job:
        """This job with settings changed, each named by its config key (`micro_batch=4`, `method="qlora"`)."""
        keys = published()
        sections: dict[str, dict] = {}
        own = {}
        for name, value in changes.items():
            if name in ("eval_every", "stack", "hf", "parts"):
                own[name] = value
                continue
            section, attr = keys[name]
            sections.setdefault(section, {})[attr] = value
        for section, values in sections.items():
            own[section] = dataclasses.replace(getattr(self, section), **values)
        return dataclasses.replace(self, **own)

    @property
    def stack_row(self) -> Stack:
        return STACK_ROWS[self.stack]

    def head_positions(self, fed: float, targets: float) -> float:
        """Positions per micro-batch the head and the loss run over: every fed one (padding included) under the HF
        stack (transformers' loss and Liger's fused one both take the whole sequence), else only those with a
        target (tunelab's gathered head)."""
        return fed if self.hf is not None else targets

    @property
    def whole_vocab_logits(self) -> bool:
        """The whole logits and their fp32 cross-entropy at once (transformers' ForCausalLMLoss: `logits.float()`),
        instead of a chunked head."""
        return self.hf is not None and self.hf.whole_vocab_logits

    @property
    def method(self) -> methods.Method:
        return self.adapter.row

    @property
    def optim(self) -> optimizers.Optimizer:
        return self.optimizer.row

    @property
    def weight_bytes(self) -> int:
        """Bytes of each trained weight (and of its gradient): fp32 master weights, or bf16 (`weights: bf16`, or
        another tool's pure bf16: Parts.pure_bf16)."""
        return 2 if self.method.trains_base and self.adapter.weights == "bf16" or self.parts.pure_bf16 else 4

    @property
    def goal(self) -> objectives.Objective:
        return self.objective.row

    @property
    def compiled(self) -> bool:
        """Whether blocks compile: `compile: auto` is resolved by estimate() before any formula reads this."""
        return self.compute.compile is True
