"""The measured rows `tunelab bench fit` fits: the row files of a folder (benchmarks/plan-accuracy/rows/), the
`bench suite` results files they name, and the token lengths each row trained on.

A row file (YAML) holds any of:
- `rows`: measured rows, each the fields of plan.fit_rows.Row; `defaults` gives the fields its rows share, and
  `date` says when they were measured;
- `suites`: `bench suite` results files (.json, paths from the folder `bench fit` runs in, the repository's root),
  each read as its rows: the tunelab rows that ran and the hf-trainer-tuned peer;
- `cpu_bandwidth`: {bps, device, source}: the memory bandwidth of CPU rows measured without a copy probe;
- `grpo`: measured GRPO runs for plan's GRPO constants (plan/grpo_fit.py), each {device, label, run (the run's
  folder: config.yaml and metrics.jsonl or metrics.jsonl.gz), model (the run's base, where its config names a
  folder that is gone), prompts, prompt_tokens (their count and mean tokens), peak and bandwidth (the probes of the
  machine it ran on)}.
Files are read in name order, and their rows in file order: fitted.yaml lists each device's rows in it.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml

from ..errors import TunelabError
from ..plan import hfstack
from ..plan.fit_rows import CpuBandwidth, Row, check_row, length_spec

FILE_KEYS = ("date", "defaults", "rows", "suites", "cpu_bandwidth", "grpo")
# A `grpo` entry's keys and their types (plan/grpo_fit.GrpoRun).
GRPO_KEYS = {
    "device": str,
    "label": str,
    "run": str,
    "model": str,
    "prompts": int,
    "prompt_tokens": (int, float),
    "peak": (int, float),
    "bandwidth": (int, float),
}
FIELDS = {f.name: f for f in dataclasses.fields(Row)}
REQUIRED = [f.name for f in FIELDS.values() if f.default is dataclasses.MISSING]
TYPES = {"str": (str,), "int": (int,), "float": (int, float), "bool": (bool,)}
# Lengths drawn for `mean:` and `span:` rows: enough that the micro-batches' shapes settle.
DRAWN = 2000


@dataclass(frozen=True)
class Measured:
    rows: list[Row]
    cpu_bandwidth: CpuBandwidth | None
    left_out: list[str]  # one line per suite record not fitted, and why
    grpo: list = dataclasses.field(default_factory=list)  # plan/grpo_fit.GrpoRun: the GRPO runs named


def load(folder: Path) -> Measured:
    """Every row of `folder`'s row files; a suites file named twice counts once."""
    files = sorted(folder.glob("*.yaml")) if folder.is_dir() else []
    if not files:
        raise TunelabError(f"{folder}: no row files (*.yaml) there; pass --rows with the folder that holds them")
    docs = [(path, read_file(path)) for path in files]
    given = [(path, doc["cpu_bandwidth"]) for path, doc in docs if "cpu_bandwidth" in doc]
    if len(given) > 1:
        raise TunelabError(f"{given[1][0]}: cpu_bandwidth is given in {given[0][0]} already; keep one")
    cpu = cpu_bandwidth(*given[0]) if given else None
    rows, left_out, seen, grpo = [], [], set(), []
    for path, doc in docs:
        rows += [file_row(path, i, doc.get("defaults", {}), r) for i, r in enumerate(doc.get("rows", []))]
        grpo += [grpo_run(path, i, r) for i, r in enumerate(doc.get("grpo", []))]
        for name in doc.get("suites", []):
            if not isinstance(name, str) or not Path(name).is_file():
                raise TunelabError(f"{path}: suites: {name!r} is not a file (paths are from the repository's root)")
            if Path(name).resolve() in seen:
                continue
            seen.add(Path(name).resolve())
            found, skipped = suite_rows(Path(name), name, cpu)
            rows += found
            left_out += skipped
    return Measured(rows, cpu, left_out, grpo)


def grpo_run(path: Path, index: int, given: object):
    """A row file's `grpo` entry as a plan/grpo_fit.GrpoRun: its run's config.yaml (the model replaced by the
    entry's) and what its metrics measured; a one-line error names the file, the entry and the key."""
    import gzip

    from .. import config as cfgmod
    from ..plan import grpo_fit
    from ..sources import resolve_arch

    where = f"{path}: grpo[{index}]"
    if not isinstance(given, dict):
        raise TunelabError(f"{where}: expected a mapping of {', '.join(GRPO_KEYS)}")
    for key, kind in GRPO_KEYS.items():
        if key not in given:
            raise TunelabError(f"{where}: {key}: missing (a GRPO entry needs {', '.join(GRPO_KEYS)})")
        if not isinstance(given[key], kind) or isinstance(given[key], bool):
            raise TunelabError(f"{where}: {key}: expected {getattr(kind, '__name__', 'a number')}, got {given[key]!r}")
    unknown = [k for k in given if k not in GRPO_KEYS]
    if unknown:
        raise TunelabError(f"{where}: unknown key {unknown[0]!r}; a GRPO entry has {', '.join(GRPO_KEYS)}")
    run = Path(given["run"])
    metrics = run / "metrics.jsonl"
    try:
        text = (
            metrics.read_text()
            if metrics.is_file()
            else gzip.decompress((run / "metrics.jsonl.gz").read_bytes()).decode()
        )
        records = [json.loads(line) for line in text.splitlines() if line.strip()]
    except (OSError, ValueError) as e:
        raise TunelabError(f"{where}: run: cannot read {metrics} or its .gz ({e}); name a GRPO run's folder") from None
    cfg = cfgmod.load_config(run / "config.yaml", [f"model={given['model']}"])
    return grpo_fit.GrpoRun(
        given["device"],
        given["label"],
        given["run"],
        cfg,
        resolve_arch(given["model"]),
        given["prompts"],
        float(given["prompt_tokens"]),
        float(given["peak"]),
        float(given["bandwidth"]),
        grpo_fit.measured(records),
    )


def read_file(path: Path) -> dict:
    try:
        doc = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise TunelabError(f"{path}: not valid YAML ({str(e).splitlines()[0]})") from None
    if not isinstance(doc, dict):
        raise TunelabError(f"{path}: expected a mapping with keys {', '.join(FILE_KEYS)}")
    unknown = [k for k in doc if k not in FILE_KEYS]
    if unknown:
        raise TunelabError(f"{path}: unknown key {unknown[0]!r}; a row file has {', '.join(FILE_KEYS)}")
    for key, kind in (("defaults", dict), ("rows", list), ("suites", list), ("cpu_bandwidth", dict), ("grpo", list)):
        if key in doc and not isinstance(doc[key], kind):
            raise TunelabError(f"{path}: {key} must be a {'mapping' if kind is dict else 'list'}")
    if doc.get("rows") and "date" not in doc:
        raise TunelabError(f"{path}: date: missing; say when its rows were measured")
    return doc


def file_row(path: Path, index: int, defaults: dict, own: object) -> Row:
    """A row of a row file (its file's defaults under its own keys), checked: a one-line error names the file,
    the row and the key."""
    if not isinstance(own, dict):
        raise TunelabError(f"{path}: rows[{index}]: expected a mapping of {', '.join(FIELDS)}")
    given = {**defaults, **own}
    where = f"{path}: rows[{index}]" + (f" ({given['label']})" if isinstance(given.get("label"), str) else "")
    unknown = [k for k in given if k not in FIELDS]
    if unknown:
        raise TunelabError(f"{where}: unknown key {unknown[0]!r}; a row has {', '.join(FIELDS)}")
    missing = [k for k in REQUIRED if k not in given]
    if missing:
        raise TunelabError(f"{where}: {missing[0]}: missing (a row needs {', '.join(REQUIRED)})")
    values = {}
    for key, value in given.items():
        types = TYPES[FIELDS[key].type]
        if not isinstance(value, types) or (bool not in types and isinstance(value, bool)):
            raise TunelabError(f"{where}: {key}: expected {FIELDS[key].type}, got {value!r}")
        values[key] = float(value) if FIELDS[key].type == "float" else value
    row = Row(**values)
    problem = check_row(row)
    if problem:
        raise TunelabError(f"{where}: {problem}")
    return row


def cpu_bandwidth(path: Path, given: dict) -> CpuBandwidth:
    try:
        found = CpuBandwidth(float(given["bps"]), str(given["device"]), str(given["source"]))
    except KeyError as e:
        raise TunelabError(f"{path}: cpu_bandwidth: {e.args[0]}: missing (it has bps, device, source)") from None
    except (TypeError, ValueError):
        raise TunelabError(f"{path}: cpu_bandwidth: bps: expected bytes/s, got {given['bps']!r}") from None
    return found


def suite_rows(path: Path, name: str, cpu: CpuBandwidth | None) -> tuple[list[Row], list[str]]:
    """The rows of a `bench suite` results file (.json) and one line per record left out: its tunelab rows and
    its hf-trainer-tuned peer (stack hf-peft). On a GPU, rows that ran against a catalog peak, the suite's
    data described by its mean length; on a CPU, the row's class (catalog.local_class, with the CPU's vendor) is
    its device, its peak and bandwidth the probes taken after it (a peer's: those of the row it follows), and its
    lengths the suite's own synthetic rows. Each row's source is `name` and the row."""
    try:
        doc = json.loads(path.read_text())
        return suite_doc_rows(doc, name, cpu)
    except json.JSONDecodeError as e:
        raise TunelabError(f"{name}: not a bench suite results file ({e})") from None
    except KeyError as e:
        raise TunelabError(f"{name}: {e.args[0]!r}: missing; is it a `bench suite` results file?") from None


def suite_doc_rows(doc: dict, name: str, cpu: CpuBandwidth | None) -> tuple[list[Row], list[str]]:
    from ..device import vendor_of_name
    from ..plan import catalog

    device = doc.get("device") or {}
    on_cpu = device.get("type") == "cpu"
    # A CPU's vendor (its class's suffix): recorded by newer files, read from the model name in older ones.
    vendor = device.get("cpu_vendor") or vendor_of_name(device.get("name", ""))
    by_label = {r.get("label"): r for r in doc["records"]}
    rows, left_out = [], []
    for rec in doc["records"]:
        kind = rec.get("kind")
        # A peer ran against the tunelab row it follows: that row's probe and peak are its own.
        source = str(rec.get("peak_source") or by_label.get(rec.get("against"), {}).get("peak_source", ""))
        gpu_id = source.removeprefix("catalog ").split(":")[0]
        if (kind != "tunelab" and kind not in hfstack.PEERS) or "error" in rec or "skipped" in rec:
            left_out.append(f"{name}: left out {rec.get('label', '?')}: not a tunelab or HF Trainer row that ran")
            continue
        if not on_cpu and (not source.startswith("catalog ") or gpu_id not in catalog.gpu_ids()):
            left_out.append(f"{name}: left out {rec.get('label')}: its peak is not a catalog row")
            continue
        cfg = rec.get("config") or {}
        mb, seq = rec["micro_batch"], rec["seq_len"]
        if on_cpu:
            ran = rec if kind == "tunelab" else by_label[rec["against"]]
            bandwidth = ran.get("device_bandwidth_bps") or (cpu.bps if cpu else None)
            if bandwidth is None:
                raise TunelabError(f"{name}: row {rec['label']} has no copy probe; give cpu_bandwidth in a row file")
            seen = ran.get("data") or {}  # the peer trains on the rows of the row it follows
            cap = doc["device"].get("isa_cap")
            place = {
                "device": catalog.local_class("cpu", ran["precision"], doc["device"]["cpu_class"], vendor),
                "kind": "cpu",
                "label": f"{doc['suite']} {rec['label']}" + (f" (capped at {cap})" if cap else ""),
                "peak": ran["device_peak_flops"],
                "bandwidth": bandwidth,
                "call_s": ran.get("device_call_s") or 0.0,  # 0: the class's catalog figure (catalog/calls.yaml)
                "compute_bytes": 4 if ran["precision"] == "fp32" else 2,
                "lengths": "synthetic:" + json.dumps(doc["definition"]["data"], sort_keys=True),
                "loss_fraction": seen["tokens_loss"] / seen["tokens_nonpad"] if seen else 0.5,
            }
        else:
            ran = rec if kind == "tunelab" else by_label[rec["against"]]
            if kind == "tunelab":
                lengths, loss_fraction = f"mean:{(rec.get('data') or {}).get('mean_len', seq / 2)}", 0.5
            else:  # a peer pads its rows: their spread sets its padding, so the suite's own synthetic rows
                seen = ran.get("data") or {}
                lengths = "synthetic:" + json.dumps(doc["definition"]["data"], sort_keys=True)
                loss_fraction = seen["tokens_loss"] / seen["tokens_nonpad"] if seen else 0.5
            gpu = catalog.gpu(gpu_id)
            place = {
                "device": gpu_id,
                "kind": gpu.device_type,
                "label": rec["label"],
                "peak": ran["device_peak_flops"],
                "bandwidth": gpu.bandwidth_gbs * 1e9,
                "compute_bytes": 2,
                "lengths": lengths,
                "loss_fraction": loss_fraction,
            }
        rows.append(
            Row(
                **place,
                source=f"{name} row {rec['label']} ({doc['date']})",
                model=rec["model"],
                method=rec["method"],
                base_quant=cfg.get("base_quant", "none"),
                micro_batch=mb,
                seq_len=seq,
                compiled=bool(cfg.get("compile", False)),
                grad_ckpt=bool(rec["grad_ckpt"]),
                measured_s=rec.get("step_time_median_s") or mb * seq / rec["tokens_padded_per_s"],
                r=int((cfg.get("lora") or {}).get("r", 16)),
                packing=kind == "tunelab",
                stack="tunelab" if kind == "tunelab" else "hf-peft",
                hf=hfstack.PEERS.get(kind, ""),
            )
        )
    return rows, left_out


def row_lengths(row: Row) -> np.ndarray:
    """The token lengths of the documents `row` trained on (its `lengths`)."""
    kind, value = length_spec(row.lengths)
    if kind == "synthetic":
        return synthetic_lengths(value, row.seq_len)
    if kind == "span":
        lo, hi = value
        return np.random.default_rng(0).integers(lo, hi + 1, DRAWN)
    return np.full(DRAWN, round(value))


def synthetic_lengths(data: dict, seq_len: int) -> np.ndarray:
    """A suite's synthetic rows (its `data` entry: rows, prompt_tokens, response_tokens, dist, seed) tokenized as
    train tokenizes them, cached by their parameters (the same rows every run)."""
    import hashlib
    import tempfile

    from .. import sources
    from ..config import load_config
    from ..data import synthetic as sy
    from ..io import write_atomic
    from ..recipes.predict import dataset_lengths

    key = hashlib.sha256(json.dumps([data, seq_len], sort_keys=True).encode()).hexdigest()[:12]
    cached = Path(tempfile.gettempdir()) / f"plan-accuracy-suite-lengths-{key}.npy"
    if cached.is_file():
        return np.load(cached)
    prompt = sy.parse_range(data["prompt_tokens"], "prompt")
    response = sy.parse_range(data["response_tokens"], "response")
    rows = sy.generate(data["rows"], prompt, response, data["dist"], data["seed"], sources.embedded_tokenizer())
    with tempfile.TemporaryDirectory(prefix="plan-accuracy-") as folder:
        work = Path(folder)
        write_atomic(work / "d.jsonl", (json.dumps(r) + "\n" for r in rows))
        cfg = load_config(None, [f"data.path={work / 'd.jsonl'}", f"seq_len={seq_len}", f"output_dir={work}"])
        lengths = dataset_lengths(cfg, None).lengths
    np.save(cached, lengths)
    return lengths
