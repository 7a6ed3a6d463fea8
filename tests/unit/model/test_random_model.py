"""`model: random:<catalog id>`: a catalogued shape with random weights and the embedded SmolLM2 tokenizer.

The catalog's rows are 1B+ parameters, so shapes are checked on the meta device (no memory) and the training
run uses a catalog row shrunk in place.
"""

import json
import math

import pytest
import torch
from conftest import write_jsonl

from tunelab import sources
from tunelab.cli import main
from tunelab.config import load_config
from tunelab.errors import TunelabError
from tunelab.plan import arch as archmod
from tunelab.plan import catalog
from tunelab.sources import resolve_arch

TINY_ROW = {
    "hidden": 64,
    "layers": 2,
    "heads": 4,
    "kv_heads": 2,
    "intermediate": 128,
    "vocab": 49152,
    "max_positions": 256,
    "tied": True,
    "source": "test",
}


@pytest.fixture(scope="module")
def load():
    from tunelab.model import load

    return load


def test_short_ids_are_unique_and_lowercase_last_components():
    data = catalog.read("models.yaml")
    names = [*data["models"], *data["aliases"]]
    ids = [archmod.short_id(n) for n in names]
    assert len(set(ids)) == len(ids)
    assert archmod.short_id("meta-llama/Llama-3.1-8B") == "llama-3.1-8b"


@pytest.mark.parametrize("ref", ["random:llama-3.1-8b", "random:meta-llama/Llama-3.1-8B", "random:LLAMA-3.1-8B"])
def test_random_id_names_the_catalog_row(ref):
    assert resolve_arch(ref) == resolve_arch("meta-llama/Llama-3.1-8B")


@pytest.mark.parametrize(
    "ref, message",
    [
        ("random:llama-3.1-8", "did you mean random:llama-3.1-8b"),
        ("random:gemma-2-2b", "google/gemma-2-2b's family cannot be built"),
        ("random:llama-2-7b-hf", "smaller than the embedded SmolLM2 tokenizer's"),
    ],
)
def test_unbuildable_ids_are_one_line_errors(ref, message):
    with pytest.raises(TunelabError, match=message) as e:
        resolve_arch(ref)
    assert "\n" not in str(e.value)


def test_tokenizer_vocab_constant_is_the_embedded_tokenizers_size(load):
    assert len(sources.load_tokenizer(sources.resolve("embedded"))) == archmod.TOKENIZER_VOCAB


def test_quantized_base_is_refused_before_anything_loads():
    with pytest.raises(TunelabError, match="random weights, built unquantized"):
        load_config(None, ["model=random:llama-3.2-1b", "method=qlora"])


def test_built_on_the_target_device_in_the_compute_dtype(load, monkeypatch, capsys):
    """On the meta device (no memory): the shape is plan's, and construction ran inside the device context."""
    from transformers import AutoModelForCausalLM

    build = AutoModelForCausalLM.from_config
    seen = []

    def spy(*args, **kwargs):
        seen.append(torch.empty(()).device)  # where a tensor created during construction lands
        return build(*args, **kwargs)

    monkeypatch.setattr(AutoModelForCausalLM, "from_config", spy)
    source = sources.resolve("random:llama-3.2-1b")
    model = load.load_model(source, torch.bfloat16, "none", torch.device("meta"))
    assert seen == [torch.device("meta")]
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert {p.device.type for p in model.parameters()} == {"meta"}
    shape = resolve_arch("random:llama-3.2-1b")
    assert sum(p.numel() for p in model.parameters()) == shape.total_params
    assert model.config.vocab_size == shape.vocab and model.config.num_key_value_heads == shape.kv_heads
    assert (
        "random weights in the shape of meta-llama/Llama-3.2-1B; tokenizer: the embedded SmolLM2's"
        in capsys.readouterr().err
    )


def test_qwen_rows_build_as_qwen2(load):
    """Qwen2's q/k/v projections carry biases, which plan's parameter count leaves out."""
    model = load.load_model(sources.resolve("random:qwen2.5-0.5b"), torch.bfloat16, "none", torch.device("meta"))
    shape = resolve_arch("random:qwen2.5-0.5b")
    biases = shape.layers * (shape.heads + 2 * shape.kv_heads) * shape.head_dim
    assert model.config.model_type == "qwen2"
    assert sum(p.numel() for p in model.parameters()) == shape.total_params + biases


def test_plan_prints_the_same_as_for_the_catalog_model(capsys):
    outputs = []
    for model in ("random:llama-3.1-8b", "meta-llama/Llama-3.1-8B"):
        assert main(["plan", "--model", model, "--gpu", "h100-sxm", "--examples", "1000"]) == 0
        outputs.append(capsys.readouterr().out)
    assert outputs[0] == outputs[1]


@pytest.mark.slow
def test_trains_end_to_end_on_a_shrunk_catalog_row(monkeypatch, tmp_path, addition_rows, capsys):
    monkeypatch.setitem(catalog.read("models.yaml")["models"], "meta-llama/Llama-3.2-1B", TINY_ROW)
    data = write_jsonl(tmp_path / "add.jsonl", addition_rows)
    out = tmp_path / "run"
    code = main(
        [
            "train",
            "--config",
            str(write_config(tmp_path)),
            "model=random:llama-3.2-1b",
            f"data.path={data}",
            f"output_dir={out}",
            "max_steps=2",
            "micro_batch=4",
            "seq_len=64",
            "--quiet",
        ]
    )
    assert code == 0
    assert (out / "adapter" / "adapter_model.safetensors").is_file()
    assert math.isfinite(json.loads((out / "summary.json").read_text())["loss_last"])
    assert "random weights in the shape of meta-llama/Llama-3.2-1B" in capsys.readouterr().err
    # The random base was never saved, so there is nothing to merge the adapter into.
    assert main(["export", "--adapter", str(out / "adapter"), "--merge", "--out", str(tmp_path / "merged")]) == 2
    assert "random weights that were never saved" in capsys.readouterr().err
    assert not (tmp_path / "merged").exists()


def test_train_with_an_unknown_id_is_one_line_and_writes_nothing(tmp_path, addition_rows, capsys):
    data = write_jsonl(tmp_path / "add.jsonl", addition_rows)
    out = tmp_path / "never"
    code = main(
        [
            "train",
            "--config",
            str(write_config(tmp_path)),
            "model=random:lama-3.2-1b",
            f"data.path={data}",
            f"output_dir={out}",
            "--quiet",
        ]
    )
    err = capsys.readouterr().err.strip()
    assert code == 2 and "did you mean random:llama-3.2-1b" in err and len(err.splitlines()) == 1
    assert not out.exists()


def write_config(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("method: lora\ndata:\n  template: compact\nprecision: fp32\ndevice: cpu\n")
    return path


def test_random_model_and_synthetic_data_need_only_the_tokenizer_folder(load, tmp_path, monkeypatch):
    """A GPU host gets the 2 MB tokenizer folder, not the 94 MB embedded package: `random:` models and the
    synthetic rows a GPU suite trains on must come from it."""
    import shutil

    from tunelab import sources

    folder = sources.resolve("random:llama-3.2-1b").path
    assert (folder / "config.json").is_file() and (folder / "tokenizer.json").is_file()
    assert not [f for f in folder.iterdir() if f.suffix in sources.WEIGHT_SUFFIXES]
    monkeypatch.setenv("TUNELAB_CACHE", str(tmp_path))
    shutil.copytree(folder, tmp_path / folder.name)

    def no_package():
        raise AssertionError("the embedded package was needed")

    monkeypatch.setattr(sources, "embedded_gguf", no_package)
    source = sources.resolve("random:llama-3.2-1b")
    assert source.path == tmp_path / folder.name
    config = sources.model_config(source)
    assert config.num_hidden_layers == resolve_arch("random:llama-3.2-1b").layers
    assert sources.load_tokenizer(source)("1 + 2").input_ids

    from tunelab.cli import main

    rows = tmp_path / "synthetic.jsonl"
    command = ["data", "synthetic", "--rows", "3", "--prompt-tokens", "8-16", "--response-tokens", "8-16"]
    assert main([*command, "--out", str(rows)]) == 0
    assert len(rows.read_text().splitlines()) == 3


def test_qwen3_rows_build_as_qwen3(load):
    """Qwen3 has no q/k/v biases but RMSNorms on q and k per head, which plan's parameter count leaves out."""
    model = load.load_model(sources.resolve("random:qwen3-8b"), torch.bfloat16, "none", torch.device("meta"))
    shape = resolve_arch("random:qwen3-8b")
    assert model.config.model_type == "qwen3"
    assert sum(p.numel() for p in model.parameters()) == shape.total_params + shape.layers * 2 * shape.head_dim


@pytest.mark.parametrize("ref", ["random:gemma-3-1b-pt", "random:phi-3-mini-4k-instruct"])
def test_families_the_catalog_cannot_describe_are_refused(ref):
    with pytest.raises(TunelabError, match="family cannot be built faithfully"):
        resolve_arch(ref)
