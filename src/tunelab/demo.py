"""The main job (`make demo`): the embedded SmolLM2-135M learns multi-digit addition on this machine.

Top to bottom: generate data -> plan's prediction -> base accuracy -> LoRA training -> tuned accuracy ->
before/after table by digit count, and the measured run beside the prediction. Leaves
`OUTPUT_DIR/adapter` and `OUTPUT_DIR/eval.json`.

    python -m tunelab.demo configs/quickstart.yaml [--train-rows N] [--test-rows N] [key=value ...]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from . import config as cfgmod
from .data import arithmetic
from .io import write_atomic
from .errors import TunelabError

if TYPE_CHECKING:  # torch-importing; the demo re-executes itself before importing torch
    from .train.checkpoint import TrainState

TEST_TEMPLATES = ("plain",)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tunelab.demo", description=__doc__.splitlines()[0])
    p.add_argument("config")
    p.add_argument("--train-rows", type=int, default=18_000)
    p.add_argument("--test-rows", type=int, default=400)
    p.add_argument("--digits", default="1-8", help="operand digit range, both operands")
    p.add_argument("--response", default="aligned", choices=arithmetic.RESPONSES,
                   help="response form of the rows (tunelab data arithmetic --response); aligned: 90.2%% exact "
                        "match against 73.8%% for Goat's expression on the same 18,000 rows (docs/quickstart.md)")
    p.add_argument("--skip-base", action="store_true", help="skip scoring the base model")
    p.add_argument("--curve-every", type=int, default=0, metavar="STEPS",
                   help="keep a checkpoint every STEPS steps and score each after training: accuracy against "
                        "training minutes (OUTPUT_DIR/curve.json, curve.png); scoring is outside the demo's budget")
    args, overrides = p.parse_known_args(argv)
    if args.curve_every < 0:
        p.error(f"--curve-every must be a number of steps (0 = off), got {args.curve_every}")
    if argv is None:
        from .allocator import reexec_with_jemalloc

        reexec_with_jemalloc()
    if args.curve_every:
        overrides = [*overrides, f"save_steps={args.curve_every}", "save_total_limit=1000"]
    from .cli import quiet_libraries

    quiet_libraries()
    try:
        run(args, overrides)
    except TunelabError as e:
        print(f"demo: error: {e}", file=sys.stderr)
        return 2
    return 0


def run(args: argparse.Namespace, overrides: list[str]) -> None:
    from rich.console import Console

    started = time.perf_counter()
    console = Console()
    cfg = cfgmod.load_config(args.config, overrides)
    out = Path(cfg.output_dir)
    train_path, test_path = Path(cfg.data.path), out / "data" / "test.jsonl"

    # 1. Data: 1-8 digit additions, every digit-count pair equally likely; the test set shares no problem.
    digits = arithmetic.parse_digit_range(args.digits)
    cells = arithmetic.grid(["add"], digits, digits)
    train_rows = arithmetic.sample(cells, args.train_rows, TEST_TEMPLATES, cfg.seed, args.response)
    test_rows = arithmetic.held_out(cells, args.test_rows, TEST_TEMPLATES, cfg.seed, train_rows, args.response)
    for path, rows in ((train_path, train_rows), (test_path, test_rows)):
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, (json.dumps(r) + "\n" for r in rows))
    console.print(f"[bold]data[/]: {len(train_rows):,} training and {len(test_rows)} held-out additions "
                  f"({args.digits} digits) in {train_path.parent}")

    # 2. What plan predicts for this run on this machine.
    from .plan.command import local_prediction

    prediction = local_prediction(cfg)
    # The loop's measured time includes torch.compile's first steps, so the prediction it is set beside does.
    predicted_train_s = prediction.speed.train_s + prediction.overheads.compile_s
    console.print(f"[bold]plan[/] (local, {prediction.efficiency.label}): "
                  f"{prediction.work.optimizer_steps} steps, {prediction.speed.tokens_per_s:,.0f} tokens/s fed, "
                  f"training {predicted_train_s / 60:.1f} min (compile {prediction.overheads.compile_s:.0f} s of it), "
                  f"peak memory {prediction.memory.total / 2**30:.2f} GiB")

    # 3. Base accuracy.
    base = None if args.skip_base else score(cfg, test_rows, adapter=None)
    if base is not None:
        console.print(f"[bold]base model[/]: {base['accuracy']:.1%} exact match ({base['seconds']:.0f} s)")

    # 4. Train.
    from .train.command import train

    summary = train(cfg)

    # 5. Tuned accuracy, stored beside the adapter.
    tuned = score(cfg, test_rows, adapter=out / "adapter")
    result = {"base": base, "tuned": tuned, "train": {k: summary[k] for k in (
        "steps", "loss_first", "loss_last", "train_s", "tokens_nonpad_per_s", "tokens_padded_per_s",
        "tokens_loss_per_s", "peak_memory_bytes")},
        "predicted": {"train_s": predicted_train_s, "tokens_padded_per_s": prediction.speed.tokens_per_s,
                      "peak_memory_bytes": prediction.memory.total}}
    write_atomic(out / "eval.json", [json.dumps(result, indent=2) + "\n"])
    show(console, base, tuned, summary, prediction, predicted_train_s)
    console.print(f"[bold]demo[/]: {(time.perf_counter() - started) / 60:.1f} min from data generation to this table")

    # 6. Optionally, the accuracy-against-time curve from the kept checkpoints.
    if args.curve_every:
        points = [(0.0, base["accuracy"])] if base is not None else []
        points += [(s.elapsed_s / 60, acc) for s, acc in score_checkpoints(cfg, test_rows, out / "checkpoints")]
        points.append((summary["train_s"] / 60, tuned["accuracy"]))
        write_atomic(out / "curve.json", [json.dumps([{"train_minutes": m, "accuracy": a} for m, a in points]) + "\n"])
        from .bench.plots import accuracy_curve

        accuracy_curve({f"{cfg.method} r {cfg.lora.r}, {args.train_rows:,} rows": points}, out / "curve.png")
        console.print("[bold]curve[/]: " + ", ".join(f"{a:.1%} at {m:.1f} min" for m, a in points))


def score(cfg: cfgmod.TrainConfig, rows: list[dict], adapter: Path | None) -> dict:
    """Exact match on `rows` with the training prompt; the model is loaded fresh with SDPA attention."""
    from .eval.generate import evaluate

    model, tokenizer = _base_for_eval(cfg)
    if adapter is not None:
        from .model.adapters import load_adapter

        model = load_adapter(model, adapter)
    return evaluate(model, tokenizer, rows, cfg.data.format, cfg.data.template).summary()


def score_checkpoints(cfg: cfgmod.TrainConfig, rows: list[dict], folder: Path) -> list[tuple[TrainState, float]]:
    """(counters, exact match) of every kept checkpoint, each loaded into one model and scored like the final adapter."""
    from .eval.generate import evaluate
    from .model.adapters import apply_adapter
    from .train.checkpoint import list_checkpoints, load_weights
    from .train.command import adapter_spec

    model, tokenizer = _base_for_eval(cfg)
    model = apply_adapter(model, adapter_spec(cfg))
    results = []
    for path in list_checkpoints(folder):
        state = load_weights(path, model)
        results.append((state, evaluate(model, tokenizer, rows, cfg.data.format, cfg.data.template).accuracy))
    return results


def _base_for_eval(cfg: cfgmod.TrainConfig):
    """The base model in the compute dtype with transformers' default attention (left-padded generation), and
    its tokenizer."""
    from .device import pick_device, pick_precision
    from .model.load import load_model, load_tokenizer, resolve

    device = pick_device(cfg.device)
    source = resolve(cfg.model)
    return load_model(source, pick_precision(cfg.precision, device).compute, "none", device), load_tokenizer(source)


def show(console, base: dict | None, tuned: dict, summary: dict, prediction, predicted_train_s: float) -> None:
    from rich.table import Table

    table = Table(title="exact match on held-out additions, by the longer operand's digit count")
    table.add_column("digits", justify="right")
    table.add_column("n", justify="right")
    table.add_column("base", justify="right")
    table.add_column("tuned", justify="right")
    for key, bucket in sorted(tuned["by_digits"].items(), key=lambda kv: int(kv[0])):
        before = base["by_digits"].get(key, {}).get("accuracy") if base else None
        table.add_row(str(key), str(bucket["n"]), "-" if before is None else f"{before:.0%}", f"{bucket['accuracy']:.0%}")
    table.add_row("all", str(tuned["n"]), "-" if base is None else f"{base['accuracy']:.1%}", f"{tuned['accuracy']:.1%}")
    console.print(table)

    figures = Table(title="this run: measured beside plan's prediction")
    for col in ("", "measured", "predicted"):
        figures.add_column(col, justify="right")
    figures.add_row("training time", f"{summary['train_s'] / 60:.1f} min", f"{predicted_train_s / 60:.1f} min")
    figures.add_row("tokens/s fed (padded)", f"{summary['tokens_padded_per_s']:,.0f}", f"{prediction.speed.tokens_per_s:,.0f}")
    figures.add_row("tokens/s non-padding", f"{summary['tokens_nonpad_per_s']:,.0f}", "")
    figures.add_row("tokens/s with loss", f"{summary['tokens_loss_per_s']:,.0f}", "")
    figures.add_row("peak memory", f"{summary['peak_memory_bytes'] / 2**30:.2f} GiB", f"{prediction.memory.total / 2**30:.2f} GiB")
    console.print(figures)


if __name__ == "__main__":
    sys.exit(main())
