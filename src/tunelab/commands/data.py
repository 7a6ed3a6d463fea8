"""`tunelab data SUBCOMMAND`: dataset tools. Each subcommand registers its parser and handler in SUBCOMMANDS."""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from .. import sources
from ..config import FORMATS, TEMPLATES
from ..data import arithmetic as ar
from ..data import synthetic as sy
from ..errors import TunelabError
from ..eval.setup import read_rows, resolve_setup
from ..io import check_output_file, write_atomic


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="data_command", required=True, metavar="SUBCOMMAND")
    for name, (help_text, add, handler) in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        add(p)
        p.set_defaults(data_handler=handler)


def run(args: argparse.Namespace) -> int:
    return args.data_handler(args)


def _add_arithmetic(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", required=True, help="training rows, written as jsonl")
    p.add_argument("--preset", choices=["goat"], help="goat: Goat's 304,000-row addition set (digit pairs up to 15x15)")
    p.add_argument("--ops", help=f"operations, comma-separated from {','.join(ar.OPS)} (default add)")
    p.add_argument("--digits", help="digit-count range of both operands, e.g. 1-8 (default 1-8)")
    p.add_argument("--digits-a", help="digit-count range of the first operand (overrides --digits)")
    p.add_argument("--digits-b", help="digit-count range of the second operand; n x 1 multiplication is --digits-b 1")
    p.add_argument("--n", type=int, help="number of training rows (default 10000)")
    p.add_argument(
        "--templates",
        default=",".join(ar.TEMPLATES),
        help=f"instruction wordings drawn per row, from {','.join(ar.TEMPLATES)} (default all)",
    )
    p.add_argument(
        "--response",
        default="expression",
        choices=ar.RESPONSES,
        help="expression: Goat's 'a + b = c' (default); cot: Goat's chain of thought for multi-digit "
        "multiplication; answer: the result alone (about a third of the response tokens on additions)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--contaminate", type=float, metavar="RATE", help="corrupt this fraction of training answers")
    p.add_argument("--contamination-type", default="random", choices=ar.CONTAMINATION_TYPES)
    p.add_argument(
        "--pairs",
        action="store_true",
        help="write preference pairs for objective dpo/orpo: {prompt, chosen: the correct output, rejected: a near miss}",
    )
    p.add_argument(
        "--prompts",
        action="store_true",
        help="write prompt rows for objective grpo: {instruction, answer, ...} without the output the model writes",
    )
    p.add_argument("--test-out", help="also write a held-out set sharing no problem with the training rows")
    p.add_argument("--test-n", type=int, default=1000, help="rows in the held-out set (default 1000)")


def _arithmetic(args: argparse.Namespace) -> int:
    check_output_file(Path(args.out), "--out")
    if args.test_out:
        check_output_file(Path(args.test_out), "--test-out")
    templates = ar.parse_choices(args.templates, tuple(ar.TEMPLATES), "--templates")
    if args.preset == "goat":
        given = [f for f in ("ops", "digits", "digits_a", "digits_b", "n") if getattr(args, f) is not None]
        if given:
            raise TunelabError(
                f"--preset goat fixes the operations, digits and size; drop --{given[0].replace('_', '-')}"
            )
        cells = [ar.Cell("add", i, j) for i, j in ar.goat_pairs()]
        rows = ar.sample_each(cells, ar.GOAT_SAMPLES_PER_PAIR, templates, args.seed, args.response, swap=True)
    else:
        ops = ar.parse_choices(args.ops or "add", ar.OPS, "--ops")
        both = ar.parse_digit_range(args.digits or "1-8")
        digits_a = ar.parse_digit_range(args.digits_a, "--digits-a") if args.digits_a else both
        digits_b = ar.parse_digit_range(args.digits_b, "--digits-b") if args.digits_b else both
        n = 10000 if args.n is None else args.n
        if n < 1:
            raise TunelabError(f"--n {n}: need at least one row")
        cells = ar.grid(ops, digits_a, digits_b)
        rows = ar.sample(cells, n, templates, args.seed, args.response)
    test_rows = None
    if args.test_out:
        if args.test_n < 1:
            raise TunelabError(f"--test-n {args.test_n}: need at least one row")
        # Drawn before contamination, from the true problems, and left clean: eval compares against the truth.
        test_rows = ar.held_out(
            cells, args.test_n, templates, args.seed, rows, args.response, swap=args.preset == "goat"
        )
    note = ""
    if args.contaminate is not None:
        k = ar.contaminate(rows, args.contaminate, args.contamination_type, args.seed)
        note = f", {k} contaminated ({args.contamination_type})"
    if args.pairs and args.prompts:
        raise TunelabError("--pairs and --prompts are exclusive; write pairs (dpo, orpo) or prompts (grpo)")
    if args.pairs:
        rows = ar.preference_pairs(rows, args.seed)
        note += " as preference pairs"
    if args.prompts:
        rows = ar.prompt_rows(rows)
        note += " as prompts"
    write_atomic(Path(args.out), _jsonl(rows))
    print(f"wrote {len(rows)} rows to {args.out}{note}")
    if test_rows is not None:
        write_atomic(Path(args.test_out), _jsonl(test_rows))
        print(f"wrote {len(test_rows)} held-out rows to {args.test_out}")
    return 0


def _add_synthetic(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", required=True, help="alpaca rows (instruction, empty input, output), written as jsonl")
    p.add_argument("--rows", type=int, required=True, help="number of rows")
    p.add_argument(
        "--prompt-tokens",
        required=True,
        metavar="A-B",
        help="token range of each instruction, by the embedded SmolLM2 tokenizer, e.g. 64-512",
    )
    p.add_argument("--response-tokens", required=True, metavar="C-D", help="token range of each output, e.g. 32-256")
    p.add_argument(
        "--dist",
        default="triangular",
        help=f"length distribution within each range: {' or '.join(sy.DISTS)} (default triangular)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--pairs",
        action="store_true",
        help="write preference rows {prompt, chosen, rejected} (objective dpo or orpo) instead: two responses per "
        "prompt, each drawn from --response-tokens",
    )


def _synthetic(args: argparse.Namespace) -> int:

    check_output_file(Path(args.out), "--out")
    prompt = sy.parse_range(args.prompt_tokens, "--prompt-tokens")
    response = sy.parse_range(args.response_tokens, "--response-tokens")
    sy.check(args.rows, args.dist)  # before the tokenizer's seconds of loading
    rows = sy.generate(args.rows, prompt, response, args.dist, args.seed, sources.embedded_tokenizer(), args.pairs)
    try:
        write_atomic(Path(args.out), _jsonl(rows))
    except OSError as e:
        raise TunelabError(f"--out {args.out}: cannot write there ({e.strerror}); choose another path") from None
    means = [sy.expected_mean(args.dist, *span) for span in (prompt, response)]
    kind, per = ("pairs", "response, two per prompt") if args.pairs else ("rows", "output")
    print(
        f"wrote {len(rows)} {kind} to {args.out}: {args.dist} SmolLM2-token lengths in {prompt[0]}-{prompt[1]} "
        f"(mean {means[0]:.0f}) per instruction and {response[0]}-{response[1]} (mean {means[1]:.0f}) per {per}"
    )
    return 0


def _add_pairs(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--data",
        required=True,
        help="jsonl rows with an `answer` and the reference response (e.g. the SFT run's training rows)",
    )
    p.add_argument("--out", required=True, help="preference pairs {prompt, chosen, rejected, answer}, as jsonl")
    p.add_argument(
        "--adapter",
        help="the model's adapter (RUN/adapter or RUN/checkpoints/step-N); its run's config gives the base model, "
        "format and template, as for `tunelab eval`",
    )
    p.add_argument("--model", help="base model: embedded, an HF directory (e.g. a merged SFT model), a .gguf file")
    p.add_argument("--format", choices=FORMATS, help="row format (default: the run's, else alpaca)")
    p.add_argument("--template", choices=TEMPLATES, help="alpaca prompt template (default: the run's, else alpaca)")
    p.add_argument("--limit", type=int, help="use only the first N rows")
    p.add_argument("--samples", type=int, default=4, help="completions sampled per prompt (default 4)")
    p.add_argument(
        "--temperature", type=float, default=1.0, help="sampling temperature; 0 is greedy, one sample (default 1.0)"
    )
    p.add_argument("--seed", type=int, default=0, help="the sampler's seed")
    p.add_argument("--batch-size", type=int, help="completions generated at a time (default: tunelab eval's)")
    p.add_argument(
        "--max-new-tokens",
        type=int,
        help="the generation cap (default as `tunelab eval`: the adapter's longest trained response plus slack)",
    )
    p.add_argument("--device", default="auto")
    p.add_argument("--precision", default="auto", choices=["auto", "bf16", "fp16", "fp32"])


def _pairs(args: argparse.Namespace) -> int:
    """Sample the model on prompts whose answers are known; write its wrong answers as the rejected side."""
    from ..eval.onpolicy import Sampling, check_sampling

    check_output_file(Path(args.out), "--out")
    for name in ("limit", "batch_size", "max_new_tokens"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise TunelabError(f"--{name.replace('_', '-')} {value}: must be at least 1")
    setup = resolve_setup(args.adapter, args.model, args.format, args.template)
    rows = read_rows(Path(args.data), setup.format, args.limit)
    from ..eval.generate import DEFAULT_BATCH_SIZE

    batch = args.batch_size or DEFAULT_BATCH_SIZE
    sampling = Sampling(args.samples, args.temperature, args.seed, batch, args.max_new_tokens)
    check_sampling(sampling)

    from ..device import pick_device, pick_precision
    from ..eval.onpolicy import sample_pairs
    from ..recipes.generation import load_for_generation, run_folder, trained_response_tokens

    device = pick_device(args.device)
    model, tokenizer = load_for_generation(setup, args.adapter, device, pick_precision(args.precision, device))
    if args.adapter:
        trained = trained_response_tokens(run_folder(Path(args.adapter), setup))
        sampling = dataclasses.replace(sampling, trained_response_tokens=trained)
    started = time.perf_counter()
    pairs, counts = sample_pairs(model, tokenizer, rows, setup.format, setup.template, sampling, args.data)
    write_atomic(Path(args.out), _jsonl(pairs))
    print(
        f"wrote {counts.pairs} pairs to {args.out} from {len(rows)} prompts x {sampling.samples} samples at "
        f"temperature {sampling.temperature:g} in {time.perf_counter() - started:.0f} s: {counts.line()}"
    )
    return 0


def _jsonl(rows: Sequence[dict]) -> Iterator[str]:
    return (json.dumps(row) + "\n" for row in rows)


# name -> (help, add_arguments, handler)
SUBCOMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]]] = {
    "arithmetic": (
        "generate Goat-style arithmetic rows (add, sub, mul, div), optionally contaminated",
        _add_arithmetic,
        _arithmetic,
    ),
    "synthetic": (
        "generate alpaca rows of English words at token lengths drawn from a distribution",
        _add_synthetic,
        _synthetic,
    ),
    "pairs": (
        "write on-policy preference pairs (dpo, orpo): a model's own wrong answers to prompts with known answers, "
        "each against the reference response",
        _add_pairs,
        _pairs,
    ),
}
