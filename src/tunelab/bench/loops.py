"""The measuring loops of `tunelab bench run|sweep|profile|peers|calibrate`: each point trained in a fresh
process (points.measure_point) beside plan's prediction for it, stored, and with `as_json` printed as one JSON
line; progress goes to stderr. The command builds the configs and prints the tables (bench/console.py)."""

from __future__ import annotations

import itertools
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .. import methods, objectives
from ..config import TrainConfig
from ..errors import OutOfMemory, TunelabError
from ..recipes.predict import local_prediction
from . import calibrate, measure, peer_registry, store
from .compare import compare
from .console import show_profile
from .points import (
    build_record,
    check_length,
    device_peak,
    json_view,
    measure_peer,
    measure_point,
    point_peak,
    slug,
)
from .profile import PROFILED_STEPS, profile_length, profile_point


@dataclass(frozen=True)
class Measuring:
    """How each point is measured and where its record goes."""

    steps: int  # measured optimizer steps after the warm-up
    warmup: int  # steps left out of the steady-state window
    db: Path
    catalog_gpu: str | None  # the catalog GPU whose peak applies when the device matches none
    as_json: bool

    @property
    def stop_at(self) -> int:
        return self.warmup + self.steps


def sweep_points(specs: list[str]) -> list[tuple[str, list[str]]]:
    """--axis micro_batch=4,8 --axis packing=true,false -> [(label, overrides)] over the full grid."""
    axes = []
    for spec in specs:
        key, sep, values = spec.partition("=")
        items = [v.strip() for v in values.split(",") if v.strip()]
        if not sep or not key.strip() or not items:
            raise TunelabError(f"--axis {spec!r}: expected KEY=V1,V2,... e.g. micro_batch=4,8,16")
        axes.append([f"{key.strip()}={v}" for v in items])
    return [(" ".join(combo), list(combo)) for combo in itertools.product(*axes)] if axes else [("", [])]


def measure_points(
    points: list[tuple[str, TrainConfig]], m: Measuring, profile: Path | None = None
) -> tuple[list[dict], dict[str, tuple[str, int]]]:
    """(records, the points that ran out of memory: label -> (message, plan's peak memory)). A sweep goes on past
    a point that runs out of memory (the limit it may be looking for); a single point raises. With `profile`, a
    few steps of each point are profiled in another run into that folder (a point's own subfolder in a sweep)."""
    peaks: dict[str, measure.Peak] = {}
    records, failed = [], {}
    for i, (label, cfg) in enumerate(points, 1):
        if len(points) > 1 and not m.as_json:
            print(f"[{i}/{len(points)}] {label}", file=sys.stderr, flush=True)
        prediction = local_prediction(cfg)
        check_length(prediction, m.stop_at)
        if profile:
            check_length(prediction, profile_length(m.warmup, min(m.steps, PROFILED_STEPS)))
        try:
            summary = measure_point(cfg, m.stop_at, m.warmup)
        except OutOfMemory as e:
            if len(points) == 1:
                raise
            failed[label] = (str(e), prediction.memory.total)
            if m.as_json:
                print(json.dumps({"label": label, "error": str(e)}), flush=True)
            else:
                print(f"[{i}/{len(points)}] {label}: {e}", file=sys.stderr, flush=True)
            continue
        peak = point_peak(peaks, cfg.compute.device, summary, m.catalog_gpu)
        rec = build_record(label, summary, peak, prediction, m.warmup, cfg)
        store.insert(m.db, rec)
        records.append(rec)
        if m.as_json:
            print(json.dumps(json_view(rec)), flush=True)
        if profile:
            where = profile / (slug(label) if len(points) > 1 else "")
            show_profile(profile_point(cfg, m.warmup, min(m.steps, PROFILED_STEPS), where), where, m.as_json)
    return records, failed


def peer_names(given: str) -> list[str]:
    """`hf-trainer-tuned,trl-sft` -> the peers, each one bench knows (bench/peer_registry.py)."""
    names = [n.strip() for n in given.split(",") if n.strip()]
    if not names or any(n not in peer_registry.REGISTRY for n in names):
        raise TunelabError(f"peers {given!r}: known peers are {', '.join(peer_registry.NAMES)}")
    return names


def grpo_peer_rounds(cfg: TrainConfig, names: list[str], rounds: int, m: Measuring) -> list[dict]:
    """tunelab's GRPO and trl-grpo interleaved `rounds` times (bench/grpo_peer.py), each run stored in the results
    database as every bench record is (its completion figures under `generation`); tunelab over the peer."""
    from . import grpo_peer

    records = grpo_peer.grpo_rounds(
        cfg, rounds, m.stop_at, m.warmup, log=lambda line: print(line, file=sys.stderr, flush=True)
    )
    for r in records:
        store.insert(m.db, grpo_peer.store_row(r, cfg, m.warmup))
    return grpo_peer.compare_grpo(records)


def peer_rounds(cfg: TrainConfig, names: list[str], rounds: int, m: Measuring) -> list[dict]:
    """tunelab and each peer in turn, `rounds` times, each run in a fresh process, each stored; then each peer
    beside tunelab (bench/compare.py's rows).

    Interleaving spreads a shared machine's drift over every side instead of favouring whichever ran first.
    """
    from . import peers

    if rounds < 1:
        raise TunelabError(f"--rounds must be at least 1, got {rounds}")
    generates = objectives.get(cfg.objective.name).generates
    peer_registry.check_runs_beside(names, generates)
    if generates:
        return grpo_peer_rounds(cfg, names, rounds, m)
    prediction = local_prediction(cfg)
    check_length(prediction, m.stop_at)
    peak, records = None, []
    for round_ in range(1, rounds + 1):
        print(f"[round {round_}/{rounds}] tunelab", file=sys.stderr, flush=True)
        summary = measure_point(cfg, m.stop_at, m.warmup)
        peak = peak or device_peak(cfg.compute.device, summary, m.catalog_gpu)
        rec = build_record(f"tunelab round {round_}", summary, peak, prediction, m.warmup, cfg)
        store.insert(m.db, rec)
        records.append(rec)
        for name in names:
            print(f"[round {round_}/{rounds}] {name}", file=sys.stderr, flush=True)
            peer_rec = measure_peer(name, cfg, m.stop_at, m.warmup)
            store.insert(m.db, peers.store_record(peer_rec, f"peer {name} round {round_}"))
            records.append(peer_rec)
    return compare(records)


def calibration_methods(config_method: str, given: str | None) -> list[str]:
    """The config's method first (its run also gives the memory overhead), then one of the other FLOP count
    (the first registry method that trains the base if the config's does not, else the first that does not),
    so plan has a measured step for both the frozen-base and the all-weights work."""
    if given:
        names = [m.strip() for m in given.split(",") if m.strip()]
        bad = [m for m in names if m not in methods.REGISTRY]
        if bad or not names:
            raise TunelabError(f"--methods {given!r}: choose from {', '.join(methods.NAMES)}")
        return names
    trains_base = methods.get(config_method).trains_base
    other = next(m.name for m in methods.REGISTRY.values() if m.trains_base != trains_base)
    return [config_method, other]


@dataclass(frozen=True)
class Calibration:
    record: object  # plan.calibration.CalibrationRecord
    points: list[calibrate.Point]
    path: Path  # where the record was saved
    runs: list[dict]  # the measured records


def calibrate_device(
    configs: list[TrainConfig], as_run: Callable[[str, bool], TrainConfig], m: Measuring
) -> Calibration:
    """Measure each config (one per method), fit the device's calibration record and save it. `as_run(method,
    compiled)` is the config of a point as it really ran (eager or compiled blocks): the step model alone is
    priced for it, at the record's peak."""
    from ..plan.calibration import device_key, load_calibration, save_calibration

    peak, points, records = None, [], []
    for cfg in configs:
        prediction = local_prediction(cfg)
        check_length(prediction, m.stop_at)
        if not m.as_json:
            print(f"calibrating {cfg.adapter.method}: {m.warmup} + {m.steps} steps", file=sys.stderr, flush=True)
        summary = measure_point(cfg, m.stop_at, m.warmup)
        peak = peak or device_peak(cfg.compute.device, summary, m.catalog_gpu)
        chosen = bool((summary.get("compile") or {}).get("chosen"))
        modeled = local_prediction(
            as_run(cfg.adapter.method, chosen), peak.flops, calibrated=False, bandwidth_bps=peak.bandwidth or None
        )
        points.append(
            calibrate.Point(
                cfg.adapter.row.key(cfg.adapter.quant),
                summary["tokens_padded_per_s"],
                prediction.flops,
                summary["peak_memory_bytes"],
                prediction.memory.total - prediction.memory.runtime_overhead,
                summary.get("step_time_median_s") or summary["step_time_s"],
                modeled.model_step_s,
                chosen,
            )
        )
        rec = build_record(f"calibrate method={cfg.adapter.method}", summary, peak, prediction, m.warmup, cfg)
        store.insert(m.db, rec)
        records.append(rec)
    key = device_key(records[0]["device"])
    record = calibrate.fit(key, records[0]["device"], peak, points, load_calibration(key))
    return Calibration(record, points, save_calibration(record), records)
