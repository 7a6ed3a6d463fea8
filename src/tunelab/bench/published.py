"""`tunelab bench fit --published FILE`: plan against published runs of other stacks, uncalibrated (nothing is
fitted to them), and each stack's error against every row it can be held against (benchmarks/scripts/
published_dev.py writes the dated record of the same table).

Two forms of case file:
- tuned stacks (../shared/published-dev.yaml: torchtune, NeMo AutoModel): each case's model (catalog shapes, no
  weights), method, LoRA rank and targets, seq_len, micro-batch, accumulation, packing, checkpointing, compile,
  and what its notes state of the optimizer, the step in backward, activation offloading and the loss, as
  tunelab settings and memory parts (plan.job.Parts), predicted on the catalog GPU it names. torchtune's full
  fine-tuning is pure bf16 (`weights: bf16`). Documents fill their rows and every position has a target.
- HF Trainer + PEFT runs (benchmarks/plan-accuracy/published-hf-dev.yaml): each case's `hf` switches and lengths.

A published memory figure is compared with the figure it counts (memory.Figures): torchtune's README prints
`Peak Memory Active` (the allocator's active bytes: allocated); bench's HF rows are max_memory_allocated; a
card's capacity (`mem_is_capacity`) bounds the process from above and is not in the medians.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import yaml

from ..errors import TunelabError
from ..markdown import table

GIB = 2**30
# The dev set `tunelab bench fit --published` reads by default, from the repository's root.
DEV = "../shared/published-dev.yaml"
# How the cases name their GPU -> the catalog row predicted.
GPUS = {"RTX 4090": "rtx-4090", "A6000": "rtx-a6000", "A100": "a100-80gb", "H100 80GB SXM": "h100-sxm", "h200": "h200"}
# torchtune's module names -> Hugging Face's, which plan's architectures use.
MODULES = {"output_proj": "o_proj", "q_proj": "q_proj", "k_proj": "k_proj", "v_proj": "v_proj"}
MLP = ("gate_proj", "up_proj", "down_proj")
# What each stack's published memory figure counts (memory.FIGURE_KINDS), and where that is stated.
FIGURES = {
    # README 'Optimization flags': column 'Peak Memory Active (GiB)'; its 'Memory and training speed' table
    # says 'Peak Memory per GPU', logged by the same recipes (log_peak_memory_stats: active, alloc, reserved).
    "torchtune": "active",
    "HF Trainer + PEFT": "allocated",  # bench/peers.py: torch.cuda.max_memory_allocated
}
# Within this share a row counts as close (the targets: throughput >= 90%, memory >= 80% of rows).
WITHIN = 0.20


@dataclass
class Row:
    id: str
    stack: str
    gpu: str
    gpus: int
    conf: str
    settings: dict
    parts: dict
    tok_s: float | None = None
    published_tok_s: float | None = None
    tok_why: str = ""  # why the tokens/s is not held against plan; "" where it is
    mem_gib: float | None = None  # plan's figure of the kind published
    published_mem_gib: float | None = None
    mem_kind: str = ""
    mem_why: str = ""
    doubtful: bool = False
    process_gib: float = 0.0
    notes: list[str] = field(default_factory=list)

    @property
    def tok_error(self) -> float | None:
        return self.tok_s / self.published_tok_s - 1 if self.tok_s and self.published_tok_s else None

    @property
    def mem_error(self) -> float | None:
        return self.mem_gib / self.published_mem_gib - 1 if self.mem_gib and self.published_mem_gib else None

    def as_dict(self) -> dict:
        out = dict(self.__dict__)
        out.update(tok_error=self.tok_error, mem_error=self.mem_error)
        return out


def gpu_id(text: str) -> str:
    for key, gid in GPUS.items():
        if key in text:
            return gid
    raise TunelabError(f"GPU {text!r}: no catalog row for it in bench/published.py GPUS")


def _targets(case: dict) -> str | list[str]:
    text = str(case.get("lora_targets", ""))
    if "all linear" in text or "*_proj" in text:
        return "all-linear"
    listed = text.split("(")[0]  # what follows in parentheses is commentary ("no MLP, no output")
    names = [hf for tt, hf in MODULES.items() if tt in listed]
    return names + list(MLP) if "MLP" in listed else names


def _yes(text) -> bool:
    return str(text).lower().startswith(("yes", "true"))


def stack_of(case: dict) -> str:
    return str(case.get("stack", "HF Trainer + PEFT")).split(" (")[0]


def tuned_settings(case: dict) -> tuple[dict, dict]:
    """A tuned stack's case -> (tunelab settings, memory parts), from its fields and what its notes state."""
    from .. import methods

    text = " ".join(str(case.get(k, "")) for k in ("notes", "attn_compile", "precision"))
    s = {
        "model": case["model"],
        "method": case["method"],
        "seq_len": case["seq_len"],
        "micro_batch": case["micro_batch"],
        "grad_accum": case["grad_accum"],
        "packing": case["packing"] is not False,
        "grad_ckpt": _yes(case["grad_ckpt"]),
        "activation_offload": "activation offloading on" in text or "enable_activation_offloading=True" in text,
    }
    if str(case.get("attn_compile", "")).startswith("no compile"):
        s["compile"] = False
    elif "torch.compile on" in str(case.get("attn_compile", "")):
        s["compile"] = True
    row = methods.get(case["method"])
    if row.adapter:
        s["lora.r"] = case["lora_r"]
        s["lora.targets"] = _targets(case)
    parts: dict = {}
    if stack_of(case) == "torchtune":
        parts["pure_bf16"] = True  # `dtype: bf16`: the model, adapters and torch.optim's states in bf16
        if row.trains_base:
            s["weights"] = "bf16"  # torchtune's full fine-tuning: weights, gradients and states in bf16
        if "optimizer_in_bwd=True" in text:
            s["optimizer_in_backward"] = True
            s["max_grad_norm"] = 0.0  # torchtune skips clipping with the step in backward
        if "PagedAdamW8bit" in text:
            s["optimizer"] = "paged_adamw_8bit"
        if "CEWithChunkedOutputLoss" in text or "chunked cross-entropy" in text:
            parts["loss_kernel"] = "chunked_output"
        elif "standard cross-entropy" in text:
            parts["loss_kernel"] = "native"  # torch.nn.CrossEntropyLoss on the bf16 logits
    return s, parts


def estimate(settings: dict, parts: dict, gpu: str, gpus: int, examples: int, mean_tokens: float):
    """plan's prediction (what `tunelab plan` prints) of `settings` on catalog GPU `gpu`, every position a target."""
    from ..config import load_config
    from ..recipes.predict import PlanRequest, plan_config

    overrides = [f"{k}={','.join(v) if isinstance(v, list) else v}" for k, v in settings.items()]
    request = PlanRequest(
        gpu=gpu, gpus=gpus, examples=examples, mean_tokens=mean_tokens, loss_fraction=1.0, parts=dict(parts)
    )
    (r,) = plan_config(load_config(None, overrides), request)
    return r


def _tuned_row(case: dict) -> Row:
    settings, parts = tuned_settings(case)
    gid, gpus = gpu_id(case["gpu"]), case["gpus"]
    r = estimate(settings, parts, gid, gpus, 512 * gpus * case["micro_batch"] * case["grad_accum"], case["seq_len"])
    fitting = [m for m in r.multi if m.fits] or r.multi
    e = r.single if gpus == 1 else min(fitting, key=lambda m: m.time_s)
    stack = stack_of(case)
    kind = FIGURES.get(stack, "process")
    row = Row(case["id"], stack, gid, gpus, str(case.get("conf", "")), settings, parts)
    row.doubtful = "DOUBTFUL" in str(case.get("notes", ""))
    row.tok_s = e.speed.tokens_per_s / gpus
    row.published_tok_s = case.get("tok_s")
    row.mem_kind = kind
    row.mem_gib = e.figures.of(kind) / GIB
    row.process_gib = e.memory.total / GIB
    row.published_mem_gib = case.get("mem_gib")
    row.tok_why = _tok_why(case, e.fits)
    row.mem_why = _mem_why(case)
    return row


def _tok_why(case: dict, fits: bool) -> str:
    """Why a case's tokens/s cannot be held against plan's single-GPU step ('' where it can): the rules, the same
    for every case."""
    if not case.get("tok_s"):
        return "no per-GPU tokens/s published"
    if case["gpus"] > 1:
        return "multi-GPU (plan's sharding is not the stack's)"
    if "not disambiguated" in str(case["gpu"]):
        return "board ambiguous"
    if case["packing"] is False:
        return "unpacked rows padded per batch, lengths not published"
    if not fits:
        return "does not fit the GPU in plan"
    return ""


def _mem_why(case: dict) -> str:
    if case.get("mem_gib") is None:
        return "no memory published"
    if "not disambiguated" in str(case["gpu"]) or str(case.get("grad_ckpt")) == "unknown":
        return "board or checkpointing unknown"
    if case["packing"] is False:
        return "unpacked rows of unknown length"
    if "TP" in str(case.get("notes", "")) or "TP2" in str(case.get("stack", "")):
        return "tensor parallel"
    return ""


def hf_lengths(case: dict) -> np.ndarray:
    from .fit_data import synthetic_lengths

    text = case["lengths"]
    if text == "max_length":
        return np.full(64 * case["micro_batch"], case["seq_len"])
    return synthetic_lengths(json.loads(text.removeprefix("synthetic:")), case["seq_len"])


def hf_estimate(case: dict):
    """plan's estimate of an HF Trainer + PEFT case: its stack switches (`hf`), its rows' lengths, its GPU."""
    from ..config import AdapterConfig, BatchConfig, ComputeConfig, LoraConfig
    from ..methods import get
    from ..plan import hfstack, workload
    from ..plan.estimate import Job, estimate
    from ..recipes.predict import device_for
    from ..sources import resolve_arch

    method = get(case["method"])
    job = Job(
        adapter=AdapterConfig(method=method.name, base_quant=method.base_quant, lora=LoraConfig(r=case["lora_r"])),
        batch=BatchConfig(seq_len=case["seq_len"], micro_batch=case["micro_batch"], packing=False),
        compute=ComputeConfig(grad_ckpt=case["grad_ckpt"], compile=False),
        stack="hf-peft",
        hf=hfstack.parse(case.get("hf") or {})[0],
    )
    arr = hf_lengths(case)
    mean = float(arr.mean())
    lengths = workload.Lengths(len(arr), mean, mean * case.get("loss_fraction", 0.8), "case", arr)
    return estimate(resolve_arch(case["model"]), lengths, job, device_for(case["gpu"], "auto"))


def _hf_row(case: dict) -> Row:
    e = hf_estimate(case)
    capacity = bool(case.get("mem_is_capacity"))
    kind = "process" if capacity else FIGURES["HF Trainer + PEFT"]
    tokens = e.work.epoch.tokens_padded / e.work.epoch.micro_batches
    row = Row(case["id"], "HF Trainer + PEFT", case["gpu"], 1, str(case.get("conf", "")), dict(case["hf"]), {})
    if "step_s" in case:
        row.tok_s, row.published_tok_s = tokens / e.step.total, tokens / case["step_s"]
        row.notes.append("its step's masked-attention bytes per head-pair are fitted on the measured HF rows (in-fit)")
    else:
        row.tok_why = "no step time published"
    row.mem_kind = kind
    row.mem_gib = e.figures.of(kind) / GIB
    row.process_gib = e.memory.total / GIB
    row.published_mem_gib = case.get("mem_gib")
    if capacity:
        row.mem_why = "a card's capacity at the longest context that fitted: bounds the peak from above only"
    elif "mem_gib" not in case:
        row.mem_why = "ran out of memory (no peak)"
    return row


def load(path: Path) -> list[dict]:
    if not path.is_file():
        raise TunelabError(f"--published {path}: file not found; give a case file like {DEV}")
    try:
        cases = (yaml.safe_load(path.read_text()) or {}).get("cases")
    except yaml.YAMLError as e:
        raise TunelabError(f"--published {path}: not YAML ({str(e).splitlines()[0]})") from None
    if not isinstance(cases, list):
        raise TunelabError(f"--published {path}: no `cases:` list of published runs")
    return cases


def rows(paths: list[Path]) -> list[Row]:
    """Every case of every file, predicted."""
    out = []
    for path in paths:
        for case in load(path):
            try:
                out.append(_hf_row(case) if "hf" in case else _tuned_row(case))
            except (KeyError, TypeError) as e:
                raise TunelabError(
                    f"--published {path}: case {case.get('id', '?')}: missing or bad field {e}"
                ) from None
    return out


def _stats(errors: list[float]) -> dict:
    a = [abs(x) for x in errors]
    return {
        "rows": len(a),
        "median_abs": statistics.median(a) if a else None,
        "within_20": sum(x <= WITHIN for x in a) / len(a) if a else None,
    }


def summary(result: list[Row]) -> dict:
    """Per stack and over all: rows held, median |error|, share within 20%, for tokens/s and memory."""
    stacks = sorted({r.stack for r in result}) + ["all"]
    out = {}
    for stack in stacks:
        mine = [r for r in result if stack in ("all", r.stack)]
        tok = [r.tok_error for r in mine if not r.tok_why and r.tok_error is not None]
        mem = [r.mem_error for r in mine if not r.mem_why and r.mem_error is not None]
        out[stack] = {"tok": _stats(tok), "mem": _stats(mem)}
    sure = [r for r in result if not r.doubtful]
    out["all, DOUBTFUL rows left out"] = {
        "tok": _stats([r.tok_error for r in sure if not r.tok_why and r.tok_error is not None]),
        "mem": _stats([r.mem_error for r in sure if not r.mem_why and r.mem_error is not None]),
    }
    return out


def pct(x) -> str:
    return "" if x is None else f"{x:+.0%}"


def rows_table(result: list[Row]) -> list[str]:
    header = [
        "case",
        "stack",
        "GPU",
        "tok/s plan",
        "published",
        "error",
        "mem GiB plan",
        "published",
        "error",
        "not held",
    ]
    cells = []
    for r in result:
        why = "; ".join(x for x in (r.tok_why and "tok/s: " + r.tok_why, r.mem_why and "mem: " + r.mem_why) if x)
        cells.append(
            [
                r.id + (" (DOUBTFUL)" if r.doubtful else ""),
                r.stack,
                f"{r.gpus}x {r.gpu}",
                f"{r.tok_s:,.0f}" if r.tok_s else "",
                f"{r.published_tok_s:,.0f}" if r.published_tok_s else "",
                pct(r.tok_error),
                f"{r.mem_gib:.1f} ({r.mem_kind})" if r.mem_gib else "",
                f"{r.published_mem_gib}" if r.published_mem_gib else "",
                pct(r.mem_error),
                why,
            ]
        )
    return table(header, cells)


def summary_table(s: dict) -> list[str]:
    def cell(x: dict) -> list[str]:
        if not x["rows"]:
            return ["0", "", ""]
        return [str(x["rows"]), f"{x['median_abs']:.1%}", f"{x['within_20']:.0%}"]

    header = ["stack", "tok/s rows", "median abs error", "within 20%", "memory rows", "median abs error", "within 20%"]
    return table(header, [[k, *cell(v["tok"]), *cell(v["mem"])] for k, v in s.items()])
