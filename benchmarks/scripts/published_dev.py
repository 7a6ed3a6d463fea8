"""`tunelab plan` against published runs of other stacks (the development set), written as a dated record: the
table `tunelab bench fit --published FILE` prints (src/tunelab/bench/published.py), each stack's errors, and
the targets of issue 69.

    PYTHONPATH=src .venv/bin/python benchmarks/scripts/published_dev.py \\
        [--cases ../shared/published-dev.yaml --cases benchmarks/plan-accuracy/published-hf-dev.yaml] \\
        [--out benchmarks/plan-accuracy/published-dev_<date>]

Plan only (no training, no GPU): nothing is fitted to these rows. Writes `<out>.md` and `<out>.record.json`.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DEFAULT_CASES = [REPO.parent / "shared" / "published-dev.yaml", REPO / "benchmarks/plan-accuracy/published-hf-dev.yaml"]
# Issue 69's targets over the rows held: (median |error| at most, share within 20% at least).
TARGETS = {"tok": (0.08, 0.90), "mem": (0.10, 0.80)}


def shown(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(REPO))
    except ValueError:
        return "../shared/" + path.name if path.resolve().parent == (REPO.parent / "shared").resolve() else str(path)


def target_lines(summary: dict) -> list[str]:
    out = []
    for stack in ("all", "all, DOUBTFUL rows left out"):
        for key, label in (("tok", "throughput"), ("mem", "memory")):
            s = summary[stack][key]
            median, share = TARGETS[key]
            met = s["median_abs"] <= median and s["within_20"] >= share
            out.append(
                f"- {label}, {stack}: {s['rows']} rows, median |error| {s['median_abs']:.1%} (target <= {median:.0%}), "
                f"{s['within_20']:.0%} within 20% (target >= {share:.0%}): {'met' if met else 'NOT met'}"
            )
    return out


# Which switches matter: one at a time on two torchtune rows of the dev set (plan's parts, nothing measured here).
SWITCHES = [
    ("activation checkpointing off", ("grad_ckpt=false",), {}),
    ("selective checkpointing, one layer in 2", (), {"ckpt_every": 2}),
    ("loss: tunelab's chunked head (torchtune's LinearCrossEntropyLoss)", (), {"loss_kernel": "chunked"}),
    ("loss: torch's cross-entropy on the whole logits", (), {"loss_kernel": "native"}),
    ("loss: Cut Cross Entropy", (), {"loss_kernel": "cce"}),
    ("fp32 weights, adapters and AdamW states (not pure bf16)", ("weights=fp32",), {"pure_bf16": False}),
    ("the step in backward", ("optimizer_in_backward=true", "max_grad_norm=0"), {}),
    ("8-bit AdamW", ("optimizer=adamw_8bit",), {}),
    ("activation offloading on", ("activation_offload=true",), {}),
    ("compile off", ("compile=false",), {}),
]
SWITCH_ROWS = ("tt-l32-3b-full-packed-compile-cce-ac-a100", "tt-l32-3b-lora-a100")


def switch_lines(cases: dict) -> list[str]:
    from tunelab.bench import published

    def run(case, extra, over):
        settings, parts = published.tuned_settings(case)
        settings = {**settings, **dict(x.split("=", 1) for x in extra)}
        gpu = published.gpu_id(case["gpu"])
        r = published.estimate(settings, {**parts, **over}, gpu, 1, 1024, case["seq_len"])
        return r.single.speed.tokens_per_s, r.single.figures.allocated / 2**30

    lines = ["| switch | " + " | ".join(f"{c}: tok/s, allocated" for c in SWITCH_ROWS) + " |", "|---|---|---|"]
    base = {c: run(cases[c], (), {}) for c in SWITCH_ROWS}
    lines.append("| as published | " + " | ".join(f"{t:,.0f}, {m:.1f} GiB" for t, m in base.values()) + " |")
    for label, extra, over in SWITCHES:
        cells = []
        for c in SWITCH_ROWS:
            if c.endswith("lora-a100") and "weights=fp32" in extra:
                extra = ()
            t, m = run(cases[c], extra, over)
            t0, m0 = base[c]
            cells.append(f"{t / t0 - 1:+.0%}, {m - m0:+.1f} GiB ({m / m0 - 1:+.0%})")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", type=Path, action="append")
    p.add_argument(
        "--out", type=Path, default=REPO / "benchmarks/plan-accuracy" / f"published-dev_{time.strftime('%Y-%m-%d')}"
    )
    args = p.parse_args(argv)
    sys.path.insert(0, str(REPO / "src"))
    from tunelab.bench import published

    cases = args.cases or DEFAULT_CASES
    rows = published.rows(cases)
    summary = published.summary(rows)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    files = " ".join(f"--published {shown(c)}" for c in cases)
    command = f"tunelab bench fit {files}"
    md = [
        f"# plan against published runs of other stacks, per stack ({time.strftime('%Y-%m-%d')})",
        "",
        f"Written by `python benchmarks/scripts/published_dev.py` at tunelab {commit.stdout.strip()}; the same table as "
        f"`{command}` prints. Plan only: nothing trained, no GPU, nothing fitted to these rows (uncalibrated: the "
        "step constants are the catalog's, from tunelab's own measured rows).",
        "",
        "**Which rows**: the development set is every case of `../shared/published-dev.yaml` (torchtune, NeMo "
        "AutoModel: 16 cases) and `benchmarks/plan-accuracy/published-hf-dev.yaml` (HF Trainer + PEFT: 8 cases; "
        "its three measured H200 rows are tunelab's own peers, whose masked-attention bytes per head-pair were "
        "fitted on them, so their time is in-fit). The published runs the issue keeps back are not in this "
        "repository and were not seen; nothing here was tuned on them.",
        "",
        "**How each row is predicted** (bench/published.py): the case's settings, and what its notes state of the "
        "stack (torchtune: pure bf16 with torch.optim's states in bf16, the step in backward, paged 8-bit AdamW, "
        "activation offloading, CEWithChunkedOutputLoss or torch's cross-entropy, compile) as memory parts "
        "(plan.job.Parts). A published peak is compared with the figure it counts: torchtune's README column is "
        "`Peak Memory Active` (allocated); the HF rows are max_memory_allocated; a card's capacity bounds the "
        "process from above and is left out of the medians. Error = plan / published - 1. A row is held where "
        "the rules of `_tok_why` / `_mem_why` allow (the same for every case: one GPU for tokens/s, a published "
        "figure, the board and checkpointing known, packed rows).",
        "",
        *published.rows_table(rows),
        "",
        "## Per stack",
        "",
        *published.summary_table(summary),
        "",
        "## Against the issue's targets",
        "",
        *target_lines(summary),
        "",
        "## Which switches matter most (plan's parts, one at a time)",
        "",
        "Each switch changed alone on two rows of the dev set as published (torchtune on the A100: the 3B full "
        "fine-tune with compile, chunked output loss and checkpointing; the 3B LoRA with offloading), plan's "
        "tokens/s and allocated peak against the row's own. The full fine-tune's peak is the optimizer step's "
        "(weights, gradients and states), so the loss and offloading change nothing there; the LoRA row's peak is "
        "the loss's, so the loss kernel is its largest switch.",
        "",
        *switch_lines({c["id"]: c for c in published.load(cases[0])}),
        "",
        "## What the misses are",
        "",
        "- tt-l32-3b-full-packed-compile-a100, memory: torchtune's `+ Compile` row saves 9 GiB over the eager one; "
        "plan prices tunelab's compiled blocks, which save far less than eager ones, so it predicts a 21 GiB "
        "saving (-30%). torchtune's compiled layers keep more than tunelab's.",
        "- The DOUBTFUL and ambiguous-board rows (A6000) stay in the table, out of the medians where the board or "
        "checkpointing is unknown; the padded alpaca baseline (lengths not published) is not held.",
        "- Throughput on torchtune's rows is tunelab's own step at the stack's settings (no torchtune step model): "
        "the 3B full fine-tunes read -13% to -15% (tunelab's compiled step against torchtune's).",
        "",
    ]
    md_path = args.out.with_suffix(".md")
    md_path.write_text("\n".join(md))
    record = {
        "command": [command, "python benchmarks/scripts/published_dev.py"],
        "config": {"cases": [shown(c) for c in cases]},
        "device_class": "unnamed",
        "date": time.strftime("%Y-%m-%d"),
        "versions": {},
        "figures": {
            "summary": summary,
            "targets": {k: {"median_abs_at_most": v[0], "within_20_at_least": v[1]} for k, v in TARGETS.items()},
            "rows": [r.as_dict() for r in rows],
        },
        "raw": [],
        "write_up": md_path.name,
    }
    args.out.with_suffix(".record.json").write_text(json.dumps(record, indent=1, default=str) + "\n")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
