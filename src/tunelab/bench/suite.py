"""`tunelab bench --suite NAME`: a fixed set of benchmark rows (bench/suites.yaml) on whatever device is here,
tunelab and its peers interleaved in one run, written to `<out>/<suite>_<device>_<date>.{json,md}`.

Suites are data: each row is a training config (model, method, compile, grad_ckpt, micro-batch) over one
shared workload (synthetic alpaca rows generated once per run, seq_len, packing, LoRA settings). Every row runs
as `bench` runs a point (`points.measure_point`: the real training loop in a fresh process) and gets the same
record (`points.build_record`: window rates, step-time statistics, MFU, plan's prediction). A row that fails
(out of memory, a missing package) is recorded with its error and the suite goes on; so does a peer.
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import shutil
import sys
import time
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from .. import config as cfgmod
from ..errors import TunelabError
from ..io import read_text, write_atomic
from ..plan import arch as archmod
from ..plan.arch import RANDOM
from ..recipes.predict import local_prediction
from . import points, store
from .compare import compare

AUTO = "auto"
DEFAULT_OUT = "benchmarks"
# `auto` micro-batches fill this share of the device's memory by plan's count: plan's memory came within
# +-10% of the allocator's peak on every H100 baseline run, so the margin keeps a 10% underestimate from OOM.
AUTO_MEMORY_SHARE = 0.9
DEFAULT_CAP = 8
ROW_KEYS = {
    "name",
    "model",
    "method",
    "compile",
    "grad_ckpt",
    "micro_batch",
    "micro_batch_cap",
    "steps",
    "warmup",
    "shape",
    "config",
    "skip_reason",
}
SUITE_KEYS = {"description", "budget_s", "data", "config", "micro_batch_cap", "peers", "rows"}
DATA_KEYS = {"rows", "prompt_tokens", "response_tokens", "dist", "seed"}


@dataclass(frozen=True)
class Row:
    name: str
    model: str
    method: str
    compile: bool
    grad_ckpt: bool
    micro_batch: int | str
    micro_batch_cap: int
    steps: int
    warmup: int
    shape: dict = field(default_factory=dict)
    config: dict = field(default_factory=dict)
    skip_reason: str | None = None


@dataclass(frozen=True)
class Suite:
    name: str
    source: str
    definition: dict  # as read, for the output file
    data: dict
    config: dict
    rows: list[Row]
    peers_after: str | None
    peer_names: list[str]
    budget_s: float | None


# ---- reading suites --------------------------------------------------------------------------------------


def builtin_suites() -> dict:
    return yaml.safe_load(resources.files("tunelab.bench").joinpath("suites.yaml").read_text())["suites"]


def load_suite(ref: str) -> Suite:
    """A suite of bench/suites.yaml by name, or the one suite in a YAML file of the same form."""
    if ref.endswith((".yaml", ".yml")):
        path = Path(ref)
        if not path.is_file():
            raise TunelabError(f"--suite {ref}: file not found")
        try:
            suites = (yaml.safe_load(read_text(path)) or {}).get("suites")
        except (yaml.YAMLError, AttributeError) as e:
            raise TunelabError(
                f"--suite {ref}: not a suites file ({str(e).splitlines()[0] if str(e) else 'no mapping'})"
            ) from None
        if not isinstance(suites, dict) or len(suites) != 1:
            raise TunelabError(f"--suite {ref}: expected `suites:` holding exactly one suite")
        ((name, raw),) = suites.items()
        return parse_suite(name, raw, ref)
    suites = builtin_suites()
    if ref not in suites:
        raise TunelabError(f"--suite {ref!r}: known suites are {', '.join(suites)} (or pass a .yaml file)")
    return parse_suite(ref, suites[ref], "tunelab/bench/suites.yaml")


def parse_suite(name: str, raw: Any, source: str) -> Suite:
    from ..data import synthetic as sy

    where = f"suite {name} ({source})"
    if not isinstance(raw, dict):
        raise TunelabError(f"{where}: expected a mapping")
    _known(where, raw, SUITE_KEYS)
    data = _mapping(where, "data", raw.get("data"))
    _known(f"{where}: data", data, DATA_KEYS)
    missing = DATA_KEYS - {"seed", "dist"} - set(data)
    if missing:
        raise TunelabError(f"{where}: data needs {', '.join(sorted(missing))}")
    # The workload is generated only once the run starts: its parameters are checked before anything runs.
    _int(where, "data.rows", data["rows"], 1)
    _int(where, "data.seed", data.get("seed", 0), 0)
    for key in ("prompt_tokens", "response_tokens"):
        sy.parse_range(str(data[key]), f"{where}: data.{key}")
    if data.get("dist", "triangular") not in sy.DISTS:
        raise TunelabError(f"{where}: data.dist must be one of {', '.join(sy.DISTS)}, got {data['dist']!r}")
    cap = _int(where, "micro_batch_cap", raw.get("micro_batch_cap", DEFAULT_CAP), 1)
    listed = raw.get("rows") or []
    if not isinstance(listed, list):
        raise TunelabError(f"{where}: rows must be a list of rows, got {listed!r}")
    rows = [parse_row(where, r, cap) for r in listed]
    if not rows:
        raise TunelabError(f"{where}: no rows")
    names = [r.name for r in rows]
    if len(set(names)) != len(names):
        raise TunelabError(f"{where}: row names must be unique")
    peers = _mapping(where, "peers", raw.get("peers"))
    after = peers.get("after")
    if peers and after not in names:
        raise TunelabError(f"{where}: peers.after must name a row, got {after!r}")
    peer_names = peers.get("names") or []
    if not isinstance(peer_names, list) or not all(isinstance(n, str) for n in peer_names):
        raise TunelabError(f"{where}: peers.names must be a list of peer names, got {peer_names!r}")
    budget = raw.get("budget_s")
    if budget is not None and (isinstance(budget, bool) or not isinstance(budget, (int, float)) or budget <= 0):
        raise TunelabError(f"{where}: budget_s must be a positive number of seconds, got {budget!r}")
    return Suite(
        name,
        source,
        raw,
        data,
        _mapping(where, "config", raw.get("config")),
        rows,
        after,
        list(peer_names),
        budget,
    )


def parse_row(where: str, raw: Any, cap: int) -> Row:
    if not isinstance(raw, dict) or "name" not in raw:
        raise TunelabError(f"{where}: every row is a mapping with a name")
    _known(f"{where}: row {raw['name']}", raw, ROW_KEYS)
    missing = {"model", "method", "steps"} - set(raw)
    if missing:
        raise TunelabError(f"{where}: row {raw['name']} needs {', '.join(sorted(missing))}")
    here = f"{where}: row {raw['name']}"
    mb = raw.get("micro_batch", AUTO)
    if mb != AUTO and not (isinstance(mb, int) and not isinstance(mb, bool) and mb >= 1):
        raise TunelabError(f"{here}: micro_batch must be a positive integer or auto, got {mb!r}")
    shape = _mapping(here, "shape", raw.get("shape"))
    if shape and not str(raw["model"]).startswith(RANDOM):
        raise TunelabError(f"{here}: shape overrides a random: model's catalog shape; drop it for {raw['model']}")
    return Row(
        str(raw["name"]),
        str(raw["model"]),
        str(raw["method"]),
        _bool(here, "compile", raw.get("compile", False)),
        _bool(here, "grad_ckpt", raw.get("grad_ckpt", False)),
        mb,
        _int(here, "micro_batch_cap", raw.get("micro_batch_cap", cap), 1),
        _int(here, "steps", raw["steps"], 1),
        _int(here, "warmup", raw.get("warmup", 2), 0),
        shape,
        _mapping(here, "config", raw.get("config")),
        raw.get("skip_reason"),
    )


def _mapping(where: str, key: str, value: Any) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise TunelabError(f"{where}: {key} must be a mapping, got {value!r}")
    return dict(value)


def _int(where: str, key: str, value: Any, least: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise TunelabError(f"{where}: {key} must be an integer of at least {least}, got {value!r}")
    return value


def _bool(where: str, key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise TunelabError(f"{where}: {key} must be true or false, got {value!r}")
    return value


def _known(where: str, raw: dict, keys: set[str]) -> None:
    unknown = sorted(set(raw) - keys)
    if unknown:
        raise TunelabError(f"{where}: unknown keys {', '.join(unknown)}; known: {', '.join(sorted(keys))}")


def overrides(suite: Suite, row: Row, model: str, data_path: Path | str, micro_batch: int) -> list[str]:
    """The row as dotted config overrides (values as JSON, which YAML reads back unchanged)."""
    settings = {
        **suite.config,
        "model": model,
        "method": row.method,
        "compile": row.compile,
        "grad_ckpt": row.grad_ckpt,
        "micro_batch": micro_batch,
        "data.path": str(data_path),
        **row.config,
    }
    return [f"{k}={json.dumps(v)}" for k, v in settings.items()]


def row_config(
    suite: Suite, row: Row, model: str, data_path: Path | str, out: Path, extra: list[str] = (), micro_batch: int = 1
) -> cfgmod.TrainConfig:
    return cfgmod.load_config(
        None, [*overrides(suite, row, model, data_path, micro_batch), *extra, *points.FORCED, f"output_dir={out}"]
    )


def check_configs(suite: Suite, extra: list[str], work: Path) -> None:
    """Every row that will run as a training config, before the workload is generated or any row runs: a bad key
    or value in the suite (or on the command line) fails at once, not as every row's recorded failure."""
    for row in suite.rows:
        if row.skip_reason:
            continue
        # A row saved as a checkpoint first runs from a local directory, which validation treats as any model.
        model = cfgmod.EMBEDDED if needs_checkpoint(row) else row.model
        mb = row.micro_batch_cap if row.micro_batch == AUTO else row.micro_batch
        try:
            row_config(suite, row, model, work / "data.jsonl", work / points.slug(row.name), extra, mb)
        except TunelabError as e:
            message = str(e).removeprefix("defaults: ")
            raise TunelabError(f"suite {suite.name} ({suite.source}): row {row.name}: {message}") from None


# ---- the workload ----------------------------------------------------------------------------------------


def write_data(suite: Suite, path: Path) -> dict:
    """The suite's synthetic rows (data/synthetic.py), generated once per run; returns their parameters."""
    from ..data import synthetic as sy
    from ..model import load

    d = suite.data
    params = {
        "rows": int(d["rows"]),
        "prompt_tokens": str(d["prompt_tokens"]),
        "response_tokens": str(d["response_tokens"]),
        "dist": d.get("dist", "triangular"),
        "seed": int(d.get("seed", 0)),
    }
    rows = sy.generate(
        params["rows"],
        sy.parse_range(params["prompt_tokens"], "data.prompt_tokens"),
        sy.parse_range(params["response_tokens"], "data.response_tokens"),
        params["dist"],
        params["seed"],
        load.embedded_tokenizer(),
    )
    write_atomic(path, (json.dumps(r) + "\n" for r in rows))
    return params


def needs_checkpoint(row: Row) -> bool:
    """transformers quantizes weights as it loads a checkpoint, and a shape override is no catalog row: either
    way a `random:` model must exist as a local checkpoint first."""
    return row.model.startswith(RANDOM) and (
        bool(row.shape) or row.method == "qlora" or row.config.get("base_quant", "none") != "none"
    )


def materialize(ref: str, shape: dict, folder: Path, device_ref: str) -> Path:
    """Save `random:<id>` (its catalog shape, `shape` keys overriding) with random bf16 weights and the
    embedded tokenizer as a local checkpoint under `folder`, once per run (`run` removes the folder)."""
    import torch
    from transformers import AutoModelForCausalLM

    from ..device import pick_device
    from ..io import atomic_dir
    from ..model import load

    target = folder / points.slug(f"{ref.removeprefix(RANDOM)}-{json.dumps(shape, sort_keys=True)}")
    if (target / "config.json").is_file():
        return target
    source = load.resolve(ref)
    config = load.random_config(source)
    for key, value in shape.items():
        if not hasattr(config, key):
            raise TunelabError(f"shape key {key!r} is not a field of {type(config).__name__}")
        setattr(config, key, value)
    device = pick_device(device_ref)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    with atomic_dir(target) as tmp:
        model.save_pretrained(tmp)
        load.load_tokenizer(source).save_pretrained(tmp)
    del model
    if device.type == "cuda":
        torch.cuda.empty_cache()  # the measured rows run in other processes and need this memory
    return target


def auto_micro_batch(e, arch, cap: int) -> int:
    """The largest micro-batch (<= cap) whose memory plan's estimate `e` puts within AUTO_MEMORY_SHARE of the
    device's. Raises when even micro-batch 1 does not fit."""
    from ..plan import memory

    capacity = e.device.gpu.memory_bytes * AUTO_MEMORY_SHARE
    loss_per_row = e.work.loss_tokens_per_micro_batch / e.settings.micro_batch
    best = min(cap, memory.max_micro_batch(arch, e.memory_setup, capacity, loss_per_row))
    if best < 1:
        raise TunelabError(f"plan puts micro-batch 1 above {AUTO_MEMORY_SHARE:.0%} of {e.device.gpu.name}'s memory")
    return best


# ---- running ---------------------------------------------------------------------------------------------


def select_rows(suite: Suite, names: str | None) -> Suite:
    """`suite` with only the rows `names` (comma-separated) lists, in the suite's order; its peers stay only
    if the row they follow does."""
    if not names:
        return suite
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    known = [r.name for r in suite.rows]
    unknown = [n for n in wanted if n not in known]
    if unknown or not wanted:
        raise TunelabError(
            f"--suite-rows {names}: {', '.join(unknown) or 'no row named'}: suite {suite.name} has rows {', '.join(known)}"
        )
    rows = [r for r in suite.rows if r.name in wanted]
    keep_peers = suite.peers_after in wanted
    return replace(
        suite,
        rows=rows,
        peers_after=suite.peers_after if keep_peers else None,
        peer_names=suite.peer_names if keep_peers else [],
    )


def run(args: argparse.Namespace, base_dir: Path, db: Path) -> int:
    """Run the suite's rows in order. After each row the results so far are written (marked partial), so a run
    stopped by a time limit keeps what it measured; the last write is the complete file."""
    full = load_suite(args.suite)
    suite = select_rows(full, getattr(args, "suite_rows", None))
    started = time.time()
    work = base_dir / f"suite-{suite.name}"
    check_configs(suite, args.overrides, work)
    data_path = work / "data.jsonl"
    print(
        f"suite {suite.name}: {len(suite.rows)} rows, peers {', '.join(suite.peer_names) or 'none'}; "
        f"data and runs under {work}",
        file=sys.stderr,
        flush=True,
    )
    data = write_data(suite, data_path)
    results: list[dict] = []
    peak_by_precision: dict = {}
    checkpoints: dict[str, Path] = {}
    part = "" if suite.rows == full.rows else "-" + "+".join(r.name for r in suite.rows)
    # Named once, by the day the run started: its partial writes and its last one go to the same files, and a
    # second run of the same rows on the same day writes beside the first instead of over it.
    date, device = datetime.date.today().isoformat(), environment()
    json_path, md_path = output_paths(
        Path(args.out or DEFAULT_OUT), f"{suite.name}{part}_{device_slug(device['name'])}_{date}"
    )

    def write(complete: bool) -> tuple[Path, Path, str]:
        doc = document(args, suite, data, results, time.time() - started, complete, date, device)
        write_atomic(json_path, [json.dumps(doc, indent=2, default=str) + "\n"])
        md = markdown(doc)
        write_atomic(md_path, [md])
        return json_path, md_path, md

    try:
        for i, row in enumerate(suite.rows, 1):
            rec, cfg = run_row(args, suite, row, i, data_path, work, db, peak_by_precision, checkpoints)
            results.append(rec)
            if row.name == suite.peers_after:
                results.extend(run_peers(suite, row, rec, cfg, db))
            if i < len(suite.rows):
                write(complete=False)
    finally:
        # Random-weight checkpoints are scratch (an 8B one is 16 GB): the next run saves them again.
        shutil.rmtree(work / "models", ignore_errors=True)
    json_path, md_path, md = write(complete=True)
    print(md)
    print(f"wrote {json_path} and {md_path}; records also in {db}", file=sys.stderr, flush=True)
    return 0


def output_paths(out_dir: Path, stem: str) -> tuple[Path, Path]:
    """`<stem>.json` and `.md` in `out_dir`, or `<stem>-2`, `-3`, ... where an earlier run wrote that name."""
    n, name = 1, stem
    while (out_dir / f"{name}.json").exists() or (out_dir / f"{name}.md").exists():
        n += 1
        name = f"{stem}-{n}"
    return out_dir / f"{name}.json", out_dir / f"{name}.md"


def run_row(
    args, suite: Suite, row: Row, i: int, data_path: Path, work: Path, db: Path, peaks: dict, checkpoints: dict
) -> tuple[dict, cfgmod.TrainConfig | None]:
    """The row's record (its error or skip reason when it did not run) and the config it ran with."""
    head = f"[{i}/{len(suite.rows)}] {row.name}"
    base = {
        "kind": points.KIND,
        "label": row.name,
        "model": row.model,
        "method": row.method,
        "compile": row.compile,
        "grad_ckpt": row.grad_ckpt,
    }
    if row.skip_reason:
        print(f"{head}: skipped: {row.skip_reason}", file=sys.stderr, flush=True)
        return {**base, "skipped": row.skip_reason}, None
    started = time.time()
    try:
        model = row.model
        if needs_checkpoint(row):
            key = f"{row.model} {json.dumps(row.shape, sort_keys=True)}"
            if key not in checkpoints:
                print(f"{head}: saving {row.model} as a local checkpoint", file=sys.stderr, flush=True)
                checkpoints[key] = materialize(row.model, row.shape, work / "models", _device_ref(suite, args))
            model = str(checkpoints[key])
        out = work / points.slug(row.name)
        cfg = row_config(
            suite,
            row,
            model,
            data_path,
            out,
            args.overrides,
            row.micro_batch_cap if row.micro_batch == AUTO else row.micro_batch,
        )
        prediction = local_prediction(cfg)
        if row.micro_batch == AUTO:
            mb = auto_micro_batch(prediction, archmod.resolve_arch(cfg.model), row.micro_batch_cap)
            if mb != cfg.micro_batch:
                cfg = row_config(suite, row, model, data_path, out, args.overrides, mb)
                prediction = local_prediction(cfg)
        points.check_length(prediction, row.warmup + row.steps)
        print(f"{head}: micro-batch {cfg.micro_batch}, {row.warmup} + {row.steps} steps", file=sys.stderr, flush=True)
        summary = points.measure_point(cfg, row.warmup + row.steps, row.warmup)
        if summary["precision"] not in peaks:
            peaks[summary["precision"]] = points.device_peak(cfg.device, summary, args.catalog_gpu)
        rec = points.build_record(row.name, summary, peaks[summary["precision"]], prediction, row.warmup, cfg)
        store.insert(db, rec)
        rec = {**rec, "compile": row.compile, "model": row.model, "wall_s": time.time() - started}
        print(
            f"{head}: {rec['tokens_nonpad_per_s']:,.0f} non-pad tok/s (window), {points.step_stats(rec)}",
            file=sys.stderr,
            flush=True,
        )
        return rec, cfg
    except Exception as e:  # a failed row is a result (OOM, missing package): record it and go on
        message = one_line(e)
        print(f"{head}: failed: {message}", file=sys.stderr, flush=True)
        return {**base, "error": message, "wall_s": time.time() - started}, None


def run_peers(suite: Suite, row: Row, ours: dict, cfg: cfgmod.TrainConfig | None, db: Path) -> list[dict]:
    """Each peer once, right after the row it is compared with (interleaved, as `bench --peer` runs them)."""
    from ..device import pick_device
    from . import peers

    if cfg is None:
        return [{"kind": n, "label": f"peer {n}", "skipped": f"row {row.name} did not run"} for n in suite.peer_names]
    out = []
    for name in suite.peer_names:
        head = f"[peer] {name}"
        started = time.time()
        try:
            if name not in peers.PEERS:
                raise TunelabError(f"not a peer bench knows; known: {', '.join(peers.PEERS)}")
            # A missing package (trl) fails here, before a process is spawned for it.
            peers.setup_for(
                name,
                pick_device(cfg.device),
                peers.LoraSettings(cfg.lora.r, cfg.lora.alpha, cfg.lora.dropout, cfg.lora.targets),
                cfg.seq_len,
                cfg.micro_batch,
                cfg.grad_accum,
            )
            print(f"{head}: against {row.name}, {row.warmup} + {row.steps} steps", file=sys.stderr, flush=True)
            rec = points._in_fresh_process(points._peer_in_child, name, cfg, row.warmup + row.steps, row.warmup)
            store.insert(db, peers.store_record(rec, f"peer {name}"))
            rec = {
                **rec,
                "label": f"peer {name}",
                "rate_basis": store.RATE_BASIS,
                "against": row.name,
                "wall_s": time.time() - started,
            }
            rec["comparison"] = compare([ours, rec])[0]
            print(
                f"{head}: {rec['tokens_nonpad_per_s']:,.0f} non-pad tok/s (window), {points.step_stats(rec)}",
                file=sys.stderr,
                flush=True,
            )
        except Exception as e:  # a peer that cannot run says why; the suite goes on
            rec = {"kind": name, "label": f"peer {name}", "error": one_line(e), "wall_s": time.time() - started}
            print(f"{head}: cannot run: {rec['error']}", file=sys.stderr, flush=True)
        out.append(rec)
    return out


def _device_ref(suite: Suite, args) -> str:
    given = [o.partition("=")[2] for o in args.overrides if o.partition("=")[0].strip() == "device"]
    return given[-1] if given else str(suite.config.get("device", "auto"))


def one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}".rstrip(": ")


# ---- output ----------------------------------------------------------------------------------------------


def device_slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", re.sub(r"\(.*?\)", "", name).lower()).strip("-") or "device"


def environment() -> dict:
    """The device this process sees, and the CUDA runtime and driver where there is one."""
    import torch

    from ..device import device_memory_bytes, device_name, pick_device

    device = pick_device("auto")
    env = {"name": device_name(device), "type": device.type, "memory_bytes": device_memory_bytes(device)}
    if device.type == "cuda":
        env["cuda"] = torch.version.cuda
        env["driver"] = _driver_version()
    return env


def _driver_version() -> str | None:
    import subprocess

    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None


def document(
    args, suite: Suite, data: dict, results: list[dict], elapsed: float, complete: bool, date: str, device: dict
) -> dict:
    from ..device import library_versions

    rows = getattr(args, "suite_rows", None)
    return {
        "suite": suite.name,
        # False while the suite runs: a file left with it false is what a stopped run had measured.
        "complete": complete,
        "source": suite.source,
        "date": date,
        "timestamp": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(
            [
                "tunelab",
                "bench",
                "--suite",
                args.suite,
                *(["--suite-rows", rows] if rows else []),
                *(["--out", args.out] if args.out else []),
                *args.overrides,
            ]
        ),
        "device": device,
        "versions": library_versions(),
        "elapsed_s": elapsed,
        "budget_s": suite.budget_s,
        "rate_basis": "tokens_*_per_s: tokens over the steady-state window's wall time (synchronized at its edges); "
        "step_time_median_s/p90/max: per optimizer step in that window",
        "definition": suite.definition,
        "data": data,
        "records": results,
    }


def markdown(doc: dict) -> str:
    from ..report.sections import _gib, _num, _table

    dev = doc["device"]
    env = ", ".join(f"{k} {v}" for k, v in doc["versions"].items())
    cuda = f", CUDA {dev['cuda']}, driver {dev.get('driver') or 'unknown'}" if dev["type"] == "cuda" else ""
    header = [
        "row",
        "non-pad tok/s (window)",
        "MFU useful (whole row)",
        "step median / p90 / max (s)",
        "peak memory",
        "plan tok/s, memory",
        "measured / plan tok/s",
        "note",
    ]
    rows = []
    for r in doc["records"]:
        if "error" in r or "skipped" in r:
            rows.append(
                [
                    r["label"],
                    "",
                    "",
                    "",
                    "",
                    "",
                    "",
                    ("failed: " + r["error"]) if "error" in r else "skipped: " + r["skipped"],
                ]
            )
            continue
        pred = r.get("predicted_tokens_nonpad_per_s")
        steps = " / ".join(_num(r.get(k), 3) for k in ("step_time_median_s", "step_time_p90_s", "step_time_max_s"))
        note = f"mb {r.get('micro_batch')}"
        if "comparison" in r:
            note += f"; tunelab ({r['against']}) / peer: {r['comparison']['tokens_nonpad_ratio']:.2f}x"
        rows.append(
            [
                r["label"],
                _num(r["tokens_nonpad_per_s"]),
                store.mfu_text(r),
                steps,
                _gib(r.get("peak_memory_bytes")),
                "" if pred is None else f"{_num(pred)}, {_gib(r.get('predicted_peak_memory_bytes'))}",
                "" if not pred else f"{r['tokens_nonpad_per_s'] / pred:.2f}",
                note,
            ]
        )
    budget = f" (budget {doc['budget_s']:.0f} s)" if doc.get("budget_s") else ""
    lines = [
        f"# tunelab bench --suite {doc['suite']}: {dev['name']}, {doc['date']}",
        "",
        f"- device: {dev['name']}, {_gib(dev['memory_bytes'])}{cuda}",
        f"- versions: {env}",
        f"- command: `{doc['command']}`; "
        + (
            f"finished in {doc['elapsed_s']:.0f} s{budget}"
            if doc.get("complete", True)
            else f"**partial**: stopped or still running after {doc['elapsed_s']:.0f} s{budget}, "
            f"{len(doc['records'])} records so far"
        ),
        f"- data: {doc['data']['rows']} synthetic alpaca rows, prompt {doc['data']['prompt_tokens']} and response "
        f"{doc['data']['response_tokens']} tokens ({doc['data']['dist']}, seed {doc['data']['seed']})",
        f"- rates: {doc['rate_basis']}",
        "",
        *_table(header, rows),
    ]
    return "\n".join(lines)
