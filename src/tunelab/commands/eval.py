"""`tunelab eval`: exact-match accuracy of a base model, or a base plus a trained adapter, on a jsonl file.

With `--adapter RUN/adapter` the base model, data format and template come from the run's `RUN/config.yaml`
(what training used), so the prompt is the one the adapter learned; `--model/--format/--template` override.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

from .. import decoding
from ..config import FORMATS, TEMPLATES
from ..errors import TunelabError
from ..eval.exact_match import EvalResult
from ..eval.generate import DEFAULT_BATCH_SIZE
from ..eval.setup import read_rows, resolve_setup
from ..io import check_output_file, write_atomic


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data", help="jsonl rows with an `answer` (e.g. from `tunelab data arithmetic`)")
    parser.add_argument(
        "--tasks",
        help="comma-separated lm-evaluation-harness tasks (hellaswag,arc_easy, or your own under --tasks-path), "
        "scored on the base model and on the tuned one side by side; needs the lm-eval extra",
    )
    parser.add_argument(
        "--tasks-path", action="append", default=[], help="a folder of your own task YAML files (repeatable)"
    )
    parser.add_argument(
        "--base-model",
        help="with --tasks and a merged --model: the base it was tuned from, scored beside it",
    )
    parser.add_argument(
        "--adapter",
        help="a trained adapter (RUN/adapter) or a checkpoint of a run (RUN/checkpoints/step-N); without it the "
        "base model is scored",
    )
    parser.add_argument("--model", help="base model: embedded, an HF directory, a .gguf file or a cached hub id")
    parser.add_argument("--format", choices=FORMATS, help="row format (default: the run's, else alpaca)")
    parser.add_argument(
        "--template", choices=TEMPLATES, help="alpaca prompt template (default: the run's, else alpaca)"
    )
    parser.add_argument("--limit", type=int, help="score only the first N rows")
    parser.add_argument("--batch-size", type=int, default=DEFAULT_BATCH_SIZE)
    parser.add_argument(
        "--max-new-tokens",
        type=int,
        help="the generation cap; default: the longest response the adapter was trained on (its run's summary.json) "
        "plus slack, else per batch its longest expected response plus slack",
    )
    parser.add_argument(
        "--decode",
        choices=decoding.NAMES,
        default="dynamic",
        help="the decode loop: dynamic (default: eager, a growing KV cache), static (eager, a preallocated cache), "
        "compiled (static, the step compiled, CUDA graphs on CUDA: pays for its compile on large evaluations), "
        "auto (compiled on CUDA, dynamic elsewhere)",
    )
    parser.add_argument("--device", default="auto")
    parser.add_argument("--precision", default="auto", choices=["auto", "bf16", "fp16", "fp32"])
    parser.add_argument("--json", action="store_true", help="print one JSON line instead of a table")
    parser.add_argument("--out", help="also write the JSON summary to this file")
    parser.add_argument("--predictions", help="write every row's response and verdict to this jsonl file")


def run(args: argparse.Namespace) -> int:
    for name in ("limit", "batch_size", "max_new_tokens"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise TunelabError(f"--{name.replace('_', '-')} {value}: must be at least 1")
    if bool(args.data) == bool(args.tasks):
        raise TunelabError(
            "give --data (exact match on your rows) or --tasks (lm-evaluation-harness tasks), one of them"
        )
    if args.tasks:
        return run_tasks(args)
    for flag, path in (("--out", args.out), ("--predictions", args.predictions)):
        if path:
            check_output_file(Path(path), flag)
    setup = resolve_setup(args.adapter, args.model, args.format, args.template)
    rows = read_rows(Path(args.data), setup.format, args.limit)

    from ..device import device_name, out_of_memory, pick_device, pick_precision
    from ..eval.generate import evaluate
    from ..recipes.generation import load_for_generation, run_folder, trained_response_tokens

    device = pick_device(args.device)
    precision = pick_precision(args.precision, device)
    started = time.perf_counter()
    model, tokenizer = load_for_generation(setup, args.adapter, device, precision)
    load_seconds = time.perf_counter() - started
    try:
        trained = trained_response_tokens(run_folder(Path(args.adapter), setup)) if args.adapter else None
        result = evaluate(
            model,
            tokenizer,
            rows,
            setup.format,
            setup.template,
            args.batch_size,
            args.max_new_tokens,
            trained,
            decode=args.decode,
        )
    except Exception as e:
        if not out_of_memory(e):
            raise
        raise TunelabError(
            f"out of memory on {device_name(device)} generating {args.batch_size} rows at a time; "
            f"lower --batch-size (or --max-new-tokens)"
        ) from None

    summary = {
        **result.summary(),
        "load_seconds": round(load_seconds, 3),
        "data": args.data,
        "model": setup.model,
        "adapter": args.adapter,
        "format": setup.format,
        "template": setup.template,
        "precision": precision.name,
        "batch_size": args.batch_size,
    }
    if args.out:
        write_atomic(Path(args.out), [json.dumps(summary) + "\n"])
    if args.predictions:
        write_atomic(Path(args.predictions), (json.dumps(asdict(p)) + "\n" for p in result.predictions))
    if args.json:
        print(json.dumps(summary))
    else:
        _print_table(result, summary)
    return 0


def _print_table(result: EvalResult, summary: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    title = (
        f"{summary['model']}" + (f" + {summary['adapter']}" if summary["adapter"] else "") + f" on {summary['data']}"
    )
    table = Table(title=title, title_justify="left")
    for column in ("group", "n", "correct", "accuracy"):
        table.add_column(column, justify="left" if column == "group" else "right")
    table.add_row("all", str(result.n), str(result.correct), f"{result.accuracy:.1%}", style="bold")
    for label, buckets in (("op", result.by_op), ("digits", result.by_digits)):
        if buckets:
            table.add_section()
        for key, bucket in buckets.items():
            table.add_row(f"{label} {key}", str(bucket.n), str(bucket.correct), f"{bucket.accuracy:.1%}")
    console = Console(file=sys.stdout)
    console.print(table)
    console.print(
        f"{result.n} rows in {result.seconds:.1f} s ({summary['rows_per_s']} rows/s, batch {summary['batch_size']}, "
        f"{summary['precision']}); model load {summary['load_seconds']:.1f} s"
    )


def run_tasks(args: argparse.Namespace) -> int:
    """`--tasks`: the harness's scores of the base and of the tuned model (its adapter, or a merged --model beside
    --base-model), side by side."""
    from ..eval.harness import run_tasks as harness_scores
    from ..eval.harness import side_by_side, task_manager

    names = [t.strip() for t in args.tasks.split(",") if t.strip()]
    manager = task_manager(args.tasks_path, names)
    if args.out:
        check_output_file(Path(args.out), "--out")
    setup = resolve_setup(args.adapter, args.model, args.format, args.template)

    from ..device import pick_device, pick_precision
    from ..recipes.generation import load_for_generation, tune

    device = pick_device(args.device)
    precision = pick_precision(args.precision, device)
    columns: dict[str, dict] = {}
    if args.base_model and not args.adapter:
        base_setup = resolve_setup(None, args.base_model, None, None)
        model, tokenizer = load_for_generation(base_setup, None, device, precision)
        columns[f"base {args.base_model}"] = harness_scores(
            model, tokenizer, manager, names, args.limit, args.batch_size
        )
        del model
    model, tokenizer = load_for_generation(setup, None, device, precision)
    label = "base" if args.adapter else ("tuned" if args.base_model else "model")
    columns[f"{label} {setup.model}"] = harness_scores(model, tokenizer, manager, names, args.limit, args.batch_size)
    if args.adapter:
        model = tune(model, setup, args.adapter)
        columns[f"tuned {args.adapter}"] = harness_scores(model, tokenizer, manager, names, args.limit, args.batch_size)
    summary = {"tasks": names, "limit": args.limit, "scores": columns}
    if args.out:
        write_atomic(Path(args.out), [json.dumps(summary) + "\n"])
    if args.json:
        print(json.dumps(summary))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"lm-evaluation-harness: {', '.join(names)}", title_justify="left")
    for column in ("task", "metric", *columns, *(["change"] if len(columns) == 2 else [])):
        table.add_column(column, justify="left" if column in ("task", "metric") else "right")
    for row in side_by_side(columns):
        table.add_row(*row)
    Console(file=sys.stdout).print(table)
    return 0
