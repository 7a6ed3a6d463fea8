"""benchmarks/ as records (issue 68): each dated write-up has its `.record.json` beside it with the keys a result
states, every raw file a record lists exists, scripts live in benchmarks/scripts/, raw files are compressed unless
code reads them, and benchmarks/README.md is the index `benchmarks/scripts/records.py index` writes."""

import importlib.util
import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "benchmarks"
SCRIPTS_AT_TOP = {"gpu.sh", "gpu_prepare.sh"}  # gpu.sh is named by tests, src/tunelab/bench/suites.yaml and sources.py


def records_module():
    spec = importlib.util.spec_from_file_location("records", BENCH / "scripts" / "records.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_index_is_what_records_py_writes_and_fits_150_lines():
    index = records_module().index()
    assert (BENCH / "README.md").read_text() == index, "run: python benchmarks/scripts/records.py index"
    assert len(index.splitlines()) <= 150


def test_every_write_up_has_a_record_with_the_keys_a_result_states():
    rec = records_module()
    writeups = rec.writeups()
    assert len(writeups) > 50
    for md in writeups:
        path = md.with_name(md.stem + ".record.json")
        assert path.exists(), f"{md.relative_to(REPO)} has no record: run benchmarks/scripts/records.py build"
        data = json.loads(path.read_text())
        assert set(rec.KEYS) <= set(data), path.name
        assert isinstance(data["command"], list) and isinstance(data["versions"], dict)
        assert isinstance(data["figures"], dict) and isinstance(data["raw"], list)
        assert data["config"] is None or isinstance(data["config"], dict | str)
        assert rec.parse_name(md.stem) == {"device_class": data["device_class"], "date": data["date"]}
        if isinstance(data["config"], str):
            assert (REPO / data["config"]).exists() or (md.parent / data["config"]).exists(), data["config"]
        for raw in data["raw"]:
            assert (md.parent / raw).exists(), f"{path.name}: {raw}"
    orphans = [
        p for p in BENCH.rglob("*.record.json") if not p.with_name(p.name[: -len(".record.json")] + ".md").exists()
    ]
    assert not orphans


def test_scripts_live_in_scripts_and_raw_files_are_compressed_unless_code_reads_them():
    code = "".join(p.read_text() for p in (REPO / "src").rglob("*") if p.suffix in (".py", ".yaml"))
    code += "".join(p.read_text() for p in (BENCH / "scripts").glob("*"))
    code += "".join(p.read_text() for p in (BENCH / "plan-accuracy" / "rows").glob("*.yaml"))
    configs = {
        (md.parent / c).resolve()
        for md in records_module().writeups()
        if isinstance(c := json.loads(md.with_name(md.stem + ".record.json").read_text())["config"], str)
    }
    for path in BENCH.rglob("*"):
        rel = path.relative_to(BENCH).as_posix()
        if path.is_dir() or rel.startswith("scripts/") or rel in SCRIPTS_AT_TOP:
            continue
        assert path.suffix not in (".py", ".sh"), f"{rel}: scripts go in benchmarks/scripts/"
        if path.suffix in (".md", ".gz", ".png") or path.name.endswith(".record.json"):
            continue
        named = f"benchmarks/{rel}" in code or f"benchmarks/{path.parent.relative_to(BENCH).as_posix()}" in code
        assert named or path.resolve() in configs, f"{rel}: gzip it, or name it where code reads it"
