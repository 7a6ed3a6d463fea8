"""The Hugging Face Trainer + PEFT stack as plan models it: the choices an HF script makes, under their
`TrainingArguments` / `from_pretrained` names, and what each does to the step (docs/formulas.md, "The HF
Trainer + PEFT stack from its parts").

The choices that are tunelab settings too (`gradient_checkpointing`, `per_device_train_batch_size`, `bf16`,
`lora_dropout`, ...) stay the config's (config.HF_NAMES maps them); this spec holds only what tunelab's own run
has no setting for. What it changes:
- what is fed: padded to each batch's longest (`group_by_length` or random batches), to `max_length`, or
  padding-free (examples concatenated with position ids: DataCollatorWithFlattening), or packed (TRL's
  `packing=True` without position ids: rows of seq_len, causal over the whole row), or multipack (Axolotl's
  `sample_packing`, LLaMA-Factory's `neat_packing`: examples packed into bins of seq_len, micro-batch bins a step,
  kept apart by position ids);
- attention: `eager` computes and keeps the whole S x S scores per head (fp32 softmax), `sdpa` with a padding
  mask computes the whole padded rectangle, `flash_attention_2` unpads (varlen) and computes document-causal keys;
- the head: the whole-vocabulary logits over every fed position and their fp32 cross-entropy, unless
  `use_liger_kernel` (fused linear cross-entropy in chunks; fused RMSNorm, SwiGLU and RoPE) or
  `cut_cross_entropy` (Axolotl's Cut Cross Entropy plugin: the logits computed block by block, never stored);
- the optimizer: `optim`'s state bytes from tunelab's optimizer registry, and the unfused (foreach) AdamW's
  extra passes.
PEFT's LoRA is unfused (A, B, scale, add as separate kernels, dropout's copy kept): tunelab's eager LoRA terms.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from ..errors import TunelabError
from ..optimizers import HF_OPTIMS

ATTENTION = ("eager", "sdpa", "flash_attention_2")
PADDING = ("longest", "max_length", "padding_free", "packed", "multipack")
# The loss kernels plan prices (memory.loss_kernel_bytes): transformers' whole logits, tunelab's chunked head,
# Liger's fused linear cross-entropy, Cut Cross Entropy, torchtune's CEWithChunkedOutputLoss, and torch's
# cross-entropy over the whole logits in the compute dtype (torchtune's torch.nn.CrossEntropyLoss).
LOSS_KERNELS = ("whole", "chunked", "liger", "cce", "chunked_output", "native")
# TrainingArguments' `optim` -> (tunelab's optimizer row, fused step): optimizers.HF_OPTIMS.
OPTIMS = HF_OPTIMS
# Padded widths round up to this (the tuned recipe's DataCollatorForSeq2Seq pad_to_multiple_of=8).
PAD_MULTIPLE = 8


@dataclass(frozen=True)
class HfStack:
    """An HF Trainer + PEFT script's choices that tunelab's settings do not name (defaults: transformers')."""

    attn_implementation: str = "sdpa"  # ATTENTION
    padding: str = "longest"  # PADDING
    group_by_length: bool = False
    optim: str = "adamw_torch"  # OPTIMS
    use_liger_kernel: bool = False
    cut_cross_entropy: bool = False  # Apple's Cut Cross Entropy (Axolotl's plugin): no logits in memory
    # PEFT's prepare_model_for_kbit_training on a quantized base (what HF's QLoRA recipes call): fp32 embedding,
    # head and norms, so an fp32 residual stream. Read only where the base is quantized.
    prepare_model_for_kbit_training: bool = True

    def check(self) -> HfStack:
        for name, choices in (("attn_implementation", ATTENTION), ("padding", PADDING), ("optim", tuple(OPTIMS))):
            if getattr(self, name) not in choices:
                raise TunelabError(f"hf {name}={getattr(self, name)!r}: choose from {', '.join(choices)}")
        if self.padding == "padding_free" and self.attn_implementation != "flash_attention_2":
            raise TunelabError(
                f"hf padding=padding_free with attn_implementation={self.attn_implementation}: transformers keeps "
                "concatenated examples apart by position ids only in flash_attention_2; set it, or pad"
            )
        return self

    @property
    def optimizer(self) -> str:
        """tunelab's optimizer row whose state bytes `optim` keeps (optimizers.REGISTRY)."""
        return OPTIMS[self.optim][0]

    @property
    def fused_optimizer(self) -> bool:
        return OPTIMS[self.optim][1]

    @property
    def whole_vocab_logits(self) -> bool:
        """transformers' ForCausalLMLoss materialises the logits and their fp32 upcast; Liger's fused linear
        cross-entropy and Cut Cross Entropy never do."""
        return not (self.use_liger_kernel or self.cut_cross_entropy)

    @property
    def loss_kernel(self) -> str:
        """The loss's kernel as memory.loss_kernel_bytes names it."""
        if self.cut_cross_entropy:
            return "cce"
        return "liger" if self.use_liger_kernel else "whole"

    @property
    def padding_mask(self) -> bool:
        """Whether the batch carries a padding mask (padded rows), which takes sdpa off its GQA-aware path."""
        return self.padding in ("longest", "max_length")

    @property
    def masked_kernel(self) -> bool:
        """Attention over padded rows with transformers' 4D padding mask (sdpa's masked kernel, or eager's), not a
        causal path: its cost per head-pair is the stack's fitted part (catalog/fitted.yaml `stacks`)."""
        return self.attn_implementation != "flash_attention_2" and self.padding_mask

    @property
    def eager_attention(self) -> bool:
        return self.attn_implementation == "eager"

    def label(self, quantized: bool = True) -> str:
        """The choices as KEY=VALUE; the kbit preparation only where the base is quantized (it reads nothing else)."""
        names = [f.name for f in dataclasses.fields(self) if quantized or f.name != "prepare_model_for_kbit_training"]
        return ", ".join(f"{n}={getattr(self, n)}" for n in names)


# bench/peers.py's `hf-trainer-tuned`: transformers' default attention, padded to the longest of length-grouped
# batches, the fused AdamW; the recipe the measured HF rows (benchmarks/plan-accuracy/rows) ran.
TUNED_PEER = HfStack(group_by_length=True, optim="adamw_torch_fused")
# bench/peers.py's HF Trainer recipes plan models, each as its changes to TUNED_PEER (a measured row's `hf`).
PEERS = {"hf-trainer-tuned": "", "hf-trainer-liger": "use_liger_kernel=true"}
FIELDS = tuple(f.name for f in dataclasses.fields(HfStack))
BOOLS = tuple(f.name for f in dataclasses.fields(HfStack) if f.type in ("bool", bool))
# TrainingArguments names that `--hf` passes on to tunelab's own settings (config.HF_NAMES holds the rest).
PRECISION_FLAGS = {"bf16": "bf16", "fp16": "fp16"}
# TrainingArguments / from_pretrained names plan does not model for an HF script, and what to do instead.
NOT_MODELED = {
    "torch_compile": "plan models an HF script's eager blocks only; drop it",
    "load_in_4bit": "set the method instead (method=qlora)",
    "load_in_8bit": "set the base instead (base_quant=int8)",
}


def parse(items: list[str] | dict | None, base: HfStack | None = None) -> tuple[HfStack, list[str]]:
    """`--hf KEY=VALUE` items (or a mapping) -> (the spec, tunelab config overrides). A key of the spec sets it;
    a TrainingArguments name that is a tunelab setting (config.HF_NAMES) becomes that setting's override."""
    from ..config import HF_NAMES

    if isinstance(items, dict):
        pairs = list(items.items())
    else:
        pairs = [p for x in items or [] for p in (_read(x) if x.endswith((".yaml", ".yml")) else [_split(x)])]
    spec: dict = {}
    overrides: list[str] = []
    for key, value in pairs:
        if key in FIELDS:
            spec[key] = _bool(key, value) if key in BOOLS else str(value)
        elif key in PRECISION_FLAGS:
            if _bool(key, value):
                overrides.append(f"precision={PRECISION_FLAGS[key]}")
        elif key in NOT_MODELED:
            raise TunelabError(f"hf {key}: {NOT_MODELED[key]}")
        elif key in HF_NAMES and HF_NAMES[key] not in ("method", "base_quant"):
            text = str(value).lower() if isinstance(value, bool) else str(value)
            overrides.append(f"{HF_NAMES[key]}={text}")
        else:
            known = sorted(
                {*FIELDS, *PRECISION_FLAGS, *(k for k, v in HF_NAMES.items() if v not in ("method", "base_quant"))}
            )
            raise TunelabError(f"hf {key}: not a choice plan models; choose from {', '.join(known)}")
    return dataclasses.replace(base or HfStack(), **spec).check(), overrides


def _read(path: str) -> list[tuple[str, object]]:
    """A YAML file of TrainingArguments choices (`attn_implementation: sdpa`, ...), as `--hf FILE.yaml` gives."""
    from pathlib import Path

    import yaml

    try:
        found = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as e:
        raise TunelabError(
            f"--hf {path}: cannot read it ({e}); give a YAML mapping of TrainingArguments names"
        ) from None
    if not isinstance(found, dict):
        raise TunelabError(f"--hf {path}: expected a mapping of TrainingArguments names to values")
    return list(found.items())


def _split(item: str) -> tuple[str, str]:
    key, eq, value = item.partition("=")
    if not eq or not key.strip():
        raise TunelabError(f"--hf {item!r}: write KEY=VALUE, e.g. --hf attn_implementation=sdpa")
    return key.strip(), value.strip()


def _bool(key: str, value) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).lower()
    if text not in ("true", "false", "1", "0", "yes", "no"):
        raise TunelabError(f"hf {key}={value!r}: choose from true, false")
    return text in ("true", "1", "yes")


def alternatives(spec: HfStack) -> list[tuple[str, HfStack]]:
    """Single changes an HF script can make to `spec`, each as its `--hf` flags and the changed spec: the kernels
    and the feeding that plan prices differently (what `plan` suggests beside the script's own prediction)."""
    out = []
    if spec.attn_implementation != "flash_attention_2":
        out.append(("attn_implementation=flash_attention_2", {"attn_implementation": "flash_attention_2"}))
    if spec.padding != "padding_free":
        changes = {"padding": "padding_free", "attn_implementation": "flash_attention_2"}
        out.append(("padding=padding_free attn_implementation=flash_attention_2", changes))
    if not spec.use_liger_kernel:
        out.append(("use_liger_kernel=true", {"use_liger_kernel": True}))
    if spec.optim == "adamw_torch":
        out.append(("optim=adamw_torch_fused", {"optim": "adamw_torch_fused"}))
    return [(label, dataclasses.replace(spec, **changes)) for label, changes in out]


@dataclass(frozen=True)
class Fed:
    """What one epoch of the HF stack feeds, as plan's workload counts it."""

    tokens_padded: int  # fed positions, padding included
    widest_row: int  # the widest micro-batch's row width (what memory holds at the peak)
    micro_batches: int  # per epoch
    rows: int  # fed rows per epoch: examples, or packed rows
    keys_per_token: float  # keys a fed position's query meets in the attention kernel
    scored_keys_per_token: float  # of them, those whose scores are written out (eager)


def widths(lengths: np.ndarray, micro_batch: int, seq_len: int, grouped: bool, seed: int) -> np.ndarray:
    """Each micro-batch's padded width when padding to its longest: random batches (the Trainer's shuffled
    sampler) or, with group_by_length, batches of similar length (megabatches sorted by length), rounded up to
    PAD_MULTIPLE and cut at seq_len."""
    arr = np.minimum(np.asarray(lengths, dtype=np.int64), seq_len)
    order = np.random.default_rng([seed, 0]).permutation(len(arr))
    if grouped:  # HF's LengthGroupedSampler: megabatches of 50 micro-batches, sorted longest first
        mega = micro_batch * 50
        order = np.concatenate([sorted(order[i : i + mega], key=lambda j: -arr[j]) for i in range(0, len(order), mega)])
    longest = [arr[order[i : i + micro_batch]].max() for i in range(0, len(order), micro_batch)]
    return np.minimum(-(-np.array(longest) // PAD_MULTIPLE) * PAD_MULTIPLE, seq_len)


def fed(spec: HfStack, lengths: np.ndarray, micro_batch: int, seq_len: int, seed: int) -> Fed:
    """The epoch's fed positions and attention work under `spec`'s padding and attention (module docstring).
    Attention over padded rows: sdpa and eager with a padding mask compute the whole width for every query;
    flash_attention_2 unpads and computes each document's causal keys (as padding-free rows do)."""
    arr = np.minimum(np.asarray(lengths, dtype=np.float64), seq_len)
    rows = len(arr)
    batches = math.ceil(rows / micro_batch)
    if spec.padding == "packed":
        # TRL's `packing=True` without position ids: examples concatenated into rows of seq_len, one causal mask
        # over the whole row (no padding mask, so no repeat_kv either): every token meets (S + 1) / 2 keys.
        full = max(1, math.ceil(arr.sum() / seq_len))
        keys = (seq_len + 1) / 2
        return Fed(
            full * seq_len, seq_len, math.ceil(full / micro_batch), full, keys, keys if spec.eager_attention else 0.0
        )
    if spec.padding == "multipack":
        # Bins of seq_len filled with whole examples, micro_batch bins a micro-batch, position ids between them:
        # flash-attention's varlen kernel computes each document's causal keys; without it, the bin's whole square.
        full = max(1, math.ceil(arr.sum() / seq_len))
        if spec.attn_implementation == "flash_attention_2":
            keys = float((arr * (arr + 1) / 2).sum() / arr.sum())
        else:
            keys = (seq_len + 1) / 2
        scored = keys if spec.eager_attention else 0.0
        return Fed(round(float(arr.sum())), seq_len, math.ceil(full / micro_batch), full, keys, scored)
    if spec.padding == "padding_free":  # each micro-batch one row of its examples: memory at the fullest one
        w = None
        tokens = float(arr.sum())
        order = np.random.default_rng([seed, 0]).permutation(rows)
        fullest = max(arr[order[i : i + micro_batch]].sum() for i in range(0, rows, micro_batch))
        widest = math.ceil(fullest / micro_batch)
    elif spec.padding == "max_length":
        w = np.full(batches, seq_len, dtype=np.float64)
        tokens = float(rows * seq_len)
        widest = seq_len
    else:
        w = widths(arr, micro_batch, seq_len, spec.group_by_length, seed).astype(np.float64)
        per = np.full(batches, micro_batch, dtype=np.float64)
        per[-1] = rows - micro_batch * (batches - 1)
        tokens = float((w * per).sum())
        widest = int(w.max())
    if spec.attn_implementation == "flash_attention_2" or w is None:
        causal = float((arr * (arr + 1) / 2).sum() / arr.sum())
        keys = causal * float(arr.sum()) / tokens  # per fed position: padding computes nothing
        return Fed(round(tokens), widest, batches, rows, keys, 0.0)
    rect = float((w**2).sum() / w.sum())  # each fed query meets its row's whole width
    return Fed(round(tokens), widest, batches, rows, rect, rect if spec.eager_attention else 0.0)


def assumed_lengths(examples: int, mean_tokens: float) -> np.ndarray:
    """Equal lengths where no dataset is given (workload.assumed_lengths)."""
    return np.full(max(1, examples), max(1.0, mean_tokens))
