"""tunelab vs transformers + PEFT on a tiny-but-realistic Qwen3-MoE shape, LoRA r 16 on attention and every
expert (PEFT's target_parameters), the same random weights and the same token batches: training tokens/s
(forward, backward, AdamW step), the router's load and peak RSS, each side in its own process.

    PYTHONPATH=src python benchmarks/scripts/moe_peers.py [--experts 32 --top-k 4] > out.json
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time


def config(args):
    import transformers as tf

    return tf.Qwen3MoeConfig(
        hidden_size=args.hidden,
        intermediate_size=args.hidden * 3,
        moe_intermediate_size=args.expert_width,
        num_hidden_layers=args.layers,
        num_attention_heads=8,
        num_key_value_heads=4,
        head_dim=args.hidden // 8,
        vocab_size=8192,
        num_experts=args.experts,
        num_experts_per_tok=args.top_k,
        max_position_embeddings=2048,
    )


def side(args) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    from tunelab.model import moe

    torch.manual_seed(0)
    torch.set_num_threads(2)
    tunelab = args.side == "tunelab"
    if tunelab:
        from tunelab.config import load_config
        from tunelab.model import attention
        from tunelab.model.adapters import apply_adapter
        from tunelab.train.loss import CausalLMLoss

        model = AutoModelForCausalLM.from_config(config(args), attn_implementation=attention.register("slots"))
        model = model.to(torch.bfloat16)
        moe.use_grouped(model)
        adapter = load_config(None, ["method=lora", "lora.r=16", "lora.alpha=32"]).adapter
        model = apply_adapter(model, adapter)
        loss_fn = CausalLMLoss(model)
    else:
        from peft import LoraConfig, get_peft_model

        model = AutoModelForCausalLM.from_config(config(args), attn_implementation="sdpa").to(torch.bfloat16)
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
    optimizer = torch.optim.AdamW(trainable, lr=1e-4)
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 8192, (args.rows, args.seq), generator=generator)
    index = torch.arange(args.rows * args.seq).view(args.rows, args.seq)[:, :-1].reshape(-1)
    targets = ids[:, 1:].reshape(-1)
    times = []
    for step in range(args.warmup + args.steps):
        start = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            if tunelab:
                loss = loss_fn(ids, None, index, targets) / index.numel()
            else:
                loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step >= args.warmup:
            times.append(time.perf_counter() - start)
    with torch.no_grad():
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        logits = base.model(input_ids=ids, output_router_logits=True).router_logits
    load = moe.expert_load(logits, args.top_k, args.experts)
    tokens = args.rows * args.seq
    return {
        "side": args.side,
        "tokens_per_step": tokens,
        "step_s": sorted(times)[len(times) // 2],
        "tokens_per_s": tokens / sorted(times)[len(times) // 2],
        "loss": float(loss),
        "router_load_max_over_mean": float(load.max() * args.experts),
        "router_load_min_over_mean": float(load.min() * args.experts),
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    }


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--side", choices=["tunelab", "transformers-peft"])
    parser.add_argument("--experts", type=int, default=32)
    parser.add_argument("--top-k", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--expert-width", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--rows", type=int, default=4)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    if args.side:
        print(json.dumps(side(args)))
        return
    rows = []
    for name in ("tunelab", "transformers-peft"):
        argv = [a for a in sys.argv[1:]] + ["--side", name]
        out = subprocess.run([sys.executable, __file__, *argv], capture_output=True, text=True, check=True)
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    shape = {k: getattr(args, k) for k in ("experts", "top_k", "hidden", "expert_width", "layers", "rows", "seq")}
    print(json.dumps({"shape": shape, "rows": rows, "ratio": rows[0]["tokens_per_s"] / rows[1]["tokens_per_s"]}))


if __name__ == "__main__":
    main()
