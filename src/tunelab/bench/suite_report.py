"""What `tunelab bench suite` writes: the results document (`<suite>_<device>_<date>.json`) and its markdown
table, with the device and library versions it ran on."""

from __future__ import annotations

import datetime
import os
import re

from ..markdown import gib_cell, num, table
from . import store
from .suite_schema import Suite, SuiteOptions


def device_slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", re.sub(r"\(.*?\)", "", name).lower()).strip("-") or "device"


def environment() -> dict:
    """The device this process sees, the CUDA runtime and driver where there is one, and a CPU's class (the
    units its matmuls run on, device.cpu_class) with the oneDNN ISA cap that chose it, and its vendor."""
    import torch

    from ..device import cpu_class, cpu_vendor, device_memory_bytes, device_name, pick_device

    device = pick_device("auto")
    env = {"name": device_name(device), "type": device.type, "memory_bytes": device_memory_bytes(device)}
    if device.type == "cuda":
        env["cuda"] = torch.version.cuda
        env["driver"] = _driver_version()
    else:
        env["cpu_class"] = cpu_class()
        env["cpu_vendor"] = cpu_vendor()
        env["isa_cap"] = os.environ.get("ONEDNN_MAX_CPU_ISA") or None
    return env


def stem_device(env: dict) -> str:
    """A results file's device part: the device's name, and a CPU's class (one machine under an ISA cap is
    another class, whose files must not take each other's names)."""
    cls = f" {env['cpu_class']}" if env.get("cpu_class") else ""
    return device_slug(env["name"] + cls)


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
    options: SuiteOptions,
    suite: Suite,
    data: dict,
    results: list[dict],
    elapsed: float,
    complete: bool,
    date: str,
    device: dict,
) -> dict:
    from ..device import library_versions

    rows = options.rows
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
                "suite",
                options.suite,
                *(["--rows", rows] if rows else []),
                *(["--out", options.out] if options.out else []),
                *options.overrides,
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
    dev = doc["device"]
    env = ", ".join(f"{k} {v}" for k, v in doc["versions"].items())
    if dev["type"] == "cuda":
        detail = f", CUDA {dev['cuda']}, driver {dev.get('driver') or 'unknown'}"
    else:
        cap = f", oneDNN capped at {dev['isa_cap']}" if dev.get("isa_cap") else ""
        detail = f", class {dev['cpu_class']}{cap}" if dev.get("cpu_class") else ""
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
        steps = " / ".join(num(r.get(k), 3) for k in ("step_time_median_s", "step_time_p90_s", "step_time_max_s"))
        note = f"mb {r.get('micro_batch')}"
        if "comparison" in r:
            note += f"; tunelab ({r['against']}) / peer: {r['comparison']['tokens_nonpad_ratio']:.2f}x"
        rows.append(
            [
                r["label"],
                num(r["tokens_nonpad_per_s"]),
                store.mfu_text(r),
                steps,
                gib_cell(r.get("peak_memory_bytes")),
                "" if pred is None else f"{num(pred)}, {gib_cell(r.get('predicted_peak_memory_bytes'))}",
                "" if not pred else f"{r['tokens_nonpad_per_s'] / pred:.2f}",
                note,
            ]
        )
    budget = f" (budget {doc['budget_s']:.0f} s)" if doc.get("budget_s") else ""
    lines = [
        f"# tunelab bench suite {doc['suite']}: {dev['name']}, {doc['date']}",
        "",
        f"- device: {dev['name']}, {gib_cell(dev['memory_bytes'])}{detail}",
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
        *table(header, rows),
        "",
    ]
    return "\n".join(lines)
