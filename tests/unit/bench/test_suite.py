"""`tunelab bench suite`: the suites file's rows are valid configs, the cpu suite end to end (every row
measured or skipped with its reason, every peer measured or saying why not), a failing row recorded while the
rest run, and the step statistics every bench record carries."""

import dataclasses
import json
import math

import pytest

from tunelab.bench import suite as suitemod
from tunelab.bench import suite_schema as schema
from tunelab.cli import main
from tunelab.errors import TunelabError
from tunelab.train.loop import step_statistics

STEP_KEYS = ("step_time_median_s", "step_time_p90_s", "step_time_max_s")


def test_step_statistics_median_p90_max():
    stats = step_statistics([0.5, 0.4, 2.0, 0.6, 0.5, 0.5, 0.45, 0.55, 0.5, 0.5])
    assert stats["step_time_median_s"] == stats["step_time_s"] == 0.5
    assert stats["step_time_p90_s"] == pytest.approx(0.6 + 0.1 * (2.0 - 0.6))
    assert stats["step_time_max_s"] == 2.0
    assert step_statistics([0.3]) == {
        "step_time_s": 0.3,
        "step_time_median_s": 0.3,
        "step_time_p90_s": 0.3,
        "step_time_max_s": 0.3,
    }
    assert all(math.isnan(v) for v in step_statistics([]).values())


# ids other than the bare names: a "gpu" keyword would mark the test as needing CUDA (conftest).
@pytest.mark.parametrize("name", list(schema.builtin_suites()), ids=lambda n: f"suite-{n}")
def test_builtin_suite_rows_load_as_valid_configs(name, tiny_model_dir, tmp_path):
    suite = schema.load_suite(name)
    for row in suite.rows:
        # A row the suite saves as a checkpoint first (a shape override, a quantized base) runs from a directory.
        model = str(tiny_model_dir) if suitemod.needs_checkpoint(row) else row.model
        mb = row.micro_batch_cap if row.micro_batch == schema.AUTO else row.micro_batch
        cfg = suitemod.row_config(suite, row, model, tmp_path / "data.jsonl", tmp_path / row.name, micro_batch=mb)
        assert (cfg.adapter.method, cfg.compute.compile, cfg.compute.grad_ckpt, cfg.batch.micro_batch) == (
            row.method,
            row.compile,
            row.grad_ckpt,
            mb,
        )
        assert cfg.batch.packing and cfg.adapter.lora.targets == "all-linear"
        assert (cfg.adapter.lora.r, cfg.adapter.lora.alpha) == (suite.config["lora.r"], suite.config["lora.alpha"])
        assert row.steps >= 1 and row.warmup >= 1
    if suite.peer_names:  # the MoE suites have none: the HF peers' LoRA would leave the experts out
        assert suite.peers_after in {r.name for r in suite.rows}


def test_gpu_suite_shape():
    suite = schema.load_suite("gpu")
    assert suite.config["seq_len"] == 2048
    kinds = {(r.model, r.method, r.compile, r.grad_ckpt) for r in suite.rows}
    assert ("random:llama-3.2-1b", "lora", True, False) in kinds and (
        "random:llama-3.1-8b",
        "qlora",
        False,
        False,
    ) in kinds
    assert not any(r.skip_reason for r in suite.rows)


TINY = {
    "num_hidden_layers": 1,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 16,
}  # a one-layer Llama: seconds to build and run


def write_suite(path, rows, **extra):
    suite = {
        "data": {"rows": 48, "prompt_tokens": "8-24", "response_tokens": "16-48"},
        "config": {"seq_len": 64, "precision": "fp32"},
        "rows": rows,
        **extra,
    }
    path.write_text(json.dumps({"suites": {"mini": suite}}))  # JSON is YAML
    return path


def test_suite_file_errors_are_one_line(tmp_path):
    with pytest.raises(TunelabError, match="known suites are"):
        schema.load_suite("nope")
    bad = write_suite(tmp_path / "s.yaml", [{"name": "a", "model": "x", "method": "lora", "steps": 1, "stepz": 2}])
    with pytest.raises(TunelabError, match="unknown keys stepz") as e:
        schema.load_suite(str(bad))
    assert "\n" not in str(e.value)


def _records(out_dir):
    files = list(out_dir.glob("*.json"))
    assert len(files) == 1
    doc = json.loads(files[0].read_text())
    md = files[0].with_suffix(".md").read_text()
    return doc, {r["label"]: r for r in doc["records"]}, md


def _assert_measured(rec):
    """Rates are whole token counts over the window's seconds, and the step statistics are ordered."""
    counts = [rec[f"tokens_{k}_per_s"] * rec["steady_window_s"] for k in ("padded", "nonpad", "loss")]
    assert counts == pytest.approx([round(c) for c in counts], abs=1e-6)
    padded, nonpad, loss = (round(c) for c in counts)
    assert rec["steps"] * rec["micro_batch"] * rec["seq_len"] >= padded >= nonpad > loss > 0
    assert 0 < rec["step_time_median_s"] <= rec["step_time_p90_s"] <= rec["step_time_max_s"]
    assert rec["rate_basis"] == "window"


@pytest.mark.slow
def test_cpu_suite_end_to_end(tmp_path, monkeypatch):
    out = tmp_path / "bench-out"
    # One row and the peers that follow it: a fresh process of several seconds each on a 2-core CPU. The other rows
    # differ only in their config (every shipped suite row is checked to load; each method trains from the CLI
    # in tests/integration/test_methods.py, compiled blocks in tests/unit/recipes/test_finetune.py). The peers
    # but trl-sft, which trains and is measured on the embedded model in tests/integration/test_peers_embedded.py
    # (here it was 6 s of a fresh process that nothing asserted on): one that runs and one that cannot.
    real_load = suitemod.load_suite

    def without_trl_sft(name):
        suite = real_load(name)
        assert "trl-sft" in suite.peer_names
        return dataclasses.replace(suite, peer_names=[n for n in suite.peer_names if n != "trl-sft"])

    monkeypatch.setattr(suitemod, "load_suite", without_trl_sft)
    rows = "tiny-lora"
    argv = ["bench", "suite", "cpu", "--rows", rows, "--out", str(out), f"output_dir={tmp_path / 'runs'}"]
    assert main(argv) == 0
    doc, records, md = _records(out)
    suite = schema.select_rows(without_trl_sft("cpu"), rows)
    assert doc["suite"] == "cpu" and doc["device"]["name"] and doc["versions"]["torch"] and doc["versions"]["peft"]
    from tunelab.device import cpu_class

    assert doc["device"]["cpu_class"] == cpu_class() and f"class {cpu_class()}" in md
    assert cpu_class() in next(out.glob("*.json")).name
    assert (
        doc["definition"]["rows"] and doc["data"]["rows"] == suite.data["rows"] and "bench suite cpu" in doc["command"]
    )
    for row in suite.rows:
        rec = records[row.name]
        if row.skip_reason:
            assert rec["skipped"] == row.skip_reason
            continue
        _assert_measured(rec)
        assert rec["mfu"] > 0 and rec["predicted_tokens_nonpad_per_s"] > 0 and rec["micro_batch"] >= 1
    _assert_measured(records["peer hf-trainer-tuned"])
    assert records["peer hf-trainer-tuned"]["comparison"]["tokens_nonpad_ratio"] > 0
    assert "needs a CUDA device" in records["peer hf-trainer-liger"]["error"]
    # The peers run right after the row they are compared with.
    labels = [r["label"] for r in doc["records"]]
    assert labels.index("peer hf-trainer-tuned") == labels.index(suite.peers_after) + 1
    table = [line for line in md.splitlines() if line.startswith("| ")]
    assert table[0].startswith("| row | non-pad tok/s (window) | MFU useful (whole row) | step median / p90 / max")
    assert {line.split(" | ")[0].removeprefix("| ") for line in table[1:]} == set(labels)


@pytest.mark.slow
def test_a_failing_row_is_recorded_and_the_rest_run(tmp_path):
    path = write_suite(
        tmp_path / "mini.yaml",
        [
            {
                "name": "typo",
                "model": "random:llama-3.1-8",
                "method": "lora",
                "micro_batch": 2,
                "steps": 1,
                "warmup": 1,
            },
            {
                "name": "ok",
                "model": "random:smollm2-135m",
                "shape": TINY,
                "method": "lora",
                "micro_batch": 2,
                "steps": 1,
                "warmup": 1,
            },
        ],
    )
    out = tmp_path / "out"
    assert main(["bench", "suite", str(path), "--out", str(out), f"output_dir={tmp_path / 'runs'}"]) == 0
    _, records, md = _records(out)
    assert "did you mean random:llama-3.1-8b" in records["typo"]["error"]
    _assert_measured(records["ok"])
    assert "failed: TunelabError" in md


def test_suite_rows_select_rows_and_their_peers():
    gpu = schema.load_suite("gpu")
    part = schema.select_rows(gpu, "8b-qlora, 1b-lora")
    assert [r.name for r in part.rows] == ["1b-lora", "8b-qlora"]  # the suite's order
    assert part.peers_after == "1b-lora" and part.peer_names == gpu.peer_names
    alone = schema.select_rows(gpu, "8b-lora")
    assert alone.peers_after is None and alone.peer_names == []
    assert schema.select_rows(gpu, None) is gpu
    with pytest.raises(TunelabError, match=r"--rows 8b,1b-lora: 8b: suite gpu has rows 1b-lora, ") as e:
        schema.select_rows(gpu, "8b,1b-lora")
    assert "\n" not in str(e.value)


@pytest.mark.slow
def test_a_stopped_suite_leaves_what_it_measured_and_parts_have_their_own_files(tmp_path, monkeypatch):
    row = {"model": "random:smollm2-135m", "shape": TINY, "method": "lora", "micro_batch": 2, "steps": 1, "warmup": 1}
    path = write_suite(tmp_path / "mini.yaml", [{"name": n, **row} for n in ("first", "second", "third")])
    real, calls = suitemod.run_row, []

    def stopped_at_the_second(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt  # as a time limit's kill would, between rows
        return real(*args, **kwargs)

    monkeypatch.setattr(suitemod, "run_row", stopped_at_the_second)
    out = tmp_path / "out"
    assert main(["bench", "suite", str(path), "--out", str(out), f"output_dir={tmp_path / 'runs'}"]) == 130
    doc, records, md = _records(out)
    assert doc["complete"] is False and list(records) == ["first"] and "**partial**" in md
    _assert_measured(records["first"])

    monkeypatch.setattr(suitemod, "run_row", real)
    part = tmp_path / "part"
    args = ["bench", "suite", str(path), "--rows", "third", "--out", str(part), f"output_dir={tmp_path / 'r2'}"]
    assert main(args) == 0
    (file,) = part.glob("*.json")
    assert file.name.startswith("mini-third_")
    doc = json.loads(file.read_text())
    assert doc["complete"] is True and [r["label"] for r in doc["records"]] == ["third"]
    assert doc["command"].startswith(f"tunelab bench suite {path} --rows third")


def test_a_suite_names_its_files_with_letters_digits_dots_underscores_and_hyphens_only():
    """A GPU host's file transfer brings back only such names; a `+` between rows lost a whole suite's results."""
    gpu = suitemod.load_suite("gpu")
    part = suitemod.select_rows(gpu, "1b-lora,1b-lora-compiled,8b-lora")
    stem = suitemod.results_stem(part, gpu, {"name": "NVIDIA H200 (141 GB) + MIG 1g"}, "2026-11-26")
    assert stem == "gpu-1b-lora.1b-lora-compiled.8b-lora_nvidia-h200-mig-1g_2026-11-26"
    h100 = {"name": "NVIDIA H100 80GB HBM3", "type": "cuda"}
    assert suitemod.results_stem(gpu, gpu, h100, "2026-11-26") == "gpu_nvidia-h100-80gb-hbm3_2026-11-26"
    # One CPU under an ISA cap is another class: its files take the class into their names.
    capped = {"name": "Intel(R) Xeon(R) Processor (2 threads)", "type": "cpu", "cpu_class": "avx512-bf16"}
    assert suitemod.results_stem(gpu, gpu, capped, "2026-11-26") == "gpu_intel-xeon-processor-avx512-bf16_2026-11-26"
    from tunelab.bench.points import slug
    from tunelab.io import SAFE_NAME

    for label in ("lora.r=16 micro_batch=4", "compile=true+packing", 'llama-3.1-8b-{"layers": 2}'):
        assert SAFE_NAME.fullmatch(slug(label)), slug(label)


def test_a_second_run_of_the_same_rows_on_one_day_writes_beside_the_first(tmp_path):
    output_paths = suitemod.output_paths
    stem = "gpu-8b-lora_nvidia-h100_2026-11-25"
    assert output_paths(tmp_path, stem) == (tmp_path / f"{stem}.json", tmp_path / f"{stem}.md")
    (tmp_path / f"{stem}.json").write_text("{}")
    assert output_paths(tmp_path, stem) == (tmp_path / f"{stem}-2.json", tmp_path / f"{stem}-2.md")
    (tmp_path / f"{stem}-2.md").write_text("")
    assert output_paths(tmp_path, stem)[0] == tmp_path / f"{stem}-3.json"


def test_a_random_moe_shape_saves_under_a_short_name_with_its_layer_pattern(tmp_path):
    """`materialize`: a `random:` row whose shape overrides a dozen keys is saved under a name the file system takes
    (a digest, not the keys spelled out: 255 bytes), and fewer layers keep gpt-oss's sliding/full alternation."""
    from transformers import AutoConfig

    shape = {
        "num_hidden_layers": 3,
        "hidden_size": 32,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 8,
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
        "intermediate_size": 16,
        "vocab_size": 64,
        "max_position_embeddings": 256,
        "sliding_window": 8,
        "initializer_range": 0.02,
    }
    target = suitemod.materialize("random:gpt-oss-20b", shape, tmp_path, "cpu")
    assert len(target.name) < 64
    config = AutoConfig.from_pretrained(target)
    assert config.layer_types == ["sliding_attention", "full_attention", "sliding_attention"]
    assert suitemod.materialize("random:gpt-oss-20b", shape, tmp_path, "cpu") == target  # saved once
