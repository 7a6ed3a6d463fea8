"""tunelab vs transformers + PEFT on a tiny-but-realistic Qwen3-MoE shape, LoRA r 16 on attention and every
expert (PEFT's target_parameters), the same random weights and the same token batches: training tokens/s
(forward, backward, AdamW step), the router's load and peak RSS, each side in its own process.

    PYTHONPATH=src python benchmarks/scripts/moe_peers.py [--experts 32 --top-k 4] > out.json
    PYTHONPATH=src python benchmarks/scripts/moe_peers.py --shape Qwen/Qwen3-30B-A3B --layers 8 --device cuda
    PYTHONPATH=src python benchmarks/scripts/moe_peers.py --shape openai/gpt-oss-20b --layers 8 --device cuda

`--family gpt_oss` (or a gpt-oss `--shape`) builds gpt-oss instead (attention sinks, biases, the clamped SwiGLU,
a sliding window on every other layer): tunelab on the attention path `attention: auto` takes (flex on CUDA for
the sinks), transformers + PEFT on its eager attention, the one that applies them.

Precision (`--precision auto`): tunelab's pick for the device, on both sides: bf16 weights under bf16 autocast
where the CPU multiplies bf16 natively, fp32 weights and no autocast on an AVX2-only CPU (or under
`ONEDNN_MAX_CPU_ISA=AVX2`, the epyc-fp32-2c class).

Each side runs in its own process on its stack's allocator (`--allocator own`: tunelab's CLI re-executes itself on
jemalloc where the system has it, transformers + PEFT runs on glibc's malloc; `system` or `jemalloc` puts both on
one). Both sides step a fused AdamW (tunelab's build_adamw, and transformers' Trainer default `adamw_torch_fused`).
`--layout` gives tunelab's side the slot layout and positions its collate builds for these rows (one document
each, `packing: true`); without it, whole rows under a causal mask.

`--side tunelab --experts-4bit` runs tunelab's side with QLoRA's 4-bit experts (transformers + PEFT has none).

`--shape` takes a catalog MoE row's widths, heads, experts, top-k and vocabulary (its layers stay `--layers`, so
a 30B shape fits one GPU); each side's experts path is in its row (`grouped_mm`: torch's grouped kernel,
`segments`: tunelab's CPU products, or transformers' experts implementation).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time


def shape_from_catalog(args) -> None:
    """Overwrite args' widths and family with the catalog row `args.shape` (plan/arch.py: a Qwen3-MoE or a gpt-oss
    row, the configs this script builds); the layers stay args.layers."""
    from tunelab import families
    from tunelab.plan.arch import from_registry

    arch = from_registry(args.shape)
    if arch is None or arch.moe is None:
        raise SystemExit(f"--shape {args.shape}: not an MoE row of the model catalog")
    args.hidden, args.heads, args.kv_heads, args.head_dim = arch.hidden, arch.heads, arch.kv_heads, arch.head_dim
    args.vocab, args.experts, args.top_k = arch.vocab, arch.moe.experts, arch.moe.top_k
    args.expert_width = arch.moe.expert_width
    args.family = next(k for k, row in families.MOE_FAMILIES.items() if row.name == arch.moe.family)
    if args.family not in FAMILIES:
        raise SystemExit(f"--shape {args.shape}: a {arch.moe.family} row; this script builds {', '.join(FAMILIES)}")


FAMILIES = ("qwen3_moe", "gpt_oss")


def config(args):
    import transformers as tf

    common = dict(
        hidden_size=args.hidden,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        head_dim=args.head_dim or args.hidden // args.heads,
        vocab_size=args.vocab,
        num_experts_per_tok=args.top_k,
        max_position_embeddings=max(2048, args.seq),
    )
    if args.family == "gpt_oss":  # its attention sinks, biases and clamped SwiGLU; sliding window on every other layer
        kinds = ["sliding_attention", "full_attention"] * args.layers
        return tf.GptOssConfig(
            **common,
            intermediate_size=args.expert_width,
            num_local_experts=args.experts,
            layer_types=kinds[: args.layers],
        )
    return tf.Qwen3MoeConfig(
        **common, intermediate_size=args.hidden * 3, moe_intermediate_size=args.expert_width, num_experts=args.experts
    )


def side(args) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    from tunelab.model import moe

    torch.manual_seed(0)
    device = torch.device(args.device)
    if device.type == "cpu":
        torch.set_num_threads(2)
    tunelab = args.side == "tunelab"
    from tunelab.device import pick_precision

    # auto: tunelab's pick for the device (bf16 where the CPU multiplies bf16 natively, else fp32), both sides
    precision = pick_precision("auto", device).name if args.precision == "auto" else args.precision
    bf16 = precision == "bf16"
    dtype = torch.bfloat16 if bf16 else torch.float32
    if tunelab:
        from tunelab.config import load_config
        from tunelab.model import attention
        from tunelab.model.adapters import apply_adapter
        from tunelab.recipes.finetune import training_attention
        from tunelab.train.loss import CausalLMLoss

        # the path `attention: auto` takes: slots on a CPU; on CUDA flex for gpt-oss's sinks, else flash or flex
        attn = training_attention(device, "auto", sinks=args.family == "gpt_oss") if device.type == "cuda" else None
        with device:  # built where it runs, in bf16: a 30B-wide shape initialises in seconds on a GPU
            model = AutoModelForCausalLM.from_config(
                config(args), attn_implementation=attn or attention.register("slots"), dtype=dtype
            )
        moe.use_grouped(model)
        if args.experts_4bit:  # QLoRA's experts: each expert's slice in NF4 (the attention stays 16-bit here)
            moe.quantize_experts(model)
        adapter = load_config(None, ["method=lora", "lora.r=16", "lora.alpha=32"]).adapter
        model = apply_adapter(model, adapter)
        loss_fn = CausalLMLoss(model)
        probe = torch.zeros(1, 1, device=device, dtype=torch.bfloat16)
        experts_path = "grouped_mm" if moe._grouped_kernel(probe) else "segments"
    else:
        from peft import LoraConfig, get_peft_model

        peer_attn = "eager" if args.family == "gpt_oss" else "sdpa"  # transformers runs gpt-oss's sinks on eager
        with device:
            model = AutoModelForCausalLM.from_config(config(args), attn_implementation=peer_attn, dtype=dtype)
        experts_path = str(getattr(model.config, "_experts_implementation", None) or "grouped_mm")
        model = get_peft_model(
            model,
            LoraConfig(
                r=16,
                lora_alpha=32,
                target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
                target_parameters=["experts.gate_up_proj", "experts.down_proj"],
            ),
        )
    trainable = [p for p in model.parameters() if p.requires_grad]
    # fused AdamW on both sides: tunelab's build_adamw and transformers' Trainer default (adamw_torch_fused, torch>=2.8)
    optimizer = torch.optim.AdamW(trainable, lr=1e-4, fused=True)
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(3, args.vocab, (args.rows, args.seq), generator=generator).to(device)
    positions = layout = None
    if tunelab and args.layout:  # what tunelab's collate passes for rows of one document each (packing: true)
        from tunelab.data.packing import layout_from_lengths

        positions = torch.arange(args.seq, device=device).repeat(args.rows, 1)
        layout = layout_from_lengths([[args.seq]] * args.rows, args.seq)
    index = torch.arange(args.rows * args.seq, device=device).view(args.rows, args.seq)[:, :-1].reshape(-1)
    targets = ids[:, 1:].reshape(-1)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    times = []
    prof = None
    if args.profile:  # the timed steps under torch.profiler, its table by self CPU time on stderr
        from torch.profiler import ProfilerActivity, profile

        prof = profile(activities=[ProfilerActivity.CPU], record_shapes=args.profile_shapes)
    for step in range(args.warmup + args.steps):
        if prof is not None and step == args.warmup:
            prof.__enter__()
        sync()
        start = time.perf_counter()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            if tunelab:
                loss = loss_fn(ids, positions, index, targets, layout) / index.numel()
            else:
                loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        sync()
        if step >= args.warmup:
            times.append(time.perf_counter() - start)
    if prof is not None:
        prof.__exit__(None, None, None)
        averages = prof.key_averages(group_by_input_shape=args.profile_shapes)
        table = averages.table(sort_by="self_cpu_time_total", row_limit=args.profile)
        print(table, file=sys.stderr)
    with torch.no_grad():
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        logits = base.model(input_ids=ids, output_router_logits=True).router_logits
    load = moe.expert_load(logits, args.top_k, args.experts)
    tokens = args.rows * args.seq
    step_s = sorted(times)[len(times) // 2]
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {
        "side": args.side,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "experts_path": experts_path,
        "precision": precision,
        "slot_layout": layout is not None,
        "optimizer": "AdamW fused",
        "tokens_per_step": tokens,
        "step_s": step_s,
        "step_s_all": times,
        "tokens_per_s": tokens / step_s,
        "loss": float(loss),
        "router_load_max_over_mean": float(load.max() * args.experts),
        "router_load_min_over_mean": float(load.min() * args.experts),
        "peak_rss_bytes": peak,
        "peak_gpu_bytes": torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None,
    }


def side_env(name: str, choice: str) -> tuple[dict, str]:
    """The environment a side runs in, and its allocator's name: `own` gives each side its stack's process as its
    users run it (tunelab's CLI re-executes itself on jemalloc with allocator.MALLOC_CONF where the system has
    it; transformers + PEFT runs on Python's, glibc's malloc), `system` and `jemalloc` give both sides the same."""
    import os

    from tunelab import allocator

    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "MALLOC_CONF")}
    lib = allocator.find_jemalloc()
    jemalloc = lib is not None and (choice == "jemalloc" or (choice == "own" and name == "tunelab"))
    if not jemalloc:
        return env, "glibc"
    return {**env, "LD_PRELOAD": lib, "MALLOC_CONF": allocator.MALLOC_CONF}, "jemalloc"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--side", choices=["tunelab", "transformers-peft"])
    parser.add_argument("--shape", help="a catalog MoE row's shape (e.g. Qwen/Qwen3-30B-A3B); --layers stays")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--family", choices=FAMILIES, default="qwen3_moe", help="the config built (--shape sets it)")
    parser.add_argument("--experts", type=int, default=32)
    parser.add_argument("--top-k", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--expert-width", type=int, default=256)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--kv-heads", type=int, default=4)
    parser.add_argument("--head-dim", type=int, default=None)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--rows", type=int, default=4)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument(
        "--experts-4bit",
        action="store_true",
        help="tunelab's experts in NF4 (moe.quantize_experts); with --side tunelab",
    )
    parser.add_argument(
        "--layout",
        action="store_true",
        help="tunelab with the slot layout its collate builds for these rows (default: whole rows, a causal mask)",
    )
    parser.add_argument(
        "--profile", type=int, default=0, help="with --side: the top N ops of the timed steps, to stderr"
    )
    parser.add_argument(
        "--allocator",
        choices=["own", "system", "jemalloc"],
        default="own",
        help="own: each side on its stack's allocator (tunelab's CLI: jemalloc; transformers: glibc); or both on one",
    )
    parser.add_argument(
        "--precision",
        choices=["auto", "bf16", "fp32"],
        default="auto",
        help="both sides' weights and autocast (auto: tunelab's pick for the device; fp32 on an AVX2-only CPU)",
    )
    parser.add_argument("--profile-shapes", action="store_true", help="with --profile: rows per op and input shapes")
    args = parser.parse_args()
    if args.shape:
        shape_from_catalog(args)
    if args.side:
        print(json.dumps(side(args)))
        return
    rows = []
    for name in ("tunelab", "transformers-peft"):
        argv = [a for a in sys.argv[1:]] + ["--side", name]
        env, allocator = side_env(name, args.allocator)
        out = subprocess.run([sys.executable, __file__, *argv], capture_output=True, text=True, env=env)
        if out.returncode:  # one side failing (out of memory, say) still reports the other
            rows.append({"side": name, "error": out.stderr.strip().splitlines()[-3:]})
        else:
            rows.append({**json.loads(out.stdout.strip().splitlines()[-1]), "allocator": allocator})
    keys = (
        "shape",
        "family",
        "device",
        "experts",
        "top_k",
        "hidden",
        "expert_width",
        "heads",
        "kv_heads",
        "vocab",
        "layers",
    )
    shape = {k: getattr(args, k) for k in (*keys, "rows", "seq")}
    ratio = rows[0]["tokens_per_s"] / rows[1]["tokens_per_s"] if all("error" not in r for r in rows) else None
    print(json.dumps({"shape": shape, "rows": rows, "ratio": ratio}))


if __name__ == "__main__":
    main()
