"""Two of issue 69's memory parts measured on this machine's CPU against plan's terms: torchtune's chunked-output
cross-entropy beside the unchunked losses, and a bitsandbytes NF4 base (its bytes a weight with and without double
quantization, and its dequantization scratch in forward and backward). One JSON line per measurement, printed and
written to --out.

    python benchmarks/scripts/cpu_memory_parts.py [--out FILE] [--positions P] [--vocab V] [--hidden H]

How it measures: each measurement runs in a fresh process (`--child`) with glibc's mmap threshold fixed at 64 KiB
(MALLOC_MMAP_THRESHOLD_), so that every tensor of more than 64 KiB is its own mapping, given back to the system
when freed: the process's resident memory then follows the live tensors, and its peak (VmHWM, restarted with
/proc/self/clear_refs, tunelab.memwatch) above the resident memory just before is the peak of what the
computation allocated, as torch.cuda.max_memory_allocated counts it on a GPU. The computation runs once first at
the same shape (lazy initialisation, oneDNN's primitives), then is measured.

- loss: the head and loss forward and backward over P positions (`--positions`, a micro-batch of 2 rows) of a
  V-wide vocabulary (SmolLM2's 49,152 and hidden 576 by default; random weights, bf16 as torchtune's `dtype: bf16`
  model runs), the head frozen (LoRA), against memory.loss_kernel_bytes for the kernel:
  - whole: transformers' ForCausalLMLoss: every logit in bf16, upcast to fp32, cross-entropy;
  - chunked_output: torchtune's CEWithChunkedOutputLoss, eager: the model's output is 8 chunks of the sequence
    (TransformerDecoder.chunked_output: the head applied to each of hidden.tensor_split(8, dim=1)), each chunk's
    logits upcast to fp32 and cross-entropy summed (compute_cross_entropy), divided by the label count; the
    recipe drops its logits before backward (`del logits`);
  - chunked_output_compiled: the same with compute_cross_entropy under torch.compile (torchtune's
    training.compile_loss, `compile: true`), inductor's C++ backend on this CPU;
  - native: torch's cross-entropy on the bf16 logits (torchtune's torch.nn.CrossEntropyLoss).
- head-copies: the head's product alone over those 8 chunks of a micro-batch of 1, 2 and 4 rows: what it
  allocates above the logits, in head weights.
- nf4-bytes: bitsandbytes' Linear4bit quantization (quant_type nf4, blocksize 64, compress_statistics = double
  quantization) of every block linear of the model's shape, the bytes of the packed weights and every tensor of
  their quant states, against memory.nf4_bytes x the block parameters.
- nf4-scratch: one Linear4bit (bf16 compute, from bf16 weights, as model/load.py's BitsAndBytesConfig loads it)
  forward and backward on T tokens whose input requires grad (the frozen base under LoRA): the peak above the
  resident packed weight, less the input's gradient, the output and its gradient, against
  memory.dequant_scratch_bytes for that one linear (d_in x d_out x 2).

The head's matmul over torchtune's chunks (a strided 3-D input) goes through aten's bmm, which on this CPU copies
the head weight once a row of the micro-batch: plan's chunked_output term adds those copies on a CPU
(memory.Layout.chunked_head_copies); `plan_without_head_copies` is the term without them.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "src"))

MMAP_THRESHOLD = 65536
CHUNKS = 8  # torchtune's num_output_chunks


def measure(fn) -> int:
    """Peak resident bytes above the start while `fn` runs (after one warm-up run)."""
    import gc

    from tunelab import memwatch

    fn()
    gc.collect()
    memwatch.reset_peak_rss()
    base = memwatch.rss_bytes()
    fn()
    return memwatch.peak_rss_bytes() - base


def child_loss(kind: str, positions: int, vocab: int, hidden: int) -> dict:
    import torch
    import torch.nn.functional as F

    from tunelab.plan import memory

    torch.manual_seed(0)
    rows = 2
    seq = positions // rows
    h = torch.randn(rows, seq, hidden, dtype=torch.bfloat16, requires_grad=True)
    w = (torch.randn(vocab, hidden) * 0.02).to(torch.bfloat16)  # the frozen head
    labels = torch.randint(0, vocab, (rows, seq))

    def whole():  # transformers' ForCausalLMLoss: logits.float(), then cross-entropy
        logits = F.linear(h, w)
        loss = F.cross_entropy(logits.float().reshape(-1, vocab), labels.reshape(-1))
        del logits
        loss.backward()
        h.grad = None

    def native():  # torch.nn.CrossEntropyLoss on the model's bf16 logits
        logits = F.linear(h, w)
        loss = F.cross_entropy(logits.reshape(-1, vocab), labels.reshape(-1))
        del logits
        loss.backward()
        h.grad = None

    def compute_cross_entropy(x, y):  # CEWithChunkedOutputLoss.compute_cross_entropy
        return F.cross_entropy(x.reshape(-1, vocab).float(), y.reshape(-1), reduction="sum")

    # torchtune's training.compile_loss compiles compute_cross_entropy (`compile: true`)
    ce = torch.compile(compute_cross_entropy) if kind == "chunked_output_compiled" else compute_cross_entropy

    def chunked_output():  # torchtune's chunked output + CEWithChunkedOutputLoss
        logits = [F.linear(c, w) for c in h.tensor_split(CHUNKS, dim=1)]  # the head, an nn.Linear
        total = 0.0
        for x, y in zip(logits, labels.tensor_split(CHUNKS, dim=1), strict=True):
            total = total + ce(x, y)
        loss = total / labels.numel()
        del logits  # the recipe's `del logits` before backward
        loss.backward()
        h.grad = None

    fn = {"whole": whole, "native": native}.get(kind, chunked_output)
    measured = measure(fn)
    compiled = kind.endswith("_compiled")
    base = kind.removesuffix("_compiled")
    plan = memory.loss_kernel_bytes(base, positions, vocab, hidden, 2, 1024, compiled, rows)  # estimate.layout's CPU
    before = memory.loss_kernel_bytes(base, positions, vocab, hidden, 2, 1024, compiled)  # without the head's copies
    return dict(
        part="loss",
        kind=kind,
        rows=rows,
        positions=positions,
        vocab=vocab,
        hidden=hidden,
        measured_bytes=measured,
        plan_bytes=round(plan),
        plan_vs_measured=round(plan / measured - 1, 4),
        plan_without_head_copies=round(before),
        without_vs_measured=round(before / measured - 1, 4),
    )


def child_head_copies(rows: int, positions: int, vocab: int, hidden: int) -> dict:
    """The head's product over torchtune's 8 sequence chunks of a `rows`-row micro-batch, no loss: the peak above
    the chunks' logits is what the product itself allocates."""
    import torch
    import torch.nn.functional as F

    h = torch.randn(rows, positions // rows, hidden, dtype=torch.bfloat16)
    w = (torch.randn(vocab, hidden) * 0.02).to(torch.bfloat16)
    peak = measure(lambda: [F.linear(c, w) for c in h.tensor_split(CHUNKS, dim=1)])
    logits = positions * vocab * 2
    return dict(
        part="head-copies",
        rows=rows,
        positions=positions,
        vocab=vocab,
        hidden=hidden,
        peak_bytes=peak,
        above_logits_bytes=peak - logits,
        head_weight_bytes=vocab * hidden * 2,
        copies=round((peak - logits) / (vocab * hidden * 2), 3),
    )


def quantize(d_in: int, d_out: int, double_quant: bool, weight=None):
    import bitsandbytes as bnb
    import torch

    layer = bnb.nn.Linear4bit(
        d_in,
        d_out,
        bias=False,
        compute_dtype=torch.bfloat16,
        compress_statistics=double_quant,
        quant_type="nf4",
        quant_storage=torch.uint8,
    )
    w = weight if weight is not None else (torch.randn(d_out, d_in) * 0.02).to(torch.bfloat16)
    layer.weight = bnb.nn.Params4bit(
        w, requires_grad=False, compress_statistics=double_quant, quant_type="nf4", quant_storage=torch.uint8
    )
    return layer.to("cpu")  # Params4bit.to quantizes


def state_bytes(layer) -> int:
    """The packed weight and every tensor of its quant state (absmax; nested: the 8-bit absmax, its fp32 scales,
    the code tables and the offset)."""
    import torch

    st = layer.weight.quant_state
    tensors = [layer.weight.data, st.absmax, st.code]
    if st.nested:
        tensors += [st.state2.absmax, st.state2.code, st.offset]
    return sum(t.nbytes for t in tensors if isinstance(t, torch.Tensor))


def child_nf4_bytes(model: str, double_quant: bool) -> dict:
    import torch

    from tunelab.plan import memory
    from tunelab.plan.arch import from_registry

    arch = from_registry(model)
    total = params = 0
    for m in arch.modules():
        layer = quantize(m.d_in, m.d_out, double_quant, torch.zeros(m.d_out, m.d_in, dtype=torch.bfloat16) + 0.01)
        total += state_bytes(layer) * m.count
        params += m.d_in * m.d_out * m.count
    per = memory.nf4_bytes(double_quant)
    return dict(
        part="nf4-bytes",
        model=model,
        double_quant=double_quant,
        block_params=params,
        measured_bytes=total,
        measured_bytes_a_weight=round(total / params, 6),
        plan_bytes=round(per * params),
        plan_bytes_a_weight=round(per, 6),
        plan_vs_measured=round(per * params / total - 1, 4),
    )


def child_nf4_scratch(d_in: int, d_out: int, tokens: int, double_quant: bool) -> dict:
    import torch

    from tunelab.plan import memory  # noqa: F401  (the term below is memory.dequant_scratch_bytes for one linear)

    torch.manual_seed(0)
    layer = quantize(d_in, d_out, double_quant)
    x = torch.randn(tokens, d_in, dtype=torch.bfloat16, requires_grad=True)

    def step():
        y = layer(x)
        y.backward(torch.ones_like(y))
        x.grad = None

    peak = measure(step)
    held = 2 * tokens * d_out * 2 + tokens * d_in * 2  # the output and its gradient, the input's gradient (bf16)
    plan = d_in * d_out * 2
    return dict(
        part="nf4-scratch",
        d_in=d_in,
        d_out=d_out,
        tokens=tokens,
        double_quant=double_quant,
        peak_bytes=peak,
        held_bytes=held,
        measured_bytes=peak - held,
        plan_bytes=plan,
        plan_vs_measured=round(plan / (peak - held) - 1, 4),
    )


def run_child(args: list[str]) -> dict:
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_=str(MMAP_THRESHOLD), PYTHONPATH=str(REPO / "src"))
    env.pop("LD_PRELOAD", None)  # glibc's malloc, not jemalloc: the threshold above is glibc's
    r = subprocess.run([sys.executable, __file__, *args], env=env, capture_output=True, text=True)
    lines = [x for x in r.stdout.splitlines() if x.startswith("{")]
    if r.returncode or not lines:
        return dict(child=args, error=(r.stderr.strip().splitlines() or ["no output"])[-1][:300])
    return json.loads(lines[-1])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path)
    p.add_argument("--positions", type=int, default=1024)
    p.add_argument("--vocab", type=int, default=49152)
    p.add_argument("--hidden", type=int, default=576)
    p.add_argument("--loss", default="whole,native,chunked_output,chunked_output_compiled", help="loss kinds")
    p.add_argument("--model", default="smollm2-135m", help="catalog shape whose block linears are quantized")
    p.add_argument("--scratch", default="576x1536,2048x8192,4096x14336", help="linears d_inxd_out for the scratch")
    p.add_argument("--tokens", type=int, default=256)
    p.add_argument("--parts", default="loss,head-copies,nf4-bytes,nf4-scratch", help="which measurements")
    p.add_argument("--child", nargs="+")
    args = p.parse_args(argv)
    if args.child:
        what, *rest = args.child
        if what == "head-copies":
            row = child_head_copies(int(rest[0]), args.positions, args.vocab, args.hidden)
        elif what == "loss":
            row = child_loss(rest[0], args.positions, args.vocab, args.hidden)
        elif what == "nf4-bytes":
            row = child_nf4_bytes(rest[0], rest[1] == "1")
        else:
            d_in, d_out = map(int, rest[0].split("x"))
            row = child_nf4_scratch(d_in, d_out, args.tokens, rest[1] == "1")
        print(json.dumps(row), flush=True)
        return 0
    sizes = ["--positions", str(args.positions), "--vocab", str(args.vocab), "--hidden", str(args.hidden)]
    jobs = {
        "loss": [[*sizes, "--child", "loss", k] for k in args.loss.split(",")],
        "head-copies": [[*sizes, "--child", "head-copies", str(b)] for b in (1, 2, 4)],
        "nf4-bytes": [["--child", "nf4-bytes", args.model, dq] for dq in ("1", "0")],
        "nf4-scratch": [
            ["--tokens", str(args.tokens), "--child", "nf4-scratch", s, dq]
            for s in args.scratch.split(",")
            for dq in ("1", "0")
        ],
    }
    jobs = [job for part in args.parts.split(",") for job in jobs[part]]
    out = []
    for job in jobs:
        row = run_child(job)
        out.append(row)
        print(json.dumps(row), flush=True)
    if args.out:
        args.out.write_text("".join(json.dumps(r) + "\n" for r in out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
