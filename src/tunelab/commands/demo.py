"""The main job (`make demo`): the embedded SmolLM2-135M learns multi-digit addition on this machine.

Top to bottom: generate data -> plan's prediction -> base accuracy -> LoRA training -> tuned accuracy ->
before/after table by digit count, and the measured run beside the prediction. Leaves
`OUTPUT_DIR/adapter` and `OUTPUT_DIR/eval.json`.

    python -m tunelab.demo configs/quickstart.yaml [--minutes M] [--train-rows N] [--test-rows N] [key=value ...]

The demo keeps to a time budget (`--minutes`, data generation to the final table): training's time limit
(`max_minutes`) is what the budget leaves after scoring, and its learning-rate schedule is fitted to that limit
on the measured pace (`schedule_within_limit`). When plan predicts that the recipe's rows would not fit, it
says so and hands training OVERSUPPLY times the rows plan says fit, so a noisy prediction neither starves the
run (a machine faster than predicted trains on) nor cuts it mid-schedule (a slower one decays to its end
earlier): a machine that computes in fp32 gets a shorter run, never a silent two-hour one.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from .. import config as cfgmod
from ..data import arithmetic
from ..errors import TunelabError
from ..io import gib, write_atomic
from ..memwatch import rss_bytes

if TYPE_CHECKING:  # torch-importing; the demo re-executes itself before importing torch
    from ..train.checkpoint import TrainState

TEST_TEMPLATES = ("plain",)
DEFAULT_MINUTES = 15.0
# Below this many rows the recipe learns next to nothing, so a budget that fits fewer is refused
# (benchmarks/design-decisions_cpu_2026-11-22.md#demo-minimum-rows-and-steps).
MIN_TRAIN_ROWS = 1_000
# A cut recipe keeps at least this many optimizer steps by lowering its micro-batch (not below MIN_MICRO_BATCH):
# on an fp32 CPU many small steps scored far higher than a few large ones
# (benchmarks/design-decisions_cpu_2026-11-22.md#demo-minimum-rows-and-steps), and in the same minutes micro-batch
# 2 (155 steps) scored 55.2% where 4 (91 steps) scored 49.5%, at 13% fewer tokens a second
# (benchmarks/quickstart/quickstart-micro-batch_epyc-fp32-2c_2026-12-07.md).
MIN_STEPS = 150
MIN_MICRO_BATCH = 2
# Rows handed to a cut run, as a multiple of those plan says fit the time left: the schedule is fitted to the
# measured pace (schedule_within_limit), so rows past the limit are never trained, and a machine up to this much
# faster than its probes said still trains to its limit. On the 2-core Zen 3 the probes read the host 13% fast
# to 26% slow between runs (benchmarks/quickstart/quickstart_epyc-avx2-2c_2026-11-29.md).
OVERSUPPLY = 1.5
# Scoring time reserved for the tuned model when the base model, whose scoring it is timed against, is skipped.
SCORING_RESERVE_S = 120.0
# The base model is scored on this many of the held-out rows: it never writes the answer format (0.0% on every
# class), and scoring all 400 took 111 s of a 2-core Zen 3's 15 minutes, time that training now gets
# (benchmarks/quickstart/quickstart_epyc-avx2-2c_2026-11-28.md).
BASE_ROWS = 100
# The demo aims to end this long before --minutes: `make demo`'s own start and the interpreter's exit.
END_SLACK_S = 45.0
# What the demo spends outside the training loop and the two scorings once training is sized: loading the model
# and packing the rows before the loop, the final save, loading the tuned model.
SETUP_RESERVE_S = 45.0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tunelab.demo", description=__doc__.splitlines()[0])
    p.add_argument("config")
    p.add_argument(
        "--minutes",
        type=float,
        default=DEFAULT_MINUTES,
        help=f"time budget from data generation to the final table (default {DEFAULT_MINUTES:g}); training "
        "is cut to the rows that fit, as plan predicts it on this machine",
    )
    p.add_argument("--train-rows", type=int, default=18_000, help="rows the recipe trains on when the budget allows")
    p.add_argument("--test-rows", type=int, default=400)
    p.add_argument("--digits", default="1-8", help="operand digit range, both operands")
    p.add_argument(
        "--response",
        default="aligned",
        choices=arithmetic.RESPONSES,
        help="response form of the rows (tunelab data arithmetic --response); aligned: 90.2%% exact "
        "match against 73.8%% for Goat's expression on the same 18,000 rows "
        "(benchmarks/quickstart/quickstart_xeon-amx-2c_2026-11-22.md)",
    )
    p.add_argument("--skip-base", action="store_true", help="skip scoring the base model")
    p.add_argument(
        "--base-rows",
        type=int,
        default=BASE_ROWS,
        metavar="N",
        help=f"score the base model on the first N held-out rows (default {BASE_ROWS}; the tuned model on all of "
        "them): the base model scores near 0%%, and the time saved goes to training",
    )
    p.add_argument(
        "--curve-every",
        type=int,
        default=0,
        metavar="STEPS",
        help="keep a checkpoint every STEPS steps and score each after training: accuracy against "
        "training minutes (OUTPUT_DIR/curve.json, curve.png); scoring is outside the demo's budget",
    )
    args, overrides = p.parse_known_args(argv)
    if args.base_rows < 1:
        p.error(f"--base-rows must be at least 1, got {args.base_rows}")
    if args.curve_every < 0:
        p.error(f"--curve-every must be a number of steps (0 = off), got {args.curve_every}")
    if not 0 < args.minutes < math.inf:  # written so that nan, which compares false, fails too
        p.error(f"--minutes must be positive, got {args.minutes:g}")
    if argv is None:
        from ..allocator import reexec_with_jemalloc

        reexec_with_jemalloc()
    if args.curve_every:
        overrides = [*overrides, f"save_steps={args.curve_every}", "save_total_limit=1000"]
    from ..libraries import quiet_libraries

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
    start_rss = rss_bytes()  # before any model loads: the baseline of the training's peak (training_peak)
    console = Console()
    cfg = cfgmod.load_config(args.config, overrides)
    out = Path(cfg.run.output_dir)
    if cfg.run.resume is False:  # before minutes of data and scoring, not after them
        from ..train.checkpoint import refuse_earlier

        refuse_earlier(out / "checkpoints", out)
    train_path = Path(cfg.data.path)
    # 1. Data.
    train_rows, test_rows = write_data(args, cfg, console)

    # 2. What plan predicts for the recipe on this machine.
    from ..device import cpu_class, device_name, pick_device, pick_precision
    from ..recipes.predict import local_prediction

    device = pick_device(cfg.compute.device)
    precision = pick_precision(cfg.compute.precision, device)
    machine = (
        f"{device_name(device)}, {cpu_class() if device.type == 'cpu' else 'cuda'} class, computes in {precision.name}"
    )
    prediction = local_prediction(cfg)
    console.print(f"[bold]machine[/]: {machine}")
    console.print(f"[bold]plan[/] for the recipe ({len(train_rows):,} rows): {describe(prediction)}")

    # 3. Base accuracy, on the first rows.
    base_rows = test_rows[: args.base_rows]
    base = None if args.skip_base else score(cfg, base_rows, adapter=None)
    if base is not None:
        console.print(
            f"[bold]base model[/]: {base['accuracy']:.1%} exact match on {len(base_rows)} of the {len(test_rows)} "
            f"held-out rows ({base['seconds']:.0f} s)"
        )

    # Fit training to what the budget leaves: the tuned model's scoring takes at most the base model's per row (a
    # tuned model stops at its EOS, the base model runs to each batch's budget), over every held-out row.
    scoring_s = base["seconds"] * len(test_rows) / len(base_rows) if base is not None else SCORING_RESERVE_S
    left_s = args.minutes * 60 - END_SLACK_S - (time.perf_counter() - started) - scoring_s - SETUP_RESERVE_S
    cfg, prediction = cut_to_budget(args, cfg, console, train_rows, train_path, prediction, left_s)
    predicted_train_s = train_s(prediction)

    # 4. Train.
    from ..recipes import entry

    summary = entry.train(cfg).as_dict()
    peak = training_peak(summary, start_rss if device.type == "cpu" else None)

    # 5. Tuned accuracy, stored beside the adapter.
    tuned = score(cfg, test_rows, adapter=out / "adapter")
    write_atomic(out / "eval.json", [json.dumps(results(base, tuned, summary, prediction, peak), indent=2) + "\n"])
    show(console, base, tuned, summary, prediction, predicted_train_s, peak)
    console.print(f"[bold]demo[/]: {(time.perf_counter() - started) / 60:.1f} min from data generation to this table")

    # 6. Optionally, the accuracy-against-time curve from the kept checkpoints.
    if args.curve_every:
        curve(args, cfg, console, test_rows, base, tuned, summary)


def write_data(args: argparse.Namespace, cfg, console) -> tuple[list[dict], list[dict]]:
    """1-8 digit additions, every digit-count pair equally likely; the test set shares no problem."""
    train_path, test_path = Path(cfg.data.path), Path(cfg.run.output_dir) / "data" / "test.jsonl"
    digits = arithmetic.parse_digit_range(args.digits)
    cells = arithmetic.grid(["add"], digits, digits)
    train_rows = arithmetic.sample(cells, args.train_rows, TEST_TEMPLATES, cfg.run.seed, args.response)
    test_rows = arithmetic.held_out(cells, args.test_rows, TEST_TEMPLATES, cfg.run.seed, train_rows, args.response)
    for path, rows in ((train_path, train_rows), (test_path, test_rows)):
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, (json.dumps(r) + "\n" for r in rows))
    console.print(
        f"[bold]data[/]: {len(train_rows):,} training and {len(test_rows)} held-out additions "
        f"({args.digits} digits) in {train_path.parent}"
    )
    return train_rows, test_rows


def cut_to_budget(
    args: argparse.Namespace, cfg, console, train_rows: list[dict], train_path: Path, prediction, left_s: float
):
    """(config, prediction) for the rows training gets: all of them when plan says they fit `left_s`, else
    OVERSUPPLY times the first rows that fit, at a micro-batch lowered to keep enough optimizer steps within the
    budget; the rows file is cut to them. The prediction is for the run under its time limit."""
    from ..recipes.predict import local_prediction

    rows = rows_within_budget(len(train_rows), train_s(prediction), prediction.overheads.compile_s, left_s)
    if rows < len(train_rows):
        if rows < MIN_TRAIN_ROWS:
            need = MIN_TRAIN_ROWS / len(train_rows) * (train_s(prediction) - prediction.overheads.compile_s)
            raise TunelabError(
                f"--minutes {args.minutes:g} leaves {max(left_s, 0) / 60:.1f} min for training here, room for {rows:,} "
                f"rows; the recipe needs at least {MIN_TRAIN_ROWS:,} rows (~{need / 60:.1f} min of training) to learn "
                f"anything: raise --minutes"
            )
        console.print(
            f"[bold yellow]budget[/]: plan predicts {train_s(prediction) / 60:.1f} min of training for "
            f"{len(train_rows):,} rows on this machine, over the {left_s / 60:.1f} min that --minutes "
            f"{args.minutes:g} leaves; {rows:,} rows fit (--minutes "
            f"{math.ceil(args.minutes + (train_s(prediction) - left_s) / 60)} runs the whole recipe)"
        )
        cfg, rows = smaller_batch_within(cfg, console, train_rows[:rows], train_path, left_s)
        given = min(len(train_rows), max(MIN_TRAIN_ROWS, math.ceil(rows * OVERSUPPLY)))
        console.print(
            f"[bold]budget[/]: training gets {given:,} rows, ending when the measured pace says the schedule, "
            "fitted to the time left, is done"
        )
        train_rows = train_rows[:given]
        write_atomic(train_path, (json.dumps(r) + "\n" for r in train_rows))
    cfg = with_time_limit(cfg, left_s)
    prediction = local_prediction(cfg)
    console.print(f"[bold]plan[/] for {len(train_rows):,} rows within the limit: {describe(prediction)}")
    return cfg, prediction


def smaller_batch_within(cfg, console, rows: list[dict], train_path: Path, left_s: float):
    """(config, rows that fit `left_s`): the micro-batch lowered while the rows that fit would make fewer than
    MIN_STEPS optimizer steps (on an fp32 CPU many small steps learn more than a few large ones), and the rows
    fitted again at it, where each row costs more (more steps, more launches per token)."""
    from ..recipes.predict import local_prediction

    write_atomic(train_path, (json.dumps(r) + "\n" for r in rows))
    steps = local_prediction(cfg).work.optimizer_steps
    micro_batch = smaller_micro_batch(cfg.batch.micro_batch, steps)
    if micro_batch == cfg.batch.micro_batch:
        return cfg, len(rows)
    console.print(
        f"[bold yellow]budget[/]: micro-batch {cfg.batch.micro_batch} -> {micro_batch}, so that the rows that fit "
        f"make ~{steps * cfg.batch.micro_batch // micro_batch} optimizer steps rather than {steps}"
    )
    cfg = dataclasses.replace(cfg, batch=dataclasses.replace(cfg.batch, micro_batch=micro_batch))
    prediction = local_prediction(cfg)
    return cfg, rows_within_budget(len(rows), train_s(prediction), prediction.overheads.compile_s, left_s)


def with_time_limit(cfg, left_s: float):
    """The config with training limited to `left_s` (run.max_minutes, or the config's own limit if shorter) and
    its learning-rate schedule fitted to that limit on the measured pace (run.schedule_within_limit): a machine
    slower than plan says decays its schedule to an earlier end instead of being cut near its peak."""
    minutes = max(left_s, 1.0) / 60  # 0 would mean no limit
    if cfg.run.max_minutes:
        minutes = min(minutes, cfg.run.max_minutes)
    return dataclasses.replace(cfg, run=dataclasses.replace(cfg.run, max_minutes=minutes, schedule_within_limit=True))


def training_peak(summary, start_rss: int | None) -> int:
    """The training's peak memory as plan counts it. On CPU (`start_rss` given): the peak RSS while training,
    above the RSS this process had before it loaded any model. The run's own figure is relative to the RSS at
    its start, which here comes after the base model's scoring, whose freed pages the allocator keeps and
    training then reuses: it read 1.19 GiB where a fresh process measures 1.97."""
    if start_rss is None:
        return summary["peak_memory_bytes"]
    return max(summary["peak_memory_absolute_bytes"] - start_rss, summary["peak_memory_bytes"])


def results(base: dict | None, tuned: dict, summary: dict, prediction, peak: int) -> dict:
    """eval.json: both accuracies, what training measured and what plan predicted."""
    return {
        "base": base,
        "tuned": tuned,
        "train": {
            **{
                k: summary[k]
                for k in (
                    "steps",
                    "total_steps",
                    "time_limited",
                    "loss_first",
                    "loss_last",
                    "train_s",
                    "tokens_nonpad_per_s",
                    "tokens_padded_per_s",
                    "tokens_loss_per_s",
                )
            },
            "schedule_steps": summary.get("schedule_steps"),
            "peak_memory_bytes": peak,
            "run_peak_memory_bytes": summary["peak_memory_bytes"],
        },
        "predicted": {
            "train_s": train_s(prediction),
            "tokens_padded_per_s": prediction.speed.tokens_per_s,
            "peak_memory_bytes": prediction.memory.total,
        },
    }


def curve(args: argparse.Namespace, cfg, console, test_rows: list[dict], base, tuned: dict, summary: dict) -> None:
    """curve.json and curve.png: accuracy against training minutes, from the base, each kept checkpoint, the end."""
    out = Path(cfg.run.output_dir)
    points = [(0.0, base["accuracy"])] if base is not None else []
    points += [(s.elapsed_s / 60, acc) for s, acc in score_checkpoints(cfg, test_rows, out / "checkpoints")]
    points.append((summary["train_s"] / 60, tuned["accuracy"]))
    write_atomic(out / "curve.json", [json.dumps([{"train_minutes": m, "accuracy": a} for m, a in points]) + "\n"])
    from ..report.plots import accuracy_curve

    accuracy_curve(
        {f"{cfg.adapter.method} r {cfg.adapter.lora.r}, {args.train_rows:,} rows": points}, out / "curve.png"
    )
    console.print("[bold]curve[/]: " + ", ".join(f"{a:.1%} at {m:.1f} min" for m, a in points))


def train_s(prediction) -> float:
    """plan's training time as the loop measures it: torch.compile's first steps included."""
    return prediction.speed.train_s + prediction.overheads.compile_s


def describe(prediction) -> str:
    return (
        f"{prediction.work.optimizer_steps} steps, {prediction.speed.tokens_per_s:,.0f} tokens/s fed, training "
        f"{train_s(prediction) / 60:.1f} min (compile {prediction.overheads.compile_s:.0f} s of it), peak memory "
        f"{gib(prediction.memory.total)} ({prediction.efficiency.label})"
    )


def smaller_micro_batch(micro_batch: int, steps: int) -> int:
    """The micro-batch, halved while the run would make fewer than MIN_STEPS optimizer steps: one epoch's steps
    grow as the micro-batch shrinks (the same packed rows, fewer per step)."""
    while micro_batch // 2 >= MIN_MICRO_BATCH and steps < MIN_STEPS:
        micro_batch //= 2
        steps *= 2
    return micro_batch


def rows_within_budget(rows: int, predicted_s: float, fixed_s: float, budget_s: float) -> int:
    """How many of `rows` train within `budget_s`, when training all of them is predicted to take `predicted_s`
    of which `fixed_s` (compilation) does not scale with the rows: one epoch's steps are proportional to them."""
    if predicted_s <= budget_s:
        return rows
    per_row = (predicted_s - fixed_s) / rows
    return max(0, int((budget_s - fixed_s) / per_row))


def score(cfg: cfgmod.TrainConfig, rows: list[dict], adapter: Path | None) -> dict:
    """Exact match on `rows` with the training prompt; the model is loaded fresh with SDPA attention."""
    from ..eval.generate import evaluate

    model, tokenizer = _base_for_eval(cfg)
    if adapter is not None:
        from ..model.adapters import load_adapter

        model = load_adapter(model, adapter, cfg.model)
    return evaluate(model, tokenizer, rows, cfg.data.format, cfg.data.template).summary()


def score_checkpoints(cfg: cfgmod.TrainConfig, rows: list[dict], folder: Path) -> list[tuple[TrainState, float]]:
    """(counters, exact match) of every kept checkpoint, each loaded into one model and scored like the final adapter."""
    from ..eval.generate import evaluate
    from ..model.adapters import apply_adapter
    from ..train.checkpoint import list_checkpoints, load_weights

    model, tokenizer = _base_for_eval(cfg)
    model = apply_adapter(model, cfg.adapter)
    results = []
    for path in list_checkpoints(folder):
        state = load_weights(path, model)
        results.append((state, evaluate(model, tokenizer, rows, cfg.data.format, cfg.data.template).accuracy))
    return results


def _base_for_eval(cfg: cfgmod.TrainConfig):
    """The base model in the compute dtype with transformers' default attention (left-padded generation), and
    its tokenizer."""
    from ..device import pick_device, pick_precision
    from ..model.load import load_model
    from ..sources import load_tokenizer, resolve

    device = pick_device(cfg.compute.device)
    source = resolve(cfg.model)
    return load_model(source, pick_precision(cfg.compute.precision, device).compute, "none", device), load_tokenizer(
        source
    )


def show(
    console, base: dict | None, tuned: dict, summary: dict, prediction, predicted_train_s: float, peak: int
) -> None:
    from rich.table import Table

    table = Table(title="exact match on held-out additions, by the longer operand's digit count")
    table.add_column("digits", justify="right")
    table.add_column("n", justify="right")
    table.add_column("base", justify="right")
    table.add_column("tuned", justify="right")
    for key, bucket in sorted(tuned["by_digits"].items(), key=lambda kv: int(kv[0])):
        before = base["by_digits"].get(key, {}).get("accuracy") if base else None
        table.add_row(
            str(key), str(bucket["n"]), "-" if before is None else f"{before:.0%}", f"{bucket['accuracy']:.0%}"
        )
    table.add_row(
        "all", str(tuned["n"]), "-" if base is None else f"{base['accuracy']:.1%}", f"{tuned['accuracy']:.1%}"
    )
    if base is not None and base["n"] < tuned["n"]:
        table.caption = f"base: the first {base['n']} of the {tuned['n']} rows"
    console.print(table)

    from ..figures import FIGURES

    shown = Table(title="this run: measured beside plan's prediction")
    for col in ("", "measured", "predicted"):
        shown.add_column(col, justify="right")
    measured = {**summary, "peak_memory_bytes": peak}
    predicted = {
        "train_s": predicted_train_s,
        "steps": prediction.work.optimizer_steps,
        "tokens_padded_per_s": prediction.speed.tokens_per_s,
        "peak_memory_bytes": prediction.memory.total,
    }
    for key, figure in FIGURES.items():  # labels, units and formats as the page and docs/metrics.md show them
        shown.add_row(figure.label, figure.text(measured.get(key)), figure.text(predicted.get(key)))
    console.print(shown)
    if summary.get("schedule_steps") and not summary["time_limited"]:
        console.print(
            f"[bold]schedule[/]: fitted to the time left on the measured pace, its learning rate decayed to its end "
            f"at step {summary['schedule_steps']:,} (the rows make {summary['total_steps']:,})"
        )
    if summary["time_limited"]:
        console.print(
            f"[bold yellow]budget[/]: training stopped at its time limit after {summary['steps']:,} of "
            f"{summary['total_steps']:,} steps: this machine ran slower than plan predicted"
        )


if __name__ == "__main__":
    sys.exit(main())
