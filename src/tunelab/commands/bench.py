"""`tunelab bench`: measure the real training path on this device, beside plan's prediction; store every
record; fit the device's calibration (`--calibrate`); export the database (`--export`).

Reads the config and flags and prints; each point is measured by bench/points.py (recipes/train.py's `train`
in a fresh process).
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from dataclasses import asdict
from pathlib import Path

from .. import config as cfgmod
from ..bench import calibrate, measure, store
from ..bench.compare import compare
from ..bench.points import (
    FORCED,
    build_record,
    check_length,
    device_peak,
    json_view,
    measure_peer,
    measure_point,
    point_peak,
    slug,
    step_stats,
)
from ..bench.profile import PROFILED_STEPS, profile_length, profile_point
from ..errors import OutOfMemory, TunelabError
from ..io import check_output_dir, check_output_file, gib, write_atomic
from ..recipes.predict import local_prediction

DEFAULT_STEPS = 5
CALIBRATE_STEPS = 3  # short windows: calibration must stay within ~60-90 s on a 2-core CPU
DEFAULT_OUTPUT = "runs/bench"


class _Modes(argparse._SubParsersAction):
    """bench's modes as subcommands; a first positional that names no mode is a KEY=VALUE override of the flag
    form (`tunelab bench micro_batch=8 --sweep ...`), and the arguments after it are bench's own again."""

    class _AnyFirst(dict):
        """argparse's choice check of the first positional: every one passes (one that names no mode is an override)."""

        def __contains__(self, key) -> bool:
            return True

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.choices = self._AnyFirst()

    def __call__(self, parser, namespace, values, option_string=None):
        if values[0] in self._name_parser_map:
            return super().__call__(parser, namespace, values, option_string)
        namespace.overrides = [*namespace.overrides, values[0]]
        _, extra = parser.parse_known_args(values[1:], namespace)
        if extra:  # argparse's own place for them: parse_known_args returns them to the caller
            namespace._unrecognized_args = [*getattr(namespace, "_unrecognized_args", []), *extra]


def add_arguments(p: argparse.ArgumentParser) -> None:
    """`bench run|sweep|calibrate|peers|suite|profile|export`, each with its own options; the flag form
    (`bench --sweep ...`, `bench --suite gpu`) still works. KEY=VALUE overrides go anywhere."""
    p.set_defaults(overrides=[], mode=None)
    _flag_form(p)
    modes = p.add_subparsers(dest="mode", metavar="MODE", action=_Modes)
    common = argparse.ArgumentParser(add_help=False, argument_default=argparse.SUPPRESS)
    common.add_argument("--config", help="training config YAML (the same file `tunelab train` reads)")
    common.add_argument("--warmup", type=int, help="steps excluded from the steady-state window (default 2)")
    common.add_argument("--json", action="store_true", help="one JSON line per measured point")
    common.add_argument(
        "--db", help=f"results database (default <output_dir>/bench.sqlite; output_dir {DEFAULT_OUTPUT})"
    )
    common.add_argument("--catalog-gpu", help="GPU catalog id whose dense peak applies, when the device matches none")
    steps = argparse.ArgumentParser(add_help=False, argument_default=argparse.SUPPRESS)
    steps.add_argument("--steps", type=int, help=f"measured optimizer steps after warm-up (default {DEFAULT_STEPS})")

    def mode(name: str, help_text: str, *parents: argparse.ArgumentParser) -> argparse.ArgumentParser:
        return modes.add_parser(
            name, help=help_text, description=help_text, parents=list(parents), argument_default=argparse.SUPPRESS
        )

    mode("run", "measure the config's training at its own settings", common, steps)
    sweep = mode("sweep", "measure a grid of settings", common, steps)
    sweep.add_argument(
        "--axis", dest="sweep", action="append", required=True, metavar="KEY=V1,V2", help="a key and its values; repeat"
    )
    calibrate = mode("calibrate", "fit this device's efficiency per method for `plan --gpu local`", common)
    calibrate.add_argument("--steps", type=int, help=f"measured steps per method (default {CALIBRATE_STEPS})")
    calibrate.add_argument("--methods", help="methods to measure, comma-separated (default: the config's and full)")
    calibrate.set_defaults(calibrate=True)
    peers = mode("peers", "run peer recipes side by side, interleaved with tunelab", common, steps)
    peers.add_argument(
        "names", metavar="NAME[,NAME]", help="hf-trainer-seed, hf-trainer-tuned, hf-trainer-liger, trl-sft, trl-dpo"
    )
    peers.add_argument("--rounds", type=int, help="interleaved rounds (tunelab, peers, tunelab, ...; default 2)")
    suite = mode("suite", "run a benchmark suite of bench/suites.yaml (gpu, cpu, cpu-steps, ...) or of a suites file")
    suite.add_argument("suite", metavar="NAME|FILE.yaml")
    suite.add_argument("--rows", dest="suite_rows", metavar="NAME[,NAME]", help="run only these rows")
    suite.add_argument("--out", help="the folder for its files (default benchmarks)")
    suite.add_argument("--db", help="results database")
    profile = mode("profile", "measure, then profile a few steps of another run into DIR", common, steps)
    profile.add_argument("profile", metavar="DIR")
    export = mode("export", "print (or --out) the stored runs instead of measuring")
    export.add_argument("export", choices=("csv", "json"))
    export.add_argument("--out", help="write to this file (atomically) instead of stdout")
    export.add_argument("--db", help="results database")


def _flag_form(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="training config YAML (the same file `tunelab train` reads)")
    p.add_argument(
        "--steps",
        type=int,
        help=f"measured optimizer steps after warm-up (default {DEFAULT_STEPS}; "
        f"{CALIBRATE_STEPS} per method with --calibrate)",
    )
    p.add_argument("--warmup", type=int, default=2, help="steps excluded from the steady-state window (default 2)")
    p.add_argument(
        "--sweep",
        action="append",
        metavar="KEY=V1,V2",
        help="measure a grid: repeat for more keys (micro_batch, seq_len, packing, grad_ckpt, method, precision, ...)",
    )
    p.add_argument("--json", action="store_true", help="one JSON line per measured point")
    p.add_argument(
        "--db", help=f"results database (default <output_dir>/bench.sqlite, output_dir defaults to {DEFAULT_OUTPUT})"
    )
    p.add_argument("--catalog-gpu", help="GPU catalog id whose dense peak applies, when the device name matches no row")
    p.add_argument(
        "--calibrate",
        action="store_true",
        help="fit this device's efficiency per method and memory overhead for `plan --gpu local`",
    )
    p.add_argument(
        "--methods",
        help="with --calibrate: methods to measure, comma-separated (default: the config's and full, or lora)",
    )
    p.add_argument(
        "--peer",
        metavar="NAME[,NAME]",
        help="also run peer recipes side by side, interleaved with tunelab: hf-trainer-seed, hf-trainer-tuned, hf-trainer-liger (CUDA), trl-sft, trl-dpo (objective dpo: equal pairs per step)",
    )
    p.add_argument(
        "--rounds", type=int, default=2, help="with --peer: interleaved rounds (tunelab, peers, tunelab, ...)"
    )
    p.add_argument("--export", choices=("csv", "json"), help="print (or --out) the stored runs instead of measuring")
    p.add_argument(
        "--suite",
        metavar="NAME|FILE.yaml",
        help="run a benchmark suite of bench/suites.yaml (gpu, cpu, cpu-steps, ...) or of a suites file; "
        "writes <out>/<suite>_<device>_<date>.json and .md",
    )
    p.add_argument(
        "--suite-rows",
        metavar="NAME[,NAME]",
        help="with --suite: run only these rows (and the peers, with the row they follow); the files' names "
        "carry the rows, so the parts of one suite run in several calls stay apart",
    )
    p.add_argument(
        "--profile",
        metavar="DIR",
        help="after each measured point, profile a few of its steps in another run and write ops.txt, "
        "trace.json.gz and profile.json (host vs device time per step) to DIR",
    )
    p.add_argument(
        "--out",
        help="with --export: write to this file (atomically) instead of stdout; "
        "with --suite: the folder for its files (default benchmarks)",
    )


def run(args: argparse.Namespace) -> int:
    if args.mode == "peers":
        args.peer = args.names
    if args.export:
        return export(args)
    if args.suite:
        return run_suite(args)
    if args.out:
        raise TunelabError("--out goes with --export or --suite")
    if args.suite_rows:
        raise TunelabError("--suite-rows goes with --suite")
    steps = args.steps if args.steps is not None else (CALIBRATE_STEPS if args.calibrate else DEFAULT_STEPS)
    if steps < 1 or args.warmup < 0:
        raise TunelabError(f"--steps must be at least 1 and --warmup at least 0, got {steps} and {args.warmup}")
    base_dir = Path(output_dir(args.overrides))
    db = database(args, base_dir)
    if args.profile and (args.calibrate or args.peer):
        raise TunelabError("--profile goes with a plain bench or --sweep, not with --calibrate or --peer")
    if args.profile:
        check_output_dir(Path(args.profile), "--profile")
    store.check(db)
    if args.calibrate:
        if args.sweep:
            raise TunelabError("--calibrate measures the config's own settings; drop --sweep")
        return run_calibration(args, steps, base_dir)
    if args.peer:
        if args.sweep:
            raise TunelabError("--peer compares at the config's own settings; drop --sweep")
        return run_peers(args, steps, base_dir, db)
    return run_points(args, steps, base_dir, db)


def run_points(args: argparse.Namespace, steps: int, base_dir: Path, db: Path) -> int:
    """A plain bench (one point) or a sweep's grid, each point measured, stored and shown; with --profile, each
    profiled too."""
    points = sweep_points(args.sweep or [])
    configs = [point_config(args, extra, base_dir / (slug(label) or "run")) for label, extra in points]
    records, failed = measure_points(args, steps, points, configs, db)
    if not records:
        raise TunelabError(f"every point of the sweep ran out of memory; the first: {next(iter(failed.values()))[0]}")
    if not args.json:
        if len(points) == 1:
            show_single(records[0], db)
        else:
            show_sweep(records, db, [label for label, _ in points], failed)
    return 0


def measure_points(args: argparse.Namespace, steps: int, points: list, configs: list, db: Path):
    """(records, the points that ran out of memory: label -> (message, plan's peak memory))."""
    peaks: dict[str, measure.Peak] = {}
    records = []
    # A sweep's points that ran out of memory (the limit it may be looking for): message, plan's peak memory.
    failed: dict[str, tuple[str, int]] = {}
    for i, ((label, _), cfg) in enumerate(zip(points, configs), 1):
        if len(points) > 1 and not args.json:
            print(f"[{i}/{len(points)}] {label}", file=sys.stderr, flush=True)
        prediction = local_prediction(cfg)
        check_length(prediction, args.warmup + steps)
        if args.profile:
            check_length(prediction, profile_length(args.warmup, min(steps, PROFILED_STEPS)))
        try:
            summary = measure_point(cfg, args.warmup + steps, args.warmup)
        except OutOfMemory as e:
            if len(points) == 1:
                raise
            failed[label] = (str(e), prediction.memory.total)
            if args.json:
                print(json.dumps({"label": label, "error": str(e)}), flush=True)
            else:
                print(f"[{i}/{len(points)}] {label}: {e}", file=sys.stderr, flush=True)
            continue
        peak = point_peak(peaks, cfg.compute.device, summary, args.catalog_gpu)
        rec = build_record(label, summary, peak, prediction, args.warmup, cfg)
        store.insert(db, rec)
        records.append(rec)
        if args.json:
            print(json.dumps(json_view(rec)), flush=True)
        if args.profile:
            where = Path(args.profile) / (slug(label) if len(points) > 1 else "")
            show_profile(profile_point(cfg, args.warmup, min(steps, PROFILED_STEPS), where), where, args.json)
    return records, failed


def run_suite(args: argparse.Namespace) -> int:
    from ..bench import suite
    from ..bench.suite_schema import SuiteOptions

    clashing = [
        flag
        for flag, given in (
            ("--config", args.config),
            ("--steps", args.steps is not None),
            ("--sweep", args.sweep),
            ("--peer", args.peer),
            ("--calibrate", args.calibrate),
            ("--profile", args.profile),
        )
        if given
    ]
    if clashing:
        raise TunelabError(f"--suite defines its own rows, steps and peers; drop {', '.join(clashing)}")
    if args.out:
        check_output_dir(Path(args.out), "--out")
    base_dir = Path(output_dir(args.overrides))
    db = database(args, base_dir)
    store.check(db)
    options = SuiteOptions(args.suite, args.suite_rows, args.out, tuple(args.overrides), args.catalog_gpu)
    return suite.run(options, base_dir, db)


def run_peers(args: argparse.Namespace, steps: int, base_dir: Path, db: Path) -> int:
    """tunelab and each peer in turn, `--rounds` times, each run in a fresh process; then the ratios.

    Interleaving spreads a shared machine's drift over every side instead of favouring whichever ran first.
    """
    from ..bench import peers

    names = [n.strip() for n in args.peer.split(",") if n.strip()]
    unknown = [n for n in names if n not in peers.PEERS]
    if unknown or not names:
        raise TunelabError(f"--peer {args.peer!r}: known peers are {', '.join(peers.PEERS)}")
    if args.rounds < 1:
        raise TunelabError(f"--rounds must be at least 1, got {args.rounds}")
    cfg = point_config(args, [], base_dir / "tunelab")
    prediction = local_prediction(cfg)
    check_length(prediction, args.warmup + steps)
    peak = None
    records = []
    for round_ in range(1, args.rounds + 1):
        print(f"[round {round_}/{args.rounds}] tunelab", file=sys.stderr, flush=True)
        summary = measure_point(cfg, args.warmup + steps, args.warmup)
        peak = peak or device_peak(cfg.compute.device, summary, args.catalog_gpu)
        rec = build_record(f"tunelab round {round_}", summary, peak, prediction, args.warmup, cfg)
        store.insert(db, rec)
        records.append(rec)
        for name in names:
            print(f"[round {round_}/{args.rounds}] {name}", file=sys.stderr, flush=True)
            peer_rec = measure_peer(name, cfg, args.warmup + steps, args.warmup)
            store.insert(db, peers.store_record(peer_rec, f"peer {name} round {round_}"))
            records.append(peer_rec)
    rows = compare(records)
    if args.json:
        for row in rows:
            print(json.dumps(row), flush=True)
    else:
        show_comparison(rows, db)
    return 0


# ---- configs -------------------------------------------------------------------------------------------


def output_dir(overrides: list[str]) -> str:
    """Bench writes under runs/bench unless output_dir= is given: a config's own output_dir holds a real
    run, whose metrics and summary a bench must not overwrite."""
    given = [o.partition("=")[2] for o in overrides if o.partition("=")[0].strip() == "output_dir"]
    return given[-1] if given else DEFAULT_OUTPUT


def database(args: argparse.Namespace, base_dir: Path) -> Path:
    """The results database: --db, or bench.sqlite in bench's output folder."""
    return Path(args.db) if args.db else base_dir / "bench.sqlite"


def sweep_points(specs: list[str]) -> list[tuple[str, list[str]]]:
    """--sweep micro_batch=4,8 --sweep packing=true,false -> [(label, overrides)] over the full grid."""
    axes = []
    for spec in specs:
        key, sep, values = spec.partition("=")
        items = [v.strip() for v in values.split(",") if v.strip()]
        if not sep or not key.strip() or not items:
            raise TunelabError(f"--sweep {spec!r}: expected KEY=V1,V2,... e.g. micro_batch=4,8,16")
        axes.append([f"{key.strip()}={v}" for v in items])
    return [(" ".join(combo), list(combo)) for combo in itertools.product(*axes)] if axes else [("", [])]


def point_config(args: argparse.Namespace, extra: list[str], out: Path) -> cfgmod.TrainConfig:
    # Config errors (bad sweep values included) surface here, before any point has run.
    return cfgmod.load_config(args.config, [*args.overrides, *extra, *FORCED, f"output_dir={out}"])


# ---- calibration -----------------------------------------------------------------------------------------


def calibration_methods(config_method: str, given: str | None) -> list[str]:
    """The config's method first (its run also gives the memory overhead), then full (or lora) so plan has a
    measured efficiency for both the frozen-base and the all-weights FLOP counts."""
    if given:
        methods = [m.strip() for m in given.split(",") if m.strip()]
        bad = [m for m in methods if m not in cfgmod.METHODS]
        if bad or not methods:
            raise TunelabError(f"--methods {given!r}: choose from {', '.join(cfgmod.METHODS)}")
        return methods
    return [config_method, "lora" if config_method == "full" else "full"]


def run_calibration(args: argparse.Namespace, steps: int, base_dir: Path) -> int:
    from ..plan.calibration import device_key, load_calibration, save_calibration
    from ..plan.timing import method_key

    db = database(args, base_dir)
    first = point_config(args, [], base_dir / "calibrate")
    configs = [
        point_config(args, [f"method={m}"], base_dir / f"calibrate-{m}")
        for m in calibration_methods(first.method, args.methods)
    ]
    peak, points, records = None, [], []
    for cfg in configs:
        prediction = local_prediction(cfg)
        check_length(prediction, args.warmup + steps)
        if not args.json:
            print(f"calibrating {cfg.adapter.method}: {args.warmup} + {steps} steps", file=sys.stderr, flush=True)
        summary = measure_point(cfg, args.warmup + steps, args.warmup)
        peak = peak or device_peak(cfg.compute.device, summary, args.catalog_gpu)
        s = prediction.settings
        # The step model alone, at the record's peak, for the blocks the run really had (eager or compiled)
        chosen = bool((summary.get("compile") or {}).get("chosen"))
        as_run = point_config(
            args, [f"method={cfg.adapter.method}", f"compile={str(chosen).lower()}"], base_dir / "model"
        )
        modeled = local_prediction(as_run, peak.flops, calibrated=False, bandwidth_bps=peak.bandwidth or None)
        points.append(
            calibrate.Point(
                method_key(s.method, s.base_quant),
                summary["tokens_padded_per_s"],
                prediction.flops,
                summary["peak_memory_bytes"],
                prediction.memory.total - prediction.memory.runtime_overhead,
                summary.get("step_time_median_s") or summary["step_time_s"],
                modeled.model_step_s,
                chosen,
            )
        )
        rec = build_record(f"calibrate method={cfg.adapter.method}", summary, peak, prediction, args.warmup, cfg)
        store.insert(db, rec)
        records.append(rec)
    key = device_key(records[0]["device"])
    record = calibrate.fit(key, records[0]["device"], peak, points, load_calibration(key))
    path = save_calibration(record)
    if args.json:
        print(json.dumps({"calibration": asdict(record), "path": str(path), "runs": [json_view(r) for r in records]}))
    else:
        show_calibration(record, points, path, db)
    return 0


# ---- output --------------------------------------------------------------------------------------------


def export(args: argparse.Namespace) -> int:
    db = database(args, Path(output_dir(args.overrides)))
    if args.out is not None:
        check_output_file(Path(args.out), "--out")
    if not db.is_file():
        raise TunelabError(f"{db}: no results database there; run `tunelab bench` first or pass --db")
    text = store.export(store.query(db), args.export)
    if args.out is None:
        sys.stdout.write(text)
        return 0
    write_atomic(Path(args.out), [text])
    return 0


def _console():
    from rich.console import Console

    return Console(highlight=False)


def show_profile(found: dict, where: Path, as_json: bool) -> None:
    """One line on where the profiled steps' time went (stderr, so --json output stays one record a line)."""
    line = (
        f"profile: {where} ({found['steps']} steps of {found['step_wall_s']:.3f} s: host operators "
        f"{found['host_op_s_per_step']:.3f} s"
    )
    if found["device"] == "cpu":
        line += f", {found['aten_ops_per_step']:,.0f} operators per step)"
    else:
        verdict = "host-bound" if found["host_bound"] else "device-bound"
        line += (
            f", device busy {found['device_busy_s_per_step']:.3f} s ({found['device_busy_share']:.0%}), "
            f"{found['kernel_launches_per_step']:,.0f} kernel launches per step: {verdict})"
        )
    print(line, file=sys.stderr if as_json else sys.stdout, flush=True)


def show_single(rec: dict, db: Path) -> None:
    from rich.table import Table

    t = Table(title=f"{rec['model']} {rec['method']} {rec['precision']} on {rec['device']}")
    for col in ("metric", "measured", "predicted", "measured / predicted"):
        t.add_column(col, justify="left" if col == "metric" else "right")
    for key, label, fmt in (
        ("tokens_padded_per_s", "tokens/s fed (padded; window)", "{:,.0f}"),
        ("tokens_nonpad_per_s", "tokens/s non-padding (window)", "{:,.0f}"),
        ("tokens_loss_per_s", "tokens/s with loss (window)", "{:,.0f}"),
        ("step_time_s", "step time (median, s)", "{:.3f}"),
        ("peak_memory_bytes", "peak memory", None),
    ):
        measured, predicted = rec[key], rec[f"predicted_{key}"]
        show = gib if fmt is None else fmt.format
        t.add_row(label, show(measured), show(predicted), f"{measured / predicted:.2f}")
    t.add_row("mfu useful (whole row)", store.mfu_text(rec), "", "")
    t.add_row("hfu", f"{rec['hfu']:.1%}", "", "")
    c = _console()
    c.print(t)
    probes = ", ".join(f"{k} {v / 1e12:.2f}" for k, v in rec["peak_probes"].items())
    copy = f"; copy probe {rec['device_bandwidth_bps'] / 1e9:.1f} GB/s" if rec.get("device_bandwidth_bps") else ""
    c.print(
        f"device peak {rec['device_peak_flops'] / 1e12:.2f} TFLOP/s ({rec['peak_source']}); probes TFLOP/s: {probes}"
        f"{copy}"
    )
    c.print(
        f"FLOPs/token (plan): {rec['model_flops_per_token'] / 1e9:.3f} G model, {rec['hardware_flops_per_token'] / 1e9:.3f} G hardware; "
        f"window: {rec['steps']} steps after {rec['warmup_steps']} warm-up"
    )
    c.print(f"tokens/s are window rates (tokens over the window's {rec['steady_window_s']:.2f} s); {step_stats(rec)}")
    if rec["peak_memory_reserved_bytes"] is None:
        c.print(
            f"peak memory: peak RSS minus RSS before model load (absolute peak RSS {gib(rec['peak_memory_absolute_bytes'])})"
        )
    else:
        c.print(f"peak memory: max allocated (max reserved {gib(rec['peak_memory_reserved_bytes'])})")
    c.print(f"prediction: plan --gpu local, {rec['predicted_source']}")
    c.print(f"stored in {db}")


def show_comparison(rows: list[dict], db: Path) -> None:
    from rich.table import Table

    t = Table(title="tunelab beside its peers (same model, data, machine; means over interleaved runs)")
    for col in (
        "peer",
        "peer non-pad tok/s",
        "tunelab non-pad tok/s",
        "tunelab / peer",
        "padded ratio",
        "loss-token ratio",
        "peer peak mem",
        "tunelab peak mem",
    ):
        t.add_column(col, justify="right")
    for r in rows:
        t.add_row(
            r["kind"],
            f"{r['tokens_nonpad_per_s']:,.1f}",
            f"{r['tunelab_tokens_nonpad_per_s']:,.1f}",
            f"{r['tokens_nonpad_ratio']:.2f}x",
            f"{r['tokens_padded_ratio']:.2f}x",
            f"{r['tokens_loss_ratio']:.2f}x",
            gib(r["peak_memory_bytes"]),
            gib(r["tunelab_peak_memory_bytes"]),
        )
    c = _console()
    c.print(t)
    c.print(f"stored in {db}")


def show_sweep(records: list[dict], db: Path, labels: list[str], failed: dict[str, tuple[str, int]]) -> None:
    """The sweep's points in their order; one that ran out of memory shows as such."""
    from rich.table import Table

    t = Table(title=f"sweep on {records[0]['device']}")
    for col in (
        "point",
        "tok/s fed (window)",
        "tok/s non-pad (window)",
        "step s (median)",
        "mfu useful (whole row)",
        "peak mem",
        "pred tok/s fed",
        "pred mem",
    ):
        t.add_column(col, justify="left" if col == "point" else "right")
    measured = {r["label"]: r for r in records}
    for label in labels:
        if label in failed:
            t.add_row(label, "out of memory", *[""] * 5, gib(failed[label][1]))
            continue
        r = measured[label]
        t.add_row(
            r["label"],
            f"{r['tokens_padded_per_s']:,.0f}",
            f"{r['tokens_nonpad_per_s']:,.0f}",
            f"{r['step_time_s']:.3f}",
            store.mfu_text(r),
            gib(r["peak_memory_bytes"]),
            f"{r['predicted_tokens_padded_per_s']:,.0f}",
            gib(r["predicted_peak_memory_bytes"]),
        )
    c = _console()
    c.print(t)
    c.print(
        "device peak per precision: "
        + "; ".join(
            sorted(
                {f"{r['precision']}: {r['device_peak_flops'] / 1e12:.2f} TFLOP/s ({r['peak_source']})" for r in records}
            )
        )
    )
    c.print(f"stored in {db}")


def show_calibration(record, points: list[calibrate.Point], path: Path, db: Path) -> None:
    from rich.table import Table

    t = Table(title=f"calibration of {record.device_name}")
    for col in ("method", "tok/s fed", "step / model's", "efficiency", "peak mem", "model w/o overhead", "gap"):
        t.add_column(col, justify="left" if col == "method" else "right")
    for p in points:
        scale = record.step_scale.get(calibrate.scale_key(p.method_key, p.compiled))
        t.add_row(
            p.method_key,
            f"{p.tokens_padded_per_s:,.0f}",
            f"{p.measured_step_s:.3f} / {p.model_step_s:.3f} s (x {scale:.3f})" if scale else "-",
            f"{record.efficiency[p.method_key]:.3f}",
            gib(p.peak_memory_bytes),
            gib(p.memory_without_overhead),
            gib(p.peak_memory_bytes - p.memory_without_overhead),
        )
    c = _console()
    c.print(t)
    c.print(
        f"peak {record.peak_flops / 1e12:.2f} TFLOP/s {record.peak_dtype}; runtime overhead "
        f"{gib(record.runtime_overhead_bytes)} (from the {points[0].method_key} run)"
    )
    c.print(f"saved {path}: `tunelab plan --gpu local` now uses it; runs stored in {db}")
