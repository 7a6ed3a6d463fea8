"""benchmarks/ as records: one `.json` record beside each dated `.md` write-up, and the index (benchmarks/README.md).

    python benchmarks/scripts/records.py build    # the records, figures read from the files at commit SOURCE
    python benchmarks/scripts/records.py index    # benchmarks/README.md from the records (tests/unit/test_records.py
                                                  # checks that it is what this writes)

A record's keys: `command` (the commands the write-up names), `config` (a shipped config's path, or the run's
config as a dict), `device_class` (the device token of the file name: README's legend says what each is),
`date`, `versions` (torch, transformers, peft, ... as the run's summary or bench record wrote them, else as the
write-up states them), `figures` (the write-up's tables, and per run or bench point the summary figures read from
its raw files) and `raw` (the raw files kept beside it, each compressed unless code reads it). The raw per-row
files (predictions, completions, step metrics, config copies, console output) were removed after SOURCE; every
figure was read from a file of that commit (`git show SOURCE:<path>` shows one).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "benchmarks"
SOURCE = "e457b00"  # the commit of the raw files the figures were read from (the last with all of them)
KEYS = ("command", "config", "device_class", "date", "versions", "figures", "raw")
NAME = re.compile(r"^(?P<workload>.+?)_(?P<device>[a-z0-9.-]+?)?_?(?P<date>\d{4}-\d{2}-\d{2})(?P<suffix>-\d+)?$")
COMMAND = re.compile(
    r"^(?:\$ )?((?:[A-Z_]+=\S+ )*(?:tunelab|make|python3?|bash|\.venv/bin/\S+|PYTHONPATH=\S+ \S+)\s.*)$"
)
VERSION = re.compile(
    r"\b(torch|transformers|peft|accelerate|bitsandbytes|trl|deepspeed|liger-kernel)[ =]+(\d+\.\d+[\w.+]*)"
)
MAX_TABLES, MAX_ROWS = 3, 40


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=REPO, check=True, capture_output=True, text=True).stdout


def source_files() -> list[str]:
    return git("ls-tree", "-r", "--name-only", SOURCE, "benchmarks").splitlines()


def read_source(path: str) -> str:
    return git("show", f"{SOURCE}:{path}")


def writeups() -> list[Path]:
    """The dated write-ups: benchmarks/*.md and benchmarks/<topic>/*.md, the README aside."""
    found = [*BENCH.glob("*.md"), *BENCH.glob("*/*.md")]
    return sorted(p for p in found if p.name != "README.md" and p.parent.name != "scripts")


def parse_name(stem: str) -> dict:
    m = NAME.match(stem)
    if not m:
        raise ValueError(f"{stem}: not <workload>_<device>_<date>")
    return {"device_class": m["device"] or "unnamed", "date": m["date"]}


def tables(text: str) -> list[dict]:
    """The write-up's markdown tables: columns and rows as written (at most MAX_TABLES, MAX_ROWS rows each)."""
    out, block = [], []
    for line in [*text.splitlines(), ""]:
        if line.startswith("|"):
            block.append([c.strip() for c in line.strip().strip("|").split("|")])
            continue
        if len(block) >= 3 and set("".join(block[1])) <= set("-: "):
            rows = block[2:]
            table = {"columns": block[0], "rows": rows[:MAX_ROWS]}
            if len(rows) > MAX_ROWS:
                table["rows_left_out"] = len(rows) - MAX_ROWS
            out.append(table)
        block = []
    return out[:MAX_TABLES]


def commands(text: str) -> list[str]:
    found = []
    in_code = False
    for line in text.splitlines():
        if line.startswith("```"):
            in_code = not in_code
            continue
        candidates = [line.strip()] if in_code else re.findall(r"`([^`]+)`", line)
        for c in candidates:
            m = COMMAND.match(c.strip())
            if m and m[1] not in found:
                found.append(m[1])
    return found[:6]


def owned(md: Path, files: list[str]) -> list[str]:
    """The raw files (of SOURCE, or kept now) a write-up describes: in its folder, the file or folder of its own
    name (`<stem>/`, `<stem>.*`); else the files and folders any write-up's text names (a run folder inside one
    only where the text names the run too); else those of its workload's variants (`<workload>-*` on the same
    device and date)."""
    mine = []
    for f in files:
        if (
            f.endswith((".md", ".record.json"))
            and f.count("/") <= 2
            or "/scripts/" in f
            or f.startswith("benchmarks/plan-accuracy/rows/")
        ):
            continue
        if f.count("/") < 2:
            continue  # benchmarks/gpu.sh and the like
        if md in owners(f, files):
            mine.append(f)
    return mine


_OWNERS: dict[str, list[Path]] = {}


def owners(f: str, files: list[str]) -> list[Path]:
    if f in _OWNERS:
        return _OWNERS[f]
    parts = f.split("/")
    folder, first = "/".join(parts[:2]), parts[2]
    base = re.sub(r"(\.(json|jsonl|md|txt|log|png|yaml|gz))+$", "", first)
    local = [md for md in writeups() if md.relative_to(REPO).parent.as_posix() == folder]
    found = [md for md in local if base == md.stem]
    if not found:
        found = [md for md in writeups() if first in md.read_text() or base in md.read_text()]
        if len(parts) > 4:  # a run folder inside a named folder: the write-ups that name the run, if any
            runs = [md for md in found if parts[3] in md.read_text()]
            found = runs or found
    if not found:
        name = NAME.match(base)
        for md in local:
            own = NAME.match(md.stem)
            if name and own and name["workload"].startswith(own["workload"] + "-") and name["date"] == own["date"]:
                found.append(md)
    _OWNERS[f] = found
    return found


def number(v):
    return round(v, 4) if isinstance(v, float) else v


def score(ev: dict) -> dict:
    """An exact-match record's figures: accuracy over n rows, and by digit count where it has them."""
    out = {"accuracy": number(ev["accuracy"]), "n": ev.get("n")}
    if isinstance(ev.get("by_digits"), dict):
        out["by_digits"] = {d: number(v.get("accuracy")) for d, v in ev["by_digits"].items()}
    return out


def run_figures(files: list[str]) -> dict:
    """Per run folder: exact match (overall, by digit count) before and after, and the summary's figures."""
    runs: dict[str, dict] = {}
    for f in files:
        p = Path(f)
        name = p.name
        if name not in ("summary.json", "eval.json", "eval-after.json", "eval-before.json", "sft-eval.json"):
            continue
        try:
            data = json.loads(read_source(f))
        except json.JSONDecodeError:
            continue
        run = runs.setdefault(p.parent.relative_to(p.parts[0]).as_posix(), {})
        if name == "summary.json":
            keep = {k: number(v) for k, v in data.items() if isinstance(v, int | float) and not isinstance(v, bool)}
            keep = {k: v for k, v in keep.items() if not k.startswith(("params_", "device_memory", "nf4"))}
            for k in ("device", "precision", "method", "objective"):
                if isinstance(data.get(k), str):
                    keep[k] = data[k]
            run["summary"] = keep
        else:
            key = {"eval.json": "exact_match", "eval-after.json": "exact_match", "sft-eval.json": "exact_match_sft"}
            if "tuned" in data or "base" in data:  # `make demo`'s eval.json: the base and the tuned model's scores
                parts = {"exact_match_before": data.get("base"), "exact_match": data.get("tuned")}
            else:
                parts = {key.get(name, "exact_match_before"): data}
            for k, ev in parts.items():
                if isinstance(ev, dict) and "accuracy" in ev:
                    run[k] = score(ev)
    return runs


def bench_points(data) -> list[dict] | None:
    """A `tunelab bench export json` file's points: what each varied and its figures."""
    recs = data.get("records") if isinstance(data, dict) else data
    if not isinstance(recs, list) or not recs or not isinstance(recs[0], dict) or "tokens_nonpad_per_s" not in recs[0]:
        return None
    fields = ("label", "kind", "method", "precision", "micro_batch", "seq_len", "grad_ckpt", "tokens_nonpad_per_s")
    more = ("mfu", "step_time_s", "predicted_step_time_s", "peak_memory_bytes", "predicted_peak_memory_bytes")
    return [{k: number(r[k]) for k in (*fields, *more) if r.get(k) not in (None, "")} for r in recs]


def suite_file(files: list[str]) -> dict | None:
    """A `tunelab bench suite` results file among the files (its command, versions and rows' configs)."""
    for f in files:
        if f.endswith(".json") and f.count("/") == 2:
            try:
                data = json.loads(read_source(f))
            except json.JSONDecodeError:
                continue
            if isinstance(data, dict) and "suite" in data and "records" in data:
                return data
    return None


def versions_of(files: list[str], text: str) -> dict:
    suite = suite_file(files)
    if suite and isinstance(suite.get("versions"), dict):
        return dict(sorted(suite["versions"].items()))
    for f in files:
        if f.endswith("summary.json"):
            v = json.loads(read_source(f)).get("versions")
            if isinstance(v, dict) and v:
                return {k: v[k] for k in sorted(v)}
    for f in files:
        if f.endswith(".json") and "/" not in f.split("/", 2)[-1]:
            try:
                data = json.loads(read_source(f))
            except json.JSONDecodeError:
                continue
            recs = data.get("records") if isinstance(data, dict) else data
            if isinstance(recs, list) and recs and isinstance(recs[0], dict):
                v = {k.removesuffix("_version"): recs[0][k] for k in recs[0] if k.endswith("_version") and recs[0][k]}
                if v:
                    return dict(sorted(v.items()))
    return dict(sorted({m[1]: m[2].rstrip(".,") for m in VERSION.finditer(text)}.items()))


def config_of(text: str, files: list[str], kept: list[str]):
    for f in kept:
        if f.endswith(".yaml") and not f.endswith("/config.yaml"):
            return f  # the config a kept script or command reads (a peer's, a case list)
    m = re.search(r"configs/[\w./-]+\.yaml", text)
    if m:
        return m[0]
    for f in kept:
        if f.endswith("/config.yaml"):
            return f
    suite = suite_file(files)
    if suite and suite["records"] and isinstance(suite["records"][0].get("config"), dict):
        return suite["records"][0]["config"]  # the first row's; each row's settings are in figures.points
    for f in files:
        if f.endswith("/config.yaml"):
            return yaml.safe_load(read_source(f))
    return None


def record(md: Path, files: list[str], present: list[str]) -> dict:
    text = md.read_text()
    mine = owned(md, files)
    raw = sorted(os.path.relpath(REPO / f, md.parent) for f in owned(md, present))
    figures: dict = {"tables": tables(text)}
    runs = run_figures(mine)
    if runs:
        figures["runs"] = runs
    for f in mine:
        if f.endswith(".json") and f.count("/") == md.relative_to(REPO).as_posix().count("/"):
            try:
                points = bench_points(json.loads(read_source(f)))
            except json.JSONDecodeError:
                points = None
            if points:
                figures.setdefault("points", {})[Path(f).name] = points
    return {
        "command": ([suite["command"]] if (suite := suite_file(mine)) and suite.get("command") else [])
        + commands(text),
        "config": config_of(text, mine, raw),
        **parse_name(md.stem),
        "versions": versions_of(mine, text),
        "figures": figures,
        "raw": raw,
        "source": f"figures read at commit {SOURCE}; `git show {SOURCE}:<path>` shows a removed raw file",
        "write_up": md.name,
    }


def dump(obj, indent: int = 0) -> str:
    """JSON with a list or dict of scalars (a table row, a run's by-digit figures) on one line."""
    flat = json.dumps(obj, ensure_ascii=False)
    if (
        not isinstance(obj, dict | list)
        or len(flat) <= 100
        or all(not isinstance(v, dict | list) for v in (obj.values() if isinstance(obj, dict) else obj))
    ):
        return flat
    pad = " " * (indent + 1)
    if isinstance(obj, dict):
        inner = [f"{pad}{json.dumps(k, ensure_ascii=False)}: {dump(v, indent + 1)}" for k, v in obj.items()]
        return "{\n" + ",\n".join(inner) + "\n" + " " * indent + "}"
    return "[\n" + ",\n".join(pad + dump(v, indent + 1) for v in obj) + "\n" + " " * indent + "]"


def build() -> None:
    files = source_files()
    present = [f for f in git("ls-files", "benchmarks").splitlines() if not f.endswith(".record.json")]
    for md in writeups():
        out = md.with_name(md.stem + ".record.json")
        out.write_text(dump(record(md, files, present)) + "\n")


def write_record(out: Path, command: str, config: dict, device_class: str, figures: dict) -> dict:
    """`<out>.record.json` for a script that measures on this machine now (the versions it ran on, today's date;
    its write-up `<out>.md`, no raw files), and that record."""
    import time

    doc = {
        "command": [command],
        "config": config,
        "device_class": device_class,
        "date": time.strftime("%Y-%m-%d"),
        "versions": {k: __import__(k).__version__ for k in ("torch", "transformers", "peft")},
        "figures": figures,
        "raw": [],
        "write_up": out.name + ".md",
    }
    out.with_suffix(".record.json").write_text(json.dumps(doc, indent=1) + "\n")
    return doc


def title(md: Path) -> str:
    for line in md.read_text().splitlines():
        if line.startswith("# "):
            return line[2:].strip()
    return md.stem


TOPICS = {
    "": "design decisions behind code defaults (cited by anchor from src/)",
    "attention": "the CPU slot attention",
    "distributed": "several processes: data-parallel equivalence, FSDP memory",
    "faults": "crash safety: kill -9 then resume; a compile cache that crashed runs",
    "gc-stalls": "Python's garbage collector in the loop",
    "gguf": "GGUF export loaded back in llama.cpp",
    "gpu": "GPU calls of `gpu.sh` (suite rows, DPO beside TRL, launch)",
    "grpo": "GRPO: the quickstart from the SFT model, beside TRL",
    "house": "refactors checked for unchanged behaviour",
    "long-sequences": "long rows and activation offloading",
    "lora-forms": "the fused LoRA layer's products",
    "methods": "LoRA, QLoRA, full fine-tuning on the quickstart",
    "optimizers": "optimizers, step memory and the allocator",
    "peers": "tunelab beside HF Trainer recipes; MoE experts beside transformers + PEFT",
    "plan-accuracy": "plan's predictions against every measured row",
    "preference": "DPO and ORPO: the quickstart, on-policy pairs, beside TRL",
    "profile": "`bench profile` of a step",
    "quickstart": "`make demo`: the quickstart per device class",
    "serve": "`tunelab serve`: requests and tokens per second by concurrent clients",
    "step-experiments": "one change to the step, measured with `tunelab bench`",
    "test-suite": "the test suite's time and the versions it passes on",
}

HEAD = """# benchmarks/

Measured results: a dated write-up `<workload>_<device>_<date>.md` per experiment and its record `<same
name>.record.json` (`command`, `config`, `device_class`, `date`, `versions`, `figures`: the write-up's tables and its
runs' figures, `raw`: raw files kept). Removed raw outputs: `git show {source}:<path>`. Scripts: `scripts/`; a GPU
session: [docs/gpu-runbook.md](../docs/gpu-runbook.md). Written by `python benchmarks/scripts/records.py index`.

Device classes: `xeon-amx-2c` 2-core Xeon with AMX (bf16 matrix units); `xeon-fp32-2c` a 2-core Xeon computing in
fp32 (no bf16 units, or capped to AVX2); `epyc-fp32-2c` 2 Zen 4 cores capped to AVX2 (fp32); `epyc-avx2-2c` a real
Zen 3 with AVX2 only; `epyc-avx512bf16-2c` 2 Zen 4 cores with AVX-512 BF16; `intel-xeon-processor-*` the Xeon with
AMX as `bench suite` names it, at its cap; `nvidia-h200` one H200; `epyc-2c` an EPYC of 2 cores; `cpu` results that
do not depend on the class.
"""


def index() -> str:
    lines = [HEAD.format(source=SOURCE)]
    groups: dict[str, list[Path]] = {}
    for md in writeups():
        groups.setdefault("" if md.parent == BENCH else md.parent.name, []).append(md)
    for topic in sorted(groups):
        story = BENCH / topic / "README.md"
        told = f" ([the story so far]({topic}/README.md))" if topic and story.exists() else ""
        lines.append(f"## {topic + '/' if topic else 'top level'}: {TOPICS.get(topic, '')}{told}")
        by_date: dict[str, list[Path]] = {}
        for md in sorted(groups[topic], key=lambda p: (parse_name(p.stem)["date"], p.stem), reverse=True):
            by_date.setdefault(parse_name(md.stem)["date"], []).append(md)
        for date, mds in by_date.items():  # a day's records on one line: the index stays a page
            entries = []
            for md in mds:
                rel = md.relative_to(BENCH).as_posix()
                rec = rel.removesuffix(".md") + ".record.json"
                entries.append(f"[{parse_name(md.stem)['device_class']}]({rel}) ([record]({rec})): {title(md)}")
            lines.append(f"- {date} " + "; ".join(entries))
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str]) -> int:
    if argv[:1] == ["build"]:
        build()
    elif argv[:1] == ["index"]:
        (BENCH / "README.md").write_text(index())
    else:
        print(__doc__)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
