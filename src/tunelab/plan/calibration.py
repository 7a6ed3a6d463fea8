"""Per-device calibration records: what `tunelab bench calibrate` measured, read back by `plan --gpu local`.

Stored as JSON at `<tunelab cache>/calibration/<device_key>.json`. A record replaces the assumed defaults
of `plan` for that device: its matmul peak, its achieved efficiency per method (fraction of that peak,
counting hardware FLOPs), and its memory constants. Any field left None keeps the default.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from ..io import write_atomic

# 2: a CPU's step model runs against its copy probe (`bandwidth_bps`) and counts the slot path's attention work;
# the step scales of version 1 were measured against the step model before that, so plan reads them no longer.
SCHEMA_VERSION = 2


def scale_key(method_key: str, compiled: bool) -> str:
    """A record's `step_scale` key: `lora/eager`, `lora/compiled` (the step model misses eager and compiled steps
    by different factors)."""
    return f"{method_key}/{'compiled' if compiled else 'eager'}"


@dataclass
class CalibrationRecord:
    device_key: str  # see device_key(): file name and lookup key
    device_name: str
    peak_flops: float | None = None  # achieved bf16 (or fp32) matmul FLOP/s of this device
    peak_dtype: str = "bf16"
    # a CPU's copy bandwidth when it was calibrated (bytes/s, probe.copy_bandwidth): the step model's memory-bound
    # part runs against it as the matmuls run against `peak_flops`. None on a GPU (its catalog figure applies).
    bandwidth_bps: float | None = None
    efficiency: dict[str, float] = field(
        default_factory=dict
    )  # method (lora|dora|qlora|full|lora-int8) -> fraction of peak
    runtime_overhead_bytes: int | None = None  # fixed memory beyond the model's terms (CUDA context, allocator)
    # method -> measured optimizer step / the step model's step for the same run at `peak_flops` (plan applies
    # it to the model's step of any shape; `efficiency` is what older records hold and plan falls back to)
    step_scale: dict[str, float] = field(default_factory=dict)
    created: str = ""
    source: str = ""  # what produced it, e.g. "tunelab bench calibrate (3 runs)"
    schema: int = SCHEMA_VERSION


def device_key(name: str) -> str:
    """A file-name-safe key from a device name, e.g. 'NVIDIA H100 80GB HBM3' -> 'nvidia-h100-80gb-hbm3'."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def calibration_dir() -> Path:
    from ..io import tunelab_cache

    return tunelab_cache() / "calibration"


def save_calibration(record: CalibrationRecord) -> Path:
    """Write atomically (io.write_atomic): a crash never leaves a half record that `plan` would trust."""
    if not record.created:
        record.created = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    folder = calibration_dir()
    target = folder / f"{record.device_key}.json"
    write_atomic(target, [json.dumps(asdict(record), indent=2)])
    return target


def load_calibration(key: str) -> CalibrationRecord | None:
    """The record for `key`, or None when there is none or it is from another schema version."""
    path = calibration_dir() / f"{key}.json"
    if not path.is_file():
        return None
    try:
        raw = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    if raw.get("schema") != SCHEMA_VERSION:
        return None
    known = {f.name for f in fields(CalibrationRecord)}
    return CalibrationRecord(**{k: v for k, v in raw.items() if k in known})
