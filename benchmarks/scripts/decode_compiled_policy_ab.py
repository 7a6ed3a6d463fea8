"""A compiled policy's sampling with and without the adapter packed for the call (issue 66): the policy a
`compile: true` GRPO run trains (recipes/grpo.build_policy: blocks compiled, LoRA layers not packed), sampled
through eval/sampling.py, alternating `packed` (model/prepack.py packs each LoRA layer's [W | sB], or reorders
W + sBA in fp32, for the call: now) and `unpacked` (pack_while off: the fused forward concatenates [W | sB] on
every call, and in fp32 no LoRA layer is reordered, as before), after one warm-up call of each. Prints one JSON line per call and the medians.

    python benchmarks/scripts/decode_compiled_policy_ab.py [--rows 64] [--prompts 8] [--prompt-tokens 24]
        [--tokens 40] [--repeats 3] [--precision auto]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=64)
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--prompt-tokens", type=int, default=24)
    p.add_argument("--tokens", type=int, default=40)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--precision", default="auto")
    args = p.parse_args(argv)

    import torch

    from tunelab import sources
    from tunelab.config import AdapterConfig
    from tunelab.device import pick_device, pick_precision
    from tunelab.eval.sampling import sample
    from tunelab.model import load as mload
    from tunelab.model import lora_linear
    from tunelab.model.adapters import apply_adapter
    from tunelab.recipes.finetune import compile_blocks

    dev = pick_device("cpu")
    prec = pick_precision(args.precision, dev)
    model = apply_adapter(mload.load_model(sources.resolve("embedded"), prec.compute, "none", dev), AdapterConfig())
    compile_blocks(model)
    g = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    distinct = [torch.randint(0, vocab, (args.prompt_tokens,), generator=g).tolist() for _ in range(args.prompts)]
    prompts = [distinct[i % args.prompts] for i in range(args.rows)]
    real = lora_linear._FusedForward.pack_while, lora_linear._FusedForward.prepack_inference

    def before(self, reorder):  # the code before: only a layer pack_for_inference packed was reordered
        return None if self._packed is None else real[1](self, reorder)

    def timed(packed: bool) -> float:
        lora_linear._FusedForward.pack_while = real[0] if packed else (lambda self: False)
        lora_linear._FusedForward.prepack_inference = real[1] if packed else before
        t0 = time.perf_counter()
        sample(model, prompts, args.tokens, [-1], 0, 1.0, 1.0, decode="dynamic")
        return time.perf_counter() - t0

    times: dict[str, list[float]] = {"packed": [], "unpacked": []}
    for side in times:
        timed(side == "packed")  # warm-up
    for r in range(args.repeats):
        for side in times:
            s = timed(side == "packed")
            times[side].append(s)
            print(json.dumps({"side": side, "repeat": r, "seconds": s}), flush=True)
    med = {side: statistics.median(v) for side, v in times.items()}
    print(
        json.dumps(
            {
                "precision": prec.name,
                "rows": args.rows,
                "tokens": args.tokens,
                "median_s": med,
                "tokens_per_s": {side: args.rows * args.tokens / s for side, s in med.items()},
                "unpacked_over_packed": med["unpacked"] / med["packed"],
            }
        ),
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
