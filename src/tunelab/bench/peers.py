"""Peer recipes: the Hugging Face trainers users come from, run on the same model, data and machine as tunelab.

The Trainer recipes of the peers that bench/peer_registry.py lists (each one's row says what it needs, CUDA or a
package, checked before its recipe is set up), each configured the way its users write it, not weakened:

- `hf-trainer-seed`: the recipe of the seed repos (shared/seeds 000, 003): `transformers.Trainer` + PEFT LoRA
  r 8, alpha 32, dropout 0.05 on q_proj/v_proj, Alpaca prompt with the prompt masked, every example padded
  to 512 tokens, micro-batch 2 x grad-accum 4, fp16 AMP on a GPU (fp32 on CPU, which has no fp16 AMP),
  the Trainer's default AdamW.
- `hf-trainer-tuned`: what a careful Trainer user writes: dynamic padding (DataCollatorForSeq2Seq, batches
  grouped by length), bf16 where the device has it, micro-batch 16, tunelab's own LoRA settings, fused
  AdamW, no gradient checkpointing.
- `hf-trainer-liger`: `hf-trainer-tuned` with `use_liger_kernel=True` (Liger's Triton kernels: fused linear
  cross-entropy, RMSNorm, RoPE, SwiGLU). Only on CUDA with `liger-kernel` installed.
- `trl-sft`: TRL's `SFTTrainer` with its own packing (best-fit decreasing, which turns padding-free on),
  completion-only loss, tunelab's LoRA, micro-batch and seq_len. Only when `trl` is installed.
- `trl-dpo`: TRL's `DPOTrainer` on preference pairs (the `sigmoid` loss, the reference with the adapter disabled),
  tunelab's LoRA, `micro_batch` pairs per batch (padded to the longest, TRL's only mode since its padding-free
  path was withdrawn), each side cut at seq_len // 2 as tunelab cuts it. Tokens are counted on the policy's
  forward only (the reference forward, under no_grad, is not fed data of its own).

Every peer is measured with docs/metrics.md's definitions, the ones tunelab's loop uses: a forward pre-hook on
the model counts what each micro-batch feeds (padded, non-padding and loss tokens), and a `TrainerCallback`
times the steady-state window (optimizer steps after `warmup`) with a device synchronize at its edges. Peak
memory comes from a `MemoryWatch` started before the model loads.

`compare(records)` turns tunelab's and the peers' records into ratios (tunelab over peer).
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from .. import sources
from ..config import BatchConfig, DataConfig, LoraConfig, OptimizerConfig
from ..data.examples import IGNORE
from ..data.formats import render
from ..data.read import read_rows
from ..device import (
    Precision,
    device_memory_bytes,
    device_name,
    library_versions,
    pick_device,
    pick_precision,
    synchronize,
)
from ..errors import TunelabError
from ..memwatch import MemoryWatch
from ..model import load as mload
from ..model.adapters import resolve_targets
from ..train.loop import step_statistics
from . import peer_registry, store

# Formats whose rendering is one prompt followed by one trained response (or all trained, for `text`):
# the single prompt/completion split that Trainer recipes and TRL's prompt-completion datasets express.
PEER_FORMATS = ("alpaca", "completion", "text")


# The seed repos' LoRA (alpaca-lora defaults), fixed whatever tunelab's config says.
SEED_LORA = LoraConfig(r=8, alpha=32.0, dropout=0.05, targets=["q_proj", "v_proj"])
SEED_BATCH = BatchConfig(seq_len=512, micro_batch=2, grad_accum=4, packing=False)
TUNED_MICRO_BATCH = 16


@dataclass(frozen=True)
class PeerSetup:
    """What differs between peers; everything else (model, data, steps, lr, seed) is shared."""

    kind: str
    precision: Precision
    lora: LoraConfig
    batch: BatchConfig  # the peer's rows per step and their length (packing: TRL's padding-free rows)
    padding: str  # max_length | longest | padding-free
    precision_note: str = ""
    liger: bool = False


def setup_for(name: str, device: torch.device, lora: LoraConfig, batch: BatchConfig) -> PeerSetup:
    """The recipe of peer `name` on `device`. `lora` and `batch` are tunelab's, used where a peer copies them.
    What the peer needs (its registry row: CUDA, a package) is checked first."""
    refusal = peer_registry.get(name).refusal(str(device))
    if refusal:
        raise TunelabError(refusal)
    tuned = replace(batch, micro_batch=TUNED_MICRO_BATCH, grad_accum=1, packing=False)
    best = pick_precision("auto", device)  # bf16 on Ampere+ GPUs and AMX/AVX512-BF16 CPUs
    if name == "hf-trainer-seed":
        if device.type == "cuda":
            return PeerSetup(name, Precision("fp16"), SEED_LORA, SEED_BATCH, "max_length")
        return PeerSetup(
            name,
            Precision("fp32"),
            SEED_LORA,
            SEED_BATCH,
            "max_length",
            "the seed recipe asks for fp16; CPUs have no fp16 AMP, so fp32",
        )
    if name == "hf-trainer-tuned":
        return PeerSetup(name, best, lora, tuned, "longest")
    if name == "hf-trainer-liger":
        return PeerSetup(name, best, lora, tuned, "longest", liger=True)
    if name == "trl-sft":
        return PeerSetup(name, best, lora, replace(batch, packing=True), "padding-free")
    if name == "trl-dpo":
        return PeerSetup(name, best, lora, replace(batch, packing=False), "longest")
    raise TunelabError(
        f"peer {name} has no Trainer recipe here; it runs beside objective {peer_registry.get(name).objective}"
    )


def batch_tokens(
    input_ids: torch.Tensor, attention_mask: torch.Tensor | None, labels: torch.Tensor | None
) -> tuple[int, torch.Tensor, torch.Tensor]:
    """(tokens_padded, tokens_nonpad, tokens_loss) of one micro-batch as the model receives it.

    The two counts that read tensor values stay tensors on the batch's device, so counting adds no host sync
    on a GPU. Without an attention mask (TRL padding-free: sequences concatenated into one row) every position
    is a real token. Loss tokens are the labels the causal-LM loss uses after its shift: `labels[..., 1:]`.
    """
    padded = input_ids.numel()
    nonpad = attention_mask.sum() if attention_mask is not None else torch.tensor(padded, device=input_ids.device)
    loss = (labels[..., 1:] != IGNORE).sum() if labels is not None else torch.tensor(0, device=input_ids.device)
    return padded, nonpad, loss


class TokenMeter:
    """Forward pre-hook: adds every micro-batch's token counts to running totals (device tensors for two)."""

    def __init__(self) -> None:
        self.padded = 0
        self.nonpad: torch.Tensor | int = 0
        self.loss: torch.Tensor | int = 0

    def hook(self, module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        input_ids = kwargs.get("input_ids", args[0] if args else None)
        # A preference trainer's reference forward runs under no_grad on the same module: not data fed again.
        if input_ids is None or not module.training or not torch.is_grad_enabled():
            return
        padded, nonpad, loss = batch_tokens(input_ids, kwargs.get("attention_mask"), kwargs.get("labels"))
        self.padded += padded
        self.nonpad = self.nonpad + nonpad
        self.loss = self.loss + loss

    def totals(self) -> tuple[int, int, int]:
        """Current totals as ints: call only where a sync is acceptable (the window edges)."""
        return self.padded, int(self.nonpad), int(self.loss)


def _window_callback(meter: TokenMeter, device: torch.device, warmup: int):
    """A TrainerCallback timing the steady-state window; built here so `transformers` loads only when used."""
    from transformers import TrainerCallback

    class SteadyWindow(TrainerCallback):
        """Optimizer steps after `warmup`, timed with a sync at both edges; per-step times for the median."""

        def __init__(self) -> None:
            self.start: float | None = None
            self.end: float | None = None
            self.last = 0.0
            self.step_times: list[float] = []
            self.at_start = (0, 0, 0)
            self.at_end = (0, 0, 0)
            self.steps = 0

        def on_step_end(self, args, state, control, **kwargs):
            last_step = state.global_step >= state.max_steps
            if state.global_step == warmup or last_step:
                synchronize(device)
            now = time.perf_counter()
            if state.global_step == warmup:
                self.start, self.at_start = now, meter.totals()
            elif self.start is not None:
                # HF Trainer reads each micro-batch's loss on the host (its nan/inf filter), so host time at
                # step end is device time too; no extra sync is added that would slow the peer.
                self.step_times.append(now - self.last)
                self.steps += 1
            if last_step and self.start is not None:
                self.end, self.at_end = now, meter.totals()
            self.last = now

        def rates(self) -> dict[str, float]:
            if self.start is None or self.end is None or self.end <= self.start:
                raise TunelabError(
                    f"peer run ended before its steady-state window (after {warmup} warm-up steps); "
                    f"give more steps than warm-up steps"
                )
            seconds = self.end - self.start
            padded, nonpad, loss = (b - a for a, b in zip(self.at_start, self.at_end))
            return {
                "tokens_padded_per_s": padded / seconds,
                "tokens_nonpad_per_s": nonpad / seconds,
                "tokens_loss_per_s": loss / seconds,
                **step_statistics(self.step_times),
                "steady_window_steps": self.steps,
                "steady_window_s": seconds,
                "steady_tokens_padded": padded,
                "steady_tokens_nonpad": nonpad,
                "steady_tokens_loss": loss,
            }

    return SteadyWindow()


def prompt_and_response(fmt: str, template: str, row: dict[str, Any], eos: str) -> tuple[str, str]:
    """A row as (prompt, response) text through tunelab's own renderer, so peers see the exact same prompt."""
    if fmt not in PEER_FORMATS:
        raise TunelabError(f"peers support data formats {', '.join(PEER_FORMATS)}, not {fmt!r}")
    segments = render(fmt, template, row, eos)
    prompt = "".join(s.text for s in segments if not s.trainable)
    response = "".join(s.text for s in segments if s.trainable)
    return prompt, response


def tokenize_masked(tokenizer, prompt: str, response: str, seq_len: int, pad_to_max: bool) -> dict[str, list[int]]:
    """The Trainer recipes' tokenization: prompt + response, labels copied from the ids with the prompt masked.

    Seed recipes pad every example to `seq_len` here (padding labels masked too); tuned recipes leave padding
    to the collator.
    """
    full = tokenizer(
        prompt + response, truncation=True, max_length=seq_len, padding="max_length" if pad_to_max else False
    )
    prompt_len = len(tokenizer(prompt, truncation=True, max_length=seq_len)["input_ids"])
    labels = [
        tok if (i >= prompt_len and mask) else IGNORE
        for i, (tok, mask) in enumerate(zip(full["input_ids"], full["attention_mask"]))
    ]
    return {"input_ids": full["input_ids"], "attention_mask": full["attention_mask"], "labels": labels}


def _training_args(cls, setup: PeerSetup, device: torch.device, out: str, steps: int, lr: float, seed: int, **extra):
    """`cls` (TrainingArguments or TRL's SFTConfig) with the settings every peer shares, plus `extra`."""
    fields = {f.name for f in dataclasses.fields(cls)}
    kwargs: dict[str, Any] = dict(
        output_dir=out,
        max_steps=steps,
        per_device_train_batch_size=setup.batch.micro_batch,
        gradient_accumulation_steps=setup.batch.grad_accum,
        learning_rate=lr,
        seed=seed,
        fp16=setup.precision.name == "fp16",
        bf16=setup.precision.name == "bf16",
        # Logging every 10 steps, as the seed recipes do: each log reads the loss on the host.
        use_cpu=device.type == "cpu",
        logging_steps=10,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
    )
    kwargs.update(extra)
    # transformers 5 replaced `group_by_length=True` with `train_sampling_strategy="group_by_length"`.
    if kwargs.pop("group_by_length", False):
        if "train_sampling_strategy" in fields:
            kwargs["train_sampling_strategy"] = "group_by_length"
        else:
            kwargs["group_by_length"] = True
    return cls(**kwargs)


def _lora_config(model: torch.nn.Module, lora: LoraConfig):
    import peft

    return peft.LoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=resolve_targets(model, lora.targets),
        bias="none",
        task_type="CAUSAL_LM",
    )


def _build_trainer(
    setup: PeerSetup,
    model,
    tokenizer,
    rows,
    data: DataConfig,
    device: torch.device,
    out: str,
    steps: int,
    lr: float,
    seed: int,
):
    eos = tokenizer.eos_token or ""
    data_format, template = data.format, data.template
    if setup.kind == "trl-dpo":
        return _dpo_trainer(setup, model, tokenizer, rows, data, device, out, steps, lr, seed)
    if setup.kind == "trl-sft":
        from trl import SFTConfig, SFTTrainer

        def to_pair(row: dict[str, Any]) -> dict[str, str]:
            prompt, response = prompt_and_response(data_format, template, row, eos)
            return {"prompt": prompt, "completion": response}

        dataset = rows.map(to_pair, remove_columns=rows.column_names)
        args = _training_args(
            SFTConfig,
            setup,
            device,
            out,
            steps,
            lr,
            seed,
            max_length=setup.batch.seq_len,
            packing=True,
            padding_free=True,
            completion_only_loss=True,
            optim="adamw_torch_fused",
            dataloader_pin_memory=device.type == "cuda",
        )
        return SFTTrainer(
            model=model,
            args=args,
            train_dataset=dataset,
            processing_class=tokenizer,
            peft_config=_lora_config(model, setup.lora),
        )

    from peft import get_peft_model
    from transformers import DataCollatorForSeq2Seq, Trainer, TrainingArguments, default_data_collator

    seed_recipe = setup.kind == "hf-trainer-seed"

    def encode(row: dict[str, Any]) -> dict[str, list[int]]:
        prompt, response = prompt_and_response(data_format, template, row, eos)
        return tokenize_masked(tokenizer, prompt, response, setup.batch.seq_len, pad_to_max=seed_recipe)

    dataset = rows.map(encode, remove_columns=rows.column_names)
    model = get_peft_model(model, _lora_config(model, setup.lora))
    if seed_recipe:
        args = _training_args(TrainingArguments, setup, device, out, steps, lr, seed)
        collator = default_data_collator  # already padded to max_length
    else:
        # Workers and pinned memory help a GPU overlap loading with compute; on a CPU host the workers would
        # take cores from the matmuls, and collating a padded batch is microseconds.
        on_gpu = device.type == "cuda"
        args = _training_args(
            TrainingArguments,
            setup,
            device,
            out,
            steps,
            lr,
            seed,
            group_by_length=True,
            optim="adamw_torch_fused",
            dataloader_num_workers=2 if on_gpu else 0,
            dataloader_pin_memory=on_gpu,
            dataloader_persistent_workers=on_gpu,
            use_liger_kernel=setup.liger,
        )
        collator = DataCollatorForSeq2Seq(
            tokenizer, padding="longest", label_pad_token_id=IGNORE, pad_to_multiple_of=8 if on_gpu else None
        )
    return Trainer(model=model, args=args, train_dataset=dataset, data_collator=collator)


def _dpo_trainer(setup: PeerSetup, model, tokenizer, rows, data: DataConfig, device, out, steps, lr, seed):
    from trl import DPOConfig, DPOTrainer

    from ..data.formats import render_pair_side

    eos = tokenizer.eos_token or ""

    def to_triplet(row: dict[str, Any]) -> dict[str, str]:
        sides = {
            side: render_pair_side(data.format, data.template, row, side, eos, tokenizer)
            for side in ("chosen", "rejected")
        }
        prompt = "".join(s.text for s in sides["chosen"] if not s.trainable)
        return {"prompt": prompt, **{k: "".join(s.text for s in v if s.trainable) for k, v in sides.items()}}

    dataset = rows.map(to_triplet, remove_columns=rows.column_names)
    args = _training_args(
        DPOConfig,
        setup,
        device,
        out,
        steps,
        lr,
        seed,
        max_length=setup.batch.seq_len // 2,
        beta=0.1,
        optim="adamw_torch_fused",
        dataloader_pin_memory=device.type == "cuda",
    )
    return DPOTrainer(
        model=model,
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
        peft_config=_lora_config(model, setup.lora),
    )


def run_peer(
    name: str,
    model_ref: str,
    data: DataConfig,
    steps: int,
    warmup: int = 2,
    *,
    lora: LoraConfig | None = None,
    batch: BatchConfig | None = None,
    optimizer: OptimizerConfig | None = None,
    seed: int = 42,
    device: str = "auto",
) -> dict:
    """Train peer `name` for `steps` optimizer steps and return its benchmark record.

    `lora` and `batch` are tunelab's run sections: the tuned Trainer copies the LoRA and seq_len, TRL copies the
    LoRA and the batch, the seed recipe keeps its own; every peer reads `data` and the optimizer's lr. The record
    has the metric keys of tunelab's train summary (`tokens_*_per_s`, `step_time_s`, `peak_memory_bytes`, ...)
    plus `kind` = `name`.
    """
    if steps <= warmup:
        raise TunelabError(f"peer {name}: {steps} steps leave no steady-state window after {warmup} warm-up steps")
    dev = pick_device(device)
    lr = (optimizer or OptimizerConfig()).lr
    setup = setup_for(name, dev, lora or LoraConfig(), batch or BatchConfig())
    from transformers import set_seed
    from transformers.trainer_callback import PrinterCallback

    memwatch = MemoryWatch(dev)
    memwatch.start()  # before the model loads, as tunelab's train does
    source = sources.resolve(model_ref)
    tokenizer = sources.load_tokenizer(source)
    rows = read_rows(Path(data.path), "preference" if peer_registry.get(name).pairs else data.format, data.max_examples)
    set_seed(seed)
    model = mload.load_model(source, setup.precision.compute, "none", dev)
    out = tempfile.mkdtemp(prefix=f"tunelab-peer-{name}-")
    try:
        trainer = _build_trainer(setup, model, tokenizer, rows, data, dev, out, steps, lr, seed)
        trainer.remove_callback(PrinterCallback)  # tunelab bench prints its own lines
        meter = TokenMeter()
        window = _window_callback(meter, dev, warmup)
        trainer.add_callback(window)
        handle = trainer.model.register_forward_pre_hook(meter.hook, with_kwargs=True)
        try:
            trainer.train()
        finally:
            handle.remove()
        memory = memwatch.read()
        losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
        trainable = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
    finally:
        shutil.rmtree(out, ignore_errors=True)
    return {
        "kind": name,
        "model": model_ref,
        "method": "lora",
        "data_path": str(data.path),
        "device": device_name(dev),
        "device_memory_bytes": device_memory_bytes(dev),
        "precision": setup.precision.name,
        "precision_note": setup.precision_note,
        "micro_batch": setup.batch.micro_batch,
        "grad_accum": setup.batch.grad_accum,
        "seq_len": setup.batch.seq_len,
        "packing": setup.batch.packing,
        "padding": setup.padding,
        "grad_ckpt": False,
        "optim": trainer.args.optim,
        "lora": dataclasses.asdict(setup.lora),
        "params_trainable": trainable,
        "steps": trainer.state.global_step,
        "warmup_steps": warmup,
        **window.rates(),
        "peak_memory_bytes": memory.peak_bytes,
        "peak_memory_reserved_bytes": memory.peak_reserved_bytes,
        "peak_memory_absolute_bytes": memory.peak_absolute_bytes,
        "loss_first": losses[0] if losses else None,
        "loss_last": losses[-1] if losses else None,
        "versions": library_versions(),
        "timestamp": time.time(),
    }


# Record keys that are columns of bench's `runs` table under the same name (store.COLUMNS).
STORE_KEYS = (
    "kind",
    "device",
    "device_memory_bytes",
    "model",
    "method",
    "precision",
    "micro_batch",
    "grad_accum",
    "seq_len",
    "packing",
    "grad_ckpt",
    "tokens_padded_per_s",
    "tokens_nonpad_per_s",
    "tokens_loss_per_s",
    "step_time_s",
    "step_time_median_s",
    "step_time_p90_s",
    "step_time_max_s",
    "steady_window_s",
    "peak_memory_bytes",
    "peak_memory_reserved_bytes",
    "peak_memory_absolute_bytes",
)


def store_record(record: dict, label: str | None = None) -> dict:
    """A `run_peer` record as a row for `bench.store.insert`: shared columns by name, versions in the
    `*_version` columns, window steps in `steps`, and the recipe details with no column of their own
    (padding, optimizer, LoRA, precision note, TRL version, losses) in the `config` JSON column."""
    row = {k: record[k] for k in STORE_KEYS}
    row.update(
        {f"{lib}_version": record["versions"].get(lib) for lib in ("torch", "transformers", "peft", "accelerate")}
    )
    row.update(
        label=label or f"peer {record['kind']}",
        warmup_steps=record["warmup_steps"],
        steps=record["steady_window_steps"],
        rate_basis=store.RATE_BASIS,
    )
    row["config"] = {
        k: record[k]
        for k in ("padding", "optim", "lora", "precision_note", "data_path", "loss_first", "loss_last")
        if k in record
    }
    row["config"].update(total_steps=record["steps"], trl_version=record["versions"].get("trl"))
    return row
