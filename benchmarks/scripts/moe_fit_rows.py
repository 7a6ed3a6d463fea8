"""`tunelab bench fit` rows from today's measured MoE steps (issue 67: "`bench fit` takes MoE rows like any other").

Two records measured MoE training steps on the 2-core EPYC (AVX-512 BF16) with models built in their scripts:
benchmarks/plan-accuracy/moe-plan_epyc-avx512bf16-2c_2026-12-07 (transformers' MoE under the tuned HF Trainer +
PEFT recipe: `--stack hf-peft` rows) and benchmarks/peers/moe-peers_epyc-avx512bf16-2c_2026-12-07 (tunelab's
grouped experts with LoRA on attention and every expert: tunelab rows, its "after" code). A row's model must be
one plan resolves, so this writes each shape's config.json (no weights: plan reads shapes only) under
benchmarks/plan-accuracy/models/<shape>/, built as those scripts build them, and the rows file naming them.

Neither record ran a matmul or copy probe beside its steps: `--peak` and `--bandwidth` are the probes of the same
machine taken for this file (probe.matmul_peak, probe.copy_bandwidth), so the rows are predicted and shown, never
fitted (`fit: false`). An hf-peft row's loss fraction is its data's: the same synthetic rows (`tunelab data
synthetic`, seed 0) tokenized as the peer tokenized them (bench/peers.tokenize_masked, alpaca template).

    PYTHONPATH=src python benchmarks/scripts/moe_fit_rows.py --out benchmarks/plan-accuracy/rows/7_moe_2026-12-07.yaml

`--report` instead runs `tunelab bench fit`'s fit over the committed rows (bench/fitting.run) and puts every MoE
row's measured and predicted step (its device in the fit and left out of it) into the moe-plan record's figures.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MODELS = "benchmarks/plan-accuracy/models"
PLAN_RECORD = "benchmarks/plan-accuracy/moe-plan_epyc-avx512bf16-2c_2026-12-07.record.json"
PEERS_RECORD = "benchmarks/peers/moe-peers_epyc-avx512bf16-2c_2026-12-07.record.json"
# moe_plan_accuracy.py's data: `tunelab data synthetic` with these parameters (seed: the command's default, 0).
SYNTHETIC = {"rows": 400, "prompt_tokens": "32-160", "response_tokens": "16-96", "dist": "lognormal", "seed": 0}


def write_config(config, name: str) -> str:
    folder = REPO / MODELS / name
    folder.mkdir(parents=True, exist_ok=True)
    text = json.dumps(config.to_diff_dict(), indent=2, sort_keys=True) + "\n"
    (folder / "config.json").write_text(text)
    return f"{MODELS}/{name}"


def hf_loss_fraction() -> float:
    """Response tokens over all tokens of the synthetic rows, tokenized as the HF peer did (cut at 256)."""
    from tunelab import sources
    from tunelab.bench import peers
    from tunelab.data import synthetic as sy
    from tunelab.data.examples import IGNORE

    tokenizer = sources.embedded_tokenizer()
    prompt = sy.parse_range(SYNTHETIC["prompt_tokens"], "prompt")
    response = sy.parse_range(SYNTHETIC["response_tokens"], "response")
    rows = sy.generate(SYNTHETIC["rows"], prompt, response, SYNTHETIC["dist"], SYNTHETIC["seed"], tokenizer)
    loss = total = 0
    for row in rows:
        p, r = peers.prompt_and_response("alpaca", "alpaca", row, tokenizer.eos_token)
        enc = peers.tokenize_masked(tokenizer, p, r, 256, False)
        loss += sum(x != IGNORE for x in enc["labels"])
        total += len(enc["input_ids"])
    return loss / total


def plan_rows(peak: float, bandwidth: float) -> list[dict]:
    sys.path.insert(0, str(REPO / "benchmarks" / "scripts"))
    import moe_plan_accuracy as mpa
    from transformers import AutoConfig

    from tunelab import sources

    special = AutoConfig.from_pretrained(sources.embedded_tokenizer_dir())
    record = json.loads((REPO / PLAN_RECORD).read_text())
    fraction = hf_loss_fraction()
    out = []
    for i, r in enumerate(record["figures"]["rows"]):
        fields = dict(mpa.SHAPES[r["shape"]])
        kind = fields.pop("model_type")
        config = AutoConfig.for_model(
            kind,
            **fields,
            vocab_size=mpa.VOCAB,
            max_position_embeddings=4096,
            tie_word_embeddings=False,
            bos_token_id=special.bos_token_id,
            eos_token_id=special.eos_token_id,
            pad_token_id=special.pad_token_id,
        )
        out.append(
            {
                "label": f"moe-plan {r['shape']} micro-batch {r['micro_batch']}",
                "source": f"{PLAN_RECORD} figures.rows[{i}]",
                "model": write_config(config, r["shape"]),
                "stack": "hf-peft",
                "method": "lora",
                "targets": "attn",
                "r": mpa.LORA_R,
                "micro_batch": r["micro_batch"],
                "seq_len": r["seq_len"],
                "compiled": False,
                "packing": False,
                "lengths": "synthetic:" + json.dumps(SYNTHETIC, separators=(",", ":")),
                "loss_fraction": round(fraction, 4),
                "measured_s": r["measured_step_s"],
                "imbalance": round(r["imbalance_measured"]["median"], 3),
                "peak": peak,
                "bandwidth": bandwidth,
            }
        )
    return out


def peers_rows(peak: float, bandwidth: float) -> list[dict]:
    sys.path.insert(0, str(REPO / "benchmarks" / "scripts"))
    import moe_peers

    record = json.loads((REPO / PEERS_RECORD).read_text())
    out = []
    for i, run in enumerate(record["figures"]["runs"]):
        if run["code"] != "after":
            continue
        shape = run["shape"]
        args = argparse.Namespace(head_dim=None, seq=shape["seq"], **{k: shape[k] for k in moe_peers_keys()})
        name = f"qwen3moe-peers-{shape['experts']}x{shape['top_k']}"
        model = write_config(moe_peers.config(args), name)
        ours = next(x for x in run["rows"] if x["side"] == "tunelab")
        out.append(
            {
                "label": f"moe-peers {shape['experts']}x{shape['top_k']} round {run['round']}",
                "source": f"{PEERS_RECORD} figures.runs[{i}] side tunelab",
                "model": model,
                "stack": "tunelab",
                "method": "lora",
                "r": 16,
                "micro_batch": shape["rows"],
                "seq_len": shape["seq"],
                "compiled": False,
                "packing": False,
                "lengths": f"mean:{shape['seq']}",
                "loss_fraction": round((shape["seq"] - 1) / shape["seq"], 4),
                "measured_s": ours["step_s"],
                # the load of all layers' routers together (moe.expert_load), not plan's per-layer micro-batch maximum
                "imbalance": round(ours["router_load_max_over_mean"], 3),
                "peak": peak,
                "bandwidth": bandwidth,
            }
        )
    return out


def moe_peers_keys() -> tuple[str, ...]:
    return ("experts", "top_k", "hidden", "expert_width", "heads", "kv_heads", "vocab", "layers")


def report() -> int:
    """Today's MoE rows through `bench fit`'s fit, into the moe-plan record's figures (`bench_fit`)."""
    from tunelab.bench import fitting

    result = fitting.run(REPO / "benchmarks" / "plan-accuracy" / "rows")
    keys = ("label", "source", "model", "stack", "targets", "micro_batch", "imbalance", "measured_s")
    keys += ("predicted_s_in", "error_in", "predicted_s_out", "error_out", "peak", "bandwidth")
    rows = [{k: r[k] for k in keys} for r in result.rows() if "/models/" in r["model"]]
    path = REPO / PLAN_RECORD
    record = json.loads(path.read_text())
    command = "PYTHONPATH=src python benchmarks/scripts/moe_fit_rows.py --report"
    record["command"] = [c for c in record["command"] if c != command] + [command]
    record["figures"]["bench_fit"] = {"rows_file": "benchmarks/plan-accuracy/rows/7_moe_2026-12-07.yaml", "rows": rows}
    path.write_text(json.dumps(record, indent=1) + "\n")
    for r in rows:
        print(
            f"{r['label']}: measured {r['measured_s']:.3f} s, in {r['predicted_s_in']:.3f} ({r['error_in']:+.0%}), "
            f"out {r['predicted_s_out']:.3f} ({r['error_out']:+.0%})"
        )
    return 0


def main() -> int:
    import torch
    import yaml

    from tunelab import probe
    from tunelab.device import cpu_class, cpu_vendor
    from tunelab.plan import catalog

    p = argparse.ArgumentParser()
    p.add_argument("--out")
    p.add_argument("--report", action="store_true")
    args = p.parse_args()
    if args.report:
        return report()
    cpu = torch.device("cpu")
    torch.set_num_threads(2)
    peak, _ = probe.matmul_peak(torch.bfloat16, cpu, fresh=True)
    bandwidth = probe.copy_bandwidth(cpu, fresh=True)
    rows = plan_rows(peak, bandwidth) + peers_rows(peak, bandwidth)
    doc = {
        "date": "2026-12-07",
        "defaults": {
            "device": catalog.local_class("cpu", "bf16", cpu_class(), cpu_vendor()),
            "kind": "cpu",
            "grad_ckpt": False,
            "compute_bytes": 2,
            "fit": False,
            "note": "MoE, probes taken apart from the steps (benchmarks/scripts/moe_fit_rows.py)",
        },
        "rows": rows,
    }
    head = (
        "# Today's measured MoE steps on the 2-core EPYC (AVX-512 BF16) as bench fit rows (benchmarks/scripts/\n"
        "# moe_fit_rows.py): the HF stack's from moe-plan_*, tunelab's from moe-peers_* (its `after` code). Models:\n"
        "# config.json only, under benchmarks/plan-accuracy/models/. peak and bandwidth: this machine's matmul and\n"
        "# copy probes taken for this file, not beside the steps, so predicted and shown, never fitted (fit: false).\n"
    )
    Path(args.out).write_text(head + yaml.safe_dump(doc, sort_keys=False, width=120))
    print(f"wrote {args.out}: {len(rows)} rows; peak {peak:.4g} FLOP/s, bandwidth {bandwidth:.4g} B/s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
