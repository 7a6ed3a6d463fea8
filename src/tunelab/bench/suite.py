"""`tunelab bench suite NAME`: a fixed set of benchmark rows (bench/suites.yaml) on whatever device is here,
tunelab and its peers interleaved in one run, written to `<out>/<suite>_<device>_<date>.{json,md}`.

Suites are data: each row is a training config (model, method, compile, grad_ckpt, micro-batch) over one
shared workload (synthetic alpaca rows generated once per run, seq_len, packing, LoRA settings). Every row runs
as `bench` runs a point (`points.measure_point`: the real training loop in a fresh process) and gets the same
record (`points.build_record`: window rates, step-time statistics, MFU, plan's prediction). A row that fails
(out of memory, a missing package) is recorded with its error and the suite goes on; so does a peer.
This module runs the rows; suite_schema.py reads the suites, suite_report.py writes the results.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import shutil
import sys
import time
from pathlib import Path

from .. import config as cfgmod
from .. import methods, sources
from ..errors import TunelabError
from ..io import safe_name, write_atomic
from ..modelref import EMBEDDED, RANDOM
from ..recipes.predict import local_prediction
from ..sources import resolve_arch
from . import points, store
from .compare import compare
from .suite_report import document, environment, markdown, stem_device
from .suite_schema import AUTO, Suite, SuiteOptions, SuiteRow, load_suite, select_rows

DEFAULT_OUT = "benchmarks"
# `auto` micro-batches fill this share of the device's memory by plan's count: the margin keeps an underestimate
# of plan's memory of up to 10% from running out of memory.
AUTO_MEMORY_SHARE = 0.9


def overrides(suite: Suite, row: SuiteRow, model: str, data_path: Path | str, micro_batch: int) -> list[str]:
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
    suite: Suite,
    row: SuiteRow,
    model: str,
    data_path: Path | str,
    out: Path,
    extra: list[str] = (),
    micro_batch: int = 1,
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
        model = EMBEDDED if needs_checkpoint(row) else row.model
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
        sources.embedded_tokenizer(),
    )
    write_atomic(path, (json.dumps(r) + "\n" for r in rows))
    return params


def needs_checkpoint(row: SuiteRow) -> bool:
    """transformers quantizes weights as it loads a checkpoint, and a shape override is no catalog row: either
    way a `random:` model must exist as a local checkpoint first."""
    return row.model.startswith(RANDOM) and (
        bool(row.shape)
        or methods.get(row.method).base_quant is not None
        or row.config.get("base_quant", "none") != "none"
    )


def materialize(ref: str, shape: dict, folder: Path, device_ref: str) -> Path:
    """Save `random:<id>` (its catalog shape, `shape` keys overriding) with random bf16 weights and the
    embedded tokenizer as a local checkpoint under `folder`, once per run (`run` removes the folder)."""
    import torch
    from transformers import AutoModelForCausalLM

    from ..device import pick_device
    from ..io import atomic_dir

    # the shape as a short digest: a dozen override keys spelled out pass the file system's 255-byte name limit
    digest = hashlib.sha256(json.dumps(shape, sort_keys=True).encode()).hexdigest()[:12]
    target = folder / points.slug(f"{ref.removeprefix(RANDOM)}-{digest}")
    if (target / "config.json").is_file():
        return target
    source = sources.resolve(ref)
    config = sources.random_config(source)
    for key, value in shape.items():
        if not hasattr(config, key):
            raise TunelabError(f"shape key {key!r} is not a field of {type(config).__name__}")
        setattr(config, key, value)
    kinds = getattr(config, "layer_types", None)
    if kinds and len(kinds) != config.num_hidden_layers:  # fewer layers: the pattern (gpt-oss's alternation) kept
        config.layer_types = [kinds[i % len(kinds)] for i in range(config.num_hidden_layers)]
    device = pick_device(device_ref)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    with atomic_dir(target) as tmp:
        model.save_pretrained(tmp)
        sources.load_tokenizer(source).save_pretrained(tmp)
    del model
    if device.type == "cuda":
        torch.cuda.empty_cache()  # the measured rows run in other processes and need this memory
    return target


def auto_micro_batch(e, arch, cap: int) -> int:
    """The largest micro-batch (<= cap) whose memory plan's estimate `e` puts within AUTO_MEMORY_SHARE of the
    device's. Raises when even micro-batch 1 does not fit."""
    from ..plan import memory

    capacity = e.device.gpu.memory_bytes * AUTO_MEMORY_SHARE
    loss_per_row = e.work.loss_tokens_per_micro_batch / e.job.batch.micro_batch
    best = min(cap, memory.max_micro_batch(arch, e.job, e.layout, capacity, loss_per_row))
    if best < 1:
        raise TunelabError(f"plan puts micro-batch 1 above {AUTO_MEMORY_SHARE:.0%} of {e.device.gpu.name}'s memory")
    return best


# ---- running ---------------------------------------------------------------------------------------------


def run(options: SuiteOptions, base_dir: Path, db: Path) -> int:
    """Run the suite's rows in order. After each row the results so far are written (marked partial), so a run
    stopped by a time limit keeps what it measured; the last write is the complete file."""
    full = load_suite(options.suite)
    suite = select_rows(full, options.rows)
    started = time.time()
    work = base_dir / f"suite-{suite.name}"
    check_configs(suite, options.overrides, work)
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
    # Named once, by the day the run started: its partial writes and its last one go to the same files, and a
    # second run of the same rows on the same day writes beside the first instead of over it.
    date, device = datetime.date.today().isoformat(), environment()
    json_path, md_path = output_paths(Path(options.out or DEFAULT_OUT), results_stem(suite, full, device, date))

    def write(complete: bool) -> tuple[Path, Path, str]:
        doc = document(options, suite, data, results, time.time() - started, complete, date, device)
        write_atomic(json_path, [json.dumps(doc, indent=2, default=str) + "\n"])
        md = markdown(doc)
        write_atomic(md_path, [md])
        return json_path, md_path, md

    try:
        for i, row in enumerate(suite.rows, 1):
            rec, cfg = run_row(options, suite, row, i, data_path, work, db, peak_by_precision, checkpoints)
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


def results_stem(suite, full, device: dict, date: str) -> str:
    """`<suite>[-<row>.<row>...]_<device>_<date>`: rows joined by `.`, and nothing but letters, digits, `.`, `_`
    and `-`, the only names a GPU host's file transfer brings back."""
    part = "" if suite.rows == full.rows else "-" + ".".join(r.name for r in suite.rows)
    return safe_name(f"{suite.name}{part}_{stem_device(device)}_{date}")


def output_paths(out_dir: Path, stem: str) -> tuple[Path, Path]:
    """`<stem>.json` and `.md` in `out_dir`, or `<stem>-2`, `-3`, ... where an earlier run wrote that name."""
    n, name = 1, stem
    while (out_dir / f"{name}.json").exists() or (out_dir / f"{name}.md").exists():
        n += 1
        name = f"{stem}-{n}"
    return out_dir / f"{name}.json", out_dir / f"{name}.md"


def run_row(
    options: SuiteOptions,
    suite: Suite,
    row: SuiteRow,
    i: int,
    data_path: Path,
    work: Path,
    db: Path,
    peaks: dict,
    checkpoints: dict,
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
                checkpoints[key] = materialize(row.model, row.shape, work / "models", _device_ref(suite, options))
            model = str(checkpoints[key])
        out = work / points.slug(row.name)
        cfg = row_config(
            suite,
            row,
            model,
            data_path,
            out,
            options.overrides,
            row.micro_batch_cap if row.micro_batch == AUTO else row.micro_batch,
        )
        prediction = local_prediction(cfg)
        if row.micro_batch == AUTO:
            mb = auto_micro_batch(prediction, resolve_arch(cfg.model), row.micro_batch_cap)
            if mb != cfg.batch.micro_batch:
                cfg = row_config(suite, row, model, data_path, out, options.overrides, mb)
                prediction = local_prediction(cfg)
        points.check_length(prediction, row.warmup + row.steps)
        print(
            f"{head}: micro-batch {cfg.batch.micro_batch}, {row.warmup} + {row.steps} steps",
            file=sys.stderr,
            flush=True,
        )
        summary = points.measure_point(cfg, row.warmup + row.steps, row.warmup)
        peak = points.point_peak(peaks, cfg.compute.device, summary, options.catalog_gpu)
        rec = points.build_record(row.name, summary, peak, prediction, row.warmup, cfg)
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


def run_peers(suite: Suite, row: SuiteRow, ours: dict, cfg: cfgmod.TrainConfig | None, db: Path) -> list[dict]:
    """Each peer once, right after the row it is compared with (interleaved, as `bench peers` runs them)."""
    from ..device import pick_device
    from . import peer_registry, peers

    if cfg is None:
        return [{"kind": n, "label": f"peer {n}", "skipped": f"row {row.name} did not run"} for n in suite.peer_names]
    out = []
    for name in suite.peer_names:
        head = f"[peer] {name}"
        started = time.time()
        try:
            peer_registry.get(name)  # an unknown name fails naming the known ones
            # A missing package (trl) fails here, before a process is spawned for it.
            peers.setup_for(name, pick_device(cfg.compute.device), cfg.adapter.lora, cfg.batch)
            print(f"{head}: against {row.name}, {row.warmup} + {row.steps} steps", file=sys.stderr, flush=True)
            rec = points.measure_peer(name, cfg, row.warmup + row.steps, row.warmup)
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


def _device_ref(suite: Suite, options: SuiteOptions) -> str:
    given = [o.partition("=")[2] for o in options.overrides if o.partition("=")[0].strip() == "device"]
    return given[-1] if given else str(suite.config.get("device", "auto"))


def one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}".rstrip(": ")
