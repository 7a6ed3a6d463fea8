"""The memory parts that need CUDA, measured beside plan's pure functions (issue 69; benchmarks/gpu.sh step
`memory-parts`): one JSON line per measurement, printed and written to --out.

    python benchmarks/scripts/memory_parts.py [--dry-run] [--out FILE]

- context: the device memory a process holds with nothing allocated (CUDA context, cuBLAS handle and workspace
  after one matmul): torch.cuda.mem_get_info's used bytes, against memory.CUDA_CONTEXT_BYTES;
- loss kernels: one head + loss forward and backward over P positions of a V-wide vocabulary, its peak allocated
  above the inputs (hidden states, head weight), for transformers' whole logits, torchtune's chunked output
  (eager and compiled), and Liger's and Cut Cross Entropy's fused kernels where installed, against
  memory.loss_kernel_bytes;
- dequantization scratch: a bitsandbytes NF4 linear's forward and backward, peak allocated above its input,
  output and packed weight, against memory.dequant_scratch_bytes for that one linear;
- allocated / reserved / process of a training run: `tunelab bench run` of the 1B LoRA row (max_memory_allocated
  and max_memory_reserved), process = reserved + the context measured above, beside plan's figures; and the same
  of a run of varied rows (`figures-varied`: unpacked, padded per batch, truncated at seq_len 1024), whose reserved
  figure holds the caching allocator's blocks cut for narrower batches (memory.varied_reserve_bytes).

`--dry-run` runs every part on the CPU with tiny shapes: no allocator figures there (the lines say so), so it
checks the code paths only.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "src"))


def emit(out: list, **row) -> None:
    out.append(row)
    print(json.dumps(row), flush=True)


def peak_above(fn, device) -> int | None:
    """Peak allocated bytes while `fn` runs, above what was allocated before it; None on a CPU."""
    import torch

    if device.type != "cuda":
        fn()
        return None
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - base


def context(out: list, device) -> int:
    import torch

    from tunelab.plan import memory

    if device.type != "cuda":
        emit(out, part="context", measured_bytes=None, plan_bytes=memory.CUDA_CONTEXT_BYTES, note="cpu: no context")
        return 0
    torch.ones(1024, 1024, device=device) @ torch.ones(1024, 1024, device=device)
    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    used = total - free - torch.cuda.memory_reserved()
    emit(out, part="context", measured_bytes=used, plan_bytes=memory.CUDA_CONTEXT_BYTES)
    return used


def loss_kernels(out: list, device, dry: bool) -> None:
    import torch
    import torch.nn.functional as F

    from tunelab.plan import memory

    p, v, h = (256, 4096, 256) if dry else (8192, 128256, 2048)
    dt = torch.bfloat16
    hidden = torch.randn(p, h, device=device, dtype=dt, requires_grad=True)
    weight = torch.randn(v, h, device=device, dtype=dt, requires_grad=True) * 0.02
    weight = weight.detach().requires_grad_()
    labels = torch.randint(0, v, (p,), device=device)

    def whole():
        loss = F.cross_entropy((hidden @ weight.T).float(), labels)
        loss.backward()

    def chunk_loss(x, y):  # torchtune's CEWithChunkedOutputLoss.compute_cross_entropy
        return F.cross_entropy(x.float(), y, reduction="sum")

    compiled_loss = torch.compile(chunk_loss) if device.type == "cuda" else chunk_loss

    def chunked_output(ce=chunk_loss):
        # the model's output in 8 chunks of the sequence of a 2-row micro-batch, the head an nn.Linear (torchtune's
        # chunked_output): on a CPU aten's bmm copies the head weight once a row for it (memory.Layout.
        # chunked_head_copies); this row measures whether CUDA's does (plan adds no copies on CUDA)
        logits = [F.linear(c, weight) for c in hidden.view(2, p // 2, h).tensor_split(8, dim=1)]
        chunks = labels.view(2, p // 2).tensor_split(8, dim=1)
        loss = sum(ce(x.reshape(-1, v), y.reshape(-1)) for x, y in zip(logits, chunks, strict=True))
        del logits
        loss.backward()

    kernels = {
        "whole": (whole, False),
        "chunked_output": (chunked_output, False),
        "chunked_output, compiled": (lambda: chunked_output(compiled_loss), True),
    }
    if importlib.util.find_spec("liger_kernel") and device.type == "cuda":
        from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss

        liger_loss = LigerFusedLinearCrossEntropyLoss()
        kernels["liger"] = (lambda: liger_loss(weight, hidden, labels).backward(), False)
    if importlib.util.find_spec("cut_cross_entropy") and device.type == "cuda":
        from cut_cross_entropy import linear_cross_entropy

        kernels["cce"] = (lambda: linear_cross_entropy(hidden, weight, labels).backward(), False)
    for kind, (fn, compiled) in kernels.items():
        try:
            measured = peak_above(fn, device)
        except Exception as e:  # a kernel that cannot run here is a line, not the end of the step
            emit(out, part="loss", kind=kind, error=f"{type(e).__name__}: {str(e).splitlines()[0][:200]}")
            continue
        hidden.grad = weight.grad = None
        plan = memory.loss_kernel_bytes(kind.split(",")[0], p, v, h, 2, 1024, compiled)
        emit(out, part="loss", kind=kind, positions=p, vocab=v, hidden=h, measured_bytes=measured, plan_bytes=plan)
    for name in ("liger_kernel", "cut_cross_entropy"):
        if not importlib.util.find_spec(name):
            emit(out, part="loss", kind=name, note="not installed: not measured")


def dequant(out: list, device, dry: bool) -> None:
    import torch

    from tunelab.plan import memory

    d_in, d_out, tokens = (256, 512, 64) if dry else (4096, 14336, 4096)
    try:
        import bitsandbytes as bnb

        layer = bnb.nn.Linear4bit(d_in, d_out, bias=False, compute_dtype=torch.bfloat16, quant_type="nf4")
        layer = layer.to(device)
        x = torch.randn(tokens, d_in, device=device, dtype=torch.bfloat16, requires_grad=True)

        def step():
            y = layer(x)
            y.sum().backward()

        measured = peak_above(step, device)
    except Exception as e:
        emit(out, part="dequant", error=f"{type(e).__name__}: {str(e).splitlines()[0][:200]}")
        return
    # What the step holds besides the scratch: the output and its gradient (bf16), the input's gradient.
    held = 2 * tokens * d_out * 2 + tokens * d_in * 2
    plan = d_in * d_out * 2  # memory.dequant_scratch_bytes for one linear
    emit(
        out,
        part="dequant",
        d_in=d_in,
        d_out=d_out,
        measured_bytes=None if measured is None else measured - held,
        plan_bytes=plan,
        double_quant_bytes_a_weight=memory.nf4_bytes(True),
        single_quant_bytes_a_weight=memory.nf4_bytes(False),
    )


def run_figures(out: list, dry: bool, context_bytes: int, work: Path, varied: bool = False) -> None:
    """`varied`: the rows unpacked, each micro-batch padded to its longest and truncated at seq_len (the peak at the
    widest batch, and the caching allocator's reserve of the blocks cut for narrower ones: plan's reserved figure
    adds memory.varied_reserve_bytes), over more steps so that batches of several widths pass."""
    from tunelab import api

    model, shape = (
        ("random:smollm2-135m", ["seq_len=128", "micro_batch=2"])
        if dry
        else (
            "random:llama-3.2-1b",
            ["seq_len=1024" if varied else "seq_len=2048", "micro_batch=8"],
        )
    )
    part = "figures-varied" if varied else "figures"
    data = work / "memory-parts-data.jsonl"
    common = [sys.executable, "-m", "tunelab.cli"]
    subprocess.run(
        [
            *common,
            "data",
            "synthetic",
            "--rows",
            "200",
            "--prompt-tokens",
            "24-160",
            "--response-tokens",
            "64-1024",
            "--out",
            str(data),
        ],
        check=True,
        capture_output=True,
    )
    packing = "packing=false" if varied else "packing=true"
    settings = [f"model={model}", *shape, "method=lora", packing, "compile=false", f"data.path={data}"]
    device = "cpu" if dry else "cuda"
    run = subprocess.run(
        [
            *common,
            "bench",
            "run",
            *settings,
            f"device={device}",
            f"output_dir={work / ('memory-parts-' + part)}",
            "--steps",
            "8" if varied else "2",
            "--warmup",
            "1",
            "--json",
            "--db",
            str(work / "memory-parts.sqlite"),
        ],
        capture_output=True,
        text=True,
    )
    lines = [json.loads(x) for x in run.stdout.splitlines() if x.startswith("{")]
    if run.returncode or not lines:
        emit(out, part=part, error=(run.stderr.strip().splitlines() or ["no output"])[-1][:300])
        return
    rec = lines[-1]
    (plan,) = api.estimate(None, *settings, gpu="local" if dry else "h100-sxm")
    f = plan.single.figures
    reserved = rec.get("peak_memory_reserved_bytes")
    emit(
        out,
        part=part,
        allocated=rec.get("peak_memory_bytes"),
        reserved=reserved,
        process=None if reserved is None else reserved + context_bytes,
        plan_allocated=f.allocated,
        plan_reserved=f.reserved,
        plan_process=f.process,
        note="plan on the h100-sxm catalog row: on another GPU only the figures' structure compares"
        if not dry
        else "cpu",
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dry-run", action="store_true")
    p.add_argument("--out", type=Path)
    p.add_argument("--work", type=Path, default=Path("/tmp"))
    args = p.parse_args(argv)
    import torch

    device = torch.device("cpu" if args.dry_run or not torch.cuda.is_available() else "cuda")
    out: list = []
    used = context(out, device)
    loss_kernels(out, device, args.dry_run)
    dequant(out, device, args.dry_run)
    run_figures(out, args.dry_run, used, args.work)
    run_figures(out, args.dry_run, used, args.work, varied=True)
    if args.out:
        args.out.write_text("".join(json.dumps(r) + "\n" for r in out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
