"""`tunelab bench SUBCOMMAND`: measure the real training path on this device beside plan's prediction and store
every record (`run`, `sweep`, `profile`, `peers`, `suite`); fit this device's calibration (`calibrate`); export
the database (`export`); fit plan's step-time constants to the measured rows (`fit`).

Parses each subcommand's options, reads the config and prints: the measuring loops are bench/loops.py's (each point
recipes/finetune.py's `train` in a fresh process, bench/points.py), the tables bench/console.py's.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

from .. import config as cfgmod
from ..bench import console, loops, peer_registry, store
from ..bench.fitting import ROWS
from ..bench.points import FORCED, json_view, slug
from ..errors import TunelabError
from ..io import check_output_dir, check_output_file, write_atomic

DEFAULT_STEPS = 5
CALIBRATE_STEPS = 3  # short windows: calibration must stay within ~60-90 s on a 2-core CPU
DEFAULT_OUTPUT = "runs/bench"
# bench's flag form before its subcommands: each mode flag, and the subcommand that replaced it.
MOVED = {
    "--sweep": "sweep --axis KEY=V1,V2",
    "--calibrate": "calibrate",
    "--peer": "peers NAME[,NAME]",
    "--peers": "peers NAME[,NAME]",
    "--suite": "suite NAME",
    "--suite-rows": "suite NAME --rows NAME[,NAME]",
    "--profile": "profile DIR",
    "--export": "export csv|json",
}
# The flag form's options, which now follow a subcommand.
OPTIONS = ("--config", "--steps", "--warmup", "--json", "--db", "--catalog-gpu", "--methods", "--rounds", "--out")


class _Moved(argparse.Action):
    """A flag of the old form before any subcommand: it and what follows it are kept for run()'s one-line error."""

    def __call__(self, parser, namespace, values, option_string=None):
        namespace.moved = [option_string, *values]


def add_arguments(p: argparse.ArgumentParser) -> None:
    """`bench run|sweep|profile|calibrate|peers|suite|export|fit`, each with its own options; KEY=VALUE
    overrides of the config follow the subcommand."""
    p.set_defaults(overrides=[], mode=None, moved=None)
    p.add_argument(*MOVED, *OPTIONS, dest="moved", nargs=argparse.REMAINDER, action=_Moved, help=argparse.SUPPRESS)
    modes = p.add_subparsers(dest="mode", metavar="SUBCOMMAND")

    def mode(name: str, help_text: str) -> argparse.ArgumentParser:
        return modes.add_parser(name, help=help_text, description=help_text)

    point = mode("run", "measure the config's training at its own settings")
    measured_options(point, DEFAULT_STEPS)
    sweep = mode("sweep", "measure a grid of settings, one point per combination")
    sweep.add_argument(
        "--axis",
        action="append",
        required=True,
        metavar="KEY=V1,V2",
        help="a key and its values (micro_batch, seq_len, packing, grad_ckpt, method, precision, ...); repeat for "
        "a grid",
    )
    measured_options(sweep, DEFAULT_STEPS)
    profile = mode("profile", "measure the config's point, then profile a few of its steps in another run")
    profile.add_argument("dir", metavar="DIR", help="where ops.txt, trace.json.gz and profile.json go")
    measured_options(profile, DEFAULT_STEPS)
    calibrate = mode("calibrate", "measure this device per method for `plan --gpu local`")
    calibrate.add_argument(
        "--methods", help="methods to measure, comma-separated (default: the config's, then full, or lora for full)"
    )
    measured_options(calibrate, CALIBRATE_STEPS, " per method")
    peers = mode("peers", "run peer recipes side by side with tunelab, interleaved")
    peers.add_argument(
        "names",
        metavar="NAME[,NAME]",
        help=", ".join(p.label for p in peer_registry.REGISTRY.values()),
    )
    peers.add_argument("--rounds", type=int, default=2, help="interleaved rounds: tunelab, peers, tunelab, ... (2)")
    measured_options(peers, DEFAULT_STEPS)
    suite = mode("suite", "run a benchmark suite; writes <out>/<suite>_<device>_<date>.json and .md")
    suite.add_argument("suite", metavar="NAME|FILE.yaml", help="a suite of bench/suites.yaml (gpu, cpu, ...) or a file")
    suite.add_argument(
        "--rows",
        metavar="NAME[,NAME]",
        help="only these rows (and the peers, with the row they follow); the files' names carry the rows, so the "
        "parts of one suite run in several calls stay apart",
    )
    suite.add_argument("--out", help="the folder for its files (default benchmarks)")
    stored_options(suite)
    export = mode("export", "print (or --out) the stored runs")
    export.add_argument("format", choices=("csv", "json"))
    export.add_argument("--out", help="write to this file (atomically) instead of stdout")
    stored_options(export)
    fit = mode("fit", "fit plan's step-time constants to the measured rows and show how close plan comes to each")
    fit.add_argument("--rows", default=ROWS, metavar="DIR", help=f"the folder of row files (default {ROWS})")
    fit.add_argument(
        "--write",
        action="store_true",
        help="store the fits in plan's catalog (plan/catalog/fitted.yaml, and grpo.yaml for the GRPO runs the row files name)",
    )
    fit.add_argument(
        "--published",
        action="append",
        metavar="FILE",
        help="instead of the fit: plan against the published runs of FILE (repeat for more; e.g. "
        "../shared/published-dev.yaml), uncalibrated, and each stack's error table (count, median |error|, share "
        "within 20%%, tokens/s and memory)",
    )


def measured_options(p: argparse.ArgumentParser, steps: int, each: str = "") -> None:
    """The options of a subcommand that measures the config's training."""
    p.add_argument("--config", help="training config YAML (the same file `tunelab train` reads)")
    p.add_argument("--steps", type=int, default=steps, help=f"measured optimizer steps{each} after warm-up ({steps})")
    p.add_argument("--warmup", type=int, default=2, help="steps excluded from the steady-state window (2)")
    p.add_argument("--json", action="store_true", help="one JSON line per measured point")
    stored_options(p)


def stored_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--db", help=f"results database (default <output_dir>/bench.sqlite; output_dir {DEFAULT_OUTPUT})")
    p.add_argument("--catalog-gpu", help="GPU catalog id whose dense peak applies, when the device matches none")


def run(args: argparse.Namespace) -> int:
    if args.moved:
        raise TunelabError(moved(args.moved))
    if args.mode is None:
        raise TunelabError(f"name a subcommand: {', '.join(SUBCOMMANDS)} (`tunelab bench SUBCOMMAND --help`)")
    return SUBCOMMANDS[args.mode](args)


def moved(given: list[str]) -> str:
    """The one-line answer to bench's old flag form."""
    flag = next((t for t in given if t in MOVED), None)
    if flag is not None:
        return f"`bench {flag}` is now a subcommand: tunelab bench {MOVED[flag]} [options] [KEY=VALUE ...]"
    return f"{given[0]} goes after a subcommand, e.g. `tunelab bench run {given[0]} ...` ({', '.join(SUBCOMMANDS)})"


# ---- measuring --------------------------------------------------------------------------------------------


def measuring(args: argparse.Namespace) -> tuple[loops.Measuring, Path]:
    """How the subcommand's points are measured and where they are stored; bench's output folder."""
    if args.steps < 1 or args.warmup < 0:
        raise TunelabError(f"--steps must be at least 1 and --warmup at least 0, got {args.steps} and {args.warmup}")
    base_dir = Path(output_dir(args.overrides))
    db = database(args.db, base_dir)
    store.check(db)
    return loops.Measuring(args.steps, args.warmup, db, args.catalog_gpu, args.json), base_dir


def run_point(args: argparse.Namespace) -> int:
    return run_points(args, [("", [])])


def run_sweep(args: argparse.Namespace) -> int:
    return run_points(args, loops.sweep_points(args.axis))


def run_profile(args: argparse.Namespace) -> int:
    check_output_dir(Path(args.dir), "DIR")
    return run_points(args, [("", [])], Path(args.dir))


def run_points(args: argparse.Namespace, points: list[tuple[str, list[str]]], profile: Path | None = None) -> int:
    """One point or a sweep's grid, each measured, stored and shown."""
    m, base_dir = measuring(args)
    configs = [(label, point_config(args, extra, base_dir / (slug(label) or "run"))) for label, extra in points]
    records, failed = loops.measure_points(configs, m, profile)
    if not records:
        raise TunelabError(f"every point of the sweep ran out of memory; the first: {next(iter(failed.values()))[0]}")
    if not args.json:
        if len(points) == 1:
            console.show_single(records[0], m.db)
        else:
            console.show_sweep(records, m.db, [label for label, _ in points], failed)
    return 0


def run_peers(args: argparse.Namespace) -> int:
    names = loops.peer_names(args.names)
    m, base_dir = measuring(args)
    rows = loops.peer_rounds(point_config(args, [], base_dir / "tunelab"), names, args.rounds, m)
    if args.json:
        for row in rows:
            print(json.dumps(row), flush=True)
    elif rows and "completions_per_s" in rows[0]:
        console.show_grpo_comparison(rows, m.db)
    else:
        console.show_comparison(rows, m.db)
    return 0


def run_calibration(args: argparse.Namespace) -> int:
    m, base_dir = measuring(args)
    first = point_config(args, [], base_dir / "calibrate")
    configs = [
        point_config(args, [f"method={x}"], base_dir / f"calibrate-{x}")
        for x in loops.calibration_methods(first.adapter.method, args.methods)
    ]

    def as_run(method: str, compiled: bool) -> cfgmod.TrainConfig:
        return point_config(args, [f"method={method}", f"compile={str(compiled).lower()}"], base_dir / "model")

    c = loops.calibrate_device(configs, as_run, m)
    if args.json:
        print(
            json.dumps({"calibration": asdict(c.record), "path": str(c.path), "runs": [json_view(r) for r in c.runs]})
        )
    else:
        console.show_calibration(c.record, c.points, c.path, m.db)
    return 0


def run_suite(args: argparse.Namespace) -> int:
    from ..bench import suite
    from ..bench.suite_schema import SuiteOptions

    if args.out:
        check_output_dir(Path(args.out), "--out")
    base_dir = Path(output_dir(args.overrides))
    db = database(args.db, base_dir)
    store.check(db)
    options = SuiteOptions(args.suite, args.rows, args.out, tuple(args.overrides), args.catalog_gpu)
    return suite.run(options, base_dir, db)


# ---- configs -------------------------------------------------------------------------------------------


def output_dir(overrides: list[str]) -> str:
    """Bench writes under runs/bench unless output_dir= is given: a config's own output_dir holds a real
    run, whose metrics and summary a bench must not overwrite."""
    given = [o.partition("=")[2] for o in overrides if o.partition("=")[0].strip() == "output_dir"]
    return given[-1] if given else DEFAULT_OUTPUT


def database(given: str | None, base_dir: Path) -> Path:
    """The results database: --db, or bench.sqlite in bench's output folder."""
    return Path(given) if given else base_dir / "bench.sqlite"


def point_config(args: argparse.Namespace, extra: list[str], out: Path) -> cfgmod.TrainConfig:
    # Config errors (bad sweep values included) surface here, before any point has run.
    return cfgmod.load_config(args.config, [*args.overrides, *extra, *FORCED, f"output_dir={out}"])


# ---- stored runs and the fit -------------------------------------------------------------------------------


def export(args: argparse.Namespace) -> int:
    db = database(args.db, Path(output_dir(args.overrides)))
    if args.out is not None:
        check_output_file(Path(args.out), "--out")
    if not db.is_file():
        raise TunelabError(f"{db}: no results database there; run `tunelab bench run` first or pass --db")
    text = store.export(store.query(db), args.format)
    if args.out is None:
        sys.stdout.write(text)
        return 0
    write_atomic(Path(args.out), [text])
    return 0


def run_fit(args: argparse.Namespace) -> int:
    """The fit of the row files' rows, every row predicted in and out of it; with --write, stored in plan's
    catalog (a file that already holds it is left as it is)."""
    import yaml

    from ..bench import fitting
    from ..plan import fit

    if args.overrides:
        raise TunelabError(f"bench fit reads no training config; drop {args.overrides[0]}")
    if args.published:
        return published_table([Path(p) for p in args.published])
    result = fitting.run(Path(args.rows))
    for line in result.left_out:
        print(line, file=sys.stderr)
    print("\n".join([*fitting.rows_table(result.rows()), "", *fitting.constants_table(result.devices())]))
    grpo = fitting.grpo_table(result)
    if grpo:
        print("\n".join(["", *grpo]))
    shipped_grpo = yaml.safe_load(fit.GRPO_FITTED.read_text()) if fit.GRPO_FITTED.exists() else {}
    documents = [(result.catalog(), fit.FITTED)]
    if result.grpo:  # GRPO's constants with the rest, where the row files name GRPO runs
        documents.append((result.grpo_catalog(shipped_grpo), fit.GRPO_FITTED))
    for document, target in documents:
        if args.write:
            changed = fit.write_catalog(document, target)
            print(f"{'wrote' if changed else 'unchanged'}: {target}")
        else:
            shipped = target.read_text() if target.exists() else ""
            same = fit.catalog_text(document, shipped) == shipped
            print(f"{target}: {'holds this fit' if same else 'differs from this fit; --write stores it'}")
    return 0


def published_table(paths: list[Path]) -> int:
    """Each published case beside plan, then each stack's errors (bench/published.py); nothing is fitted."""
    from ..bench import published

    rows = published.rows(paths)
    print("\n".join([*published.rows_table(rows), "", *published.summary_table(published.summary(rows))]))
    return 0


SUBCOMMANDS = {
    "run": run_point,
    "sweep": run_sweep,
    "profile": run_profile,
    "calibrate": run_calibration,
    "peers": run_peers,
    "suite": run_suite,
    "export": export,
    "fit": run_fit,
}
