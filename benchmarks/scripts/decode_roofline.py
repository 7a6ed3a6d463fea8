"""GRPO's decode speed against the bandwidth roofline: eval/sampling.py's loop on a model with a LoRA adapter
(packed, as the GRPO run samples), `rows` completions of `prompts` distinct prompts, every row decoding to the cap.

    python benchmarks/scripts/decode_roofline.py MODEL [--rows 32] [--prompts 4] [--prompt-tokens 64]
        [--tokens 128] [--device auto] [--precision auto] [--decode auto[,static,...]] [--policy eager[,compiled]]

One decode step reads the weights and the KV cache once (plan/generation.py); its roofline is those bytes over the
device's memory bandwidth (the catalog's for a GPU, the copy probe's on a CPU). Decode seconds per step come from
two runs, one of `--tokens` and one of a single token (the prefill), so the prefill is not counted. Prints one
JSON line per decode mode (decoding.py; each timed after a warm-up call of its shapes, which compiles the compiled
mode) and policy: measured decode tokens/s (rows / seconds per step), the roofline's, and their ratio. `--policy
compiled` samples from the policy a `compile: true` GRPO run trains (recipes/grpo.build_policy: blocks compiled,
LoRA layers not packed; the sampler runs them eager over its own packed copy), `eager` from the eager run's.
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model")
    p.add_argument("--rows", type=int, default=32)
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--prompt-tokens", type=int, default=64)
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--device", default="auto")
    p.add_argument("--precision", default="auto")
    p.add_argument("--decode", default="auto", help="decode modes, comma-separated (decoding.py)")
    p.add_argument("--policy", default="eager", help="eager, compiled or both, comma-separated")
    args = p.parse_args(argv)

    import torch

    from tunelab import decoding, sources
    from tunelab.config import AdapterConfig
    from tunelab.device import pick_device, pick_precision, synchronize
    from tunelab.eval.sampling import sample
    from tunelab.model import load as mload
    from tunelab.model.adapters import apply_adapter
    from tunelab.model.lora_linear import pack_for_inference
    from tunelab.recipes.finetune import compile_blocks

    dev = pick_device(args.device)
    prec = pick_precision(args.precision, dev)
    source = sources.resolve(args.model)

    def policy(compiled: bool):
        model = apply_adapter(mload.load_model(source, prec.compute, "none", dev, attn="sdpa"), AdapterConfig())
        if compiled:
            compile_blocks(model)
        else:
            pack_for_inference(model)
        return model

    model = policy(False)
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(0)
    distinct = [torch.randint(0, vocab, (args.prompt_tokens,), generator=g).tolist() for _ in range(args.prompts)]
    prompts = [distinct[i % args.prompts] for i in range(args.rows)]
    never = [-1]  # no stop id: every row decodes to the cap

    def timed(tokens: int, decode: str) -> float:
        sample(model, prompts, tokens, never, 0, 1.0, 1.0, decode=decode)  # warm-up of this shape
        synchronize(dev)
        t0 = time.perf_counter()
        sample(model, prompts, tokens, never, 0, 1.0, 1.0, decode=decode)
        synchronize(dev)
        return time.perf_counter() - t0

    for kind in args.policy.split(","):
        model = policy(kind == "compiled") if kind != "eager" else model
        for decode in args.decode.split(","):
            per_step = (timed(args.tokens, decode) - timed(1, decode)) / (args.tokens - 1)
            report(args, dev, prec, decoding.resolve(decode, dev.type).name, per_step, kind)
    return 0


def report(args, dev, prec, decode: str, per_step: float, policy: str = "eager") -> None:
    import torch

    from tunelab.device import device_name
    from tunelab.plan import catalog
    from tunelab.plan.generation import kv_bytes_per_token
    from tunelab.probe import copy_bandwidth
    from tunelab.sources import resolve_arch

    arch = resolve_arch(args.model)
    name = device_name(dev)
    row = catalog.match_gpu(name, 0) if dev.type == "cuda" else None
    bandwidth = row.bandwidth_gbs * 1e9 if row else copy_bandwidth(dev)
    width = torch.finfo(prec.compute).bits // 8
    context = args.prompt_tokens + args.tokens / 2
    step_bytes = arch.total_params * width + kv_bytes_per_token(arch, width) * args.rows * context
    roofline_s = step_bytes / bandwidth
    print(
        json.dumps(
            {
                "device": name,
                "model": args.model,
                "precision": prec.name,
                "decode": decode,
                "policy": policy,
                "rows": args.rows,
                "distinct_prompts": args.prompts,
                "prompt_tokens": args.prompt_tokens,
                "decode_tokens": args.tokens,
                "decode_s_per_step": per_step,
                "decode_tokens_per_s": args.rows / per_step,
                "roofline_s_per_step": roofline_s,
                "roofline_tokens_per_s": args.rows / roofline_s,
                "of_roofline": roofline_s / per_step,
                "bandwidth_bps": bandwidth,
                "bandwidth_source": f"catalog row {row.id}" if row else "copy probe",
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    sys.exit(main())
