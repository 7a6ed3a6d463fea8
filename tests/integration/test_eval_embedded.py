"""`tunelab eval` end to end on the embedded SmolLM2-135M: base model, and a run directory's adapter."""

import json

import pytest
import torch

from tunelab.cli import main
from tunelab.config import TrainConfig, dump_yaml
from tunelab.model.load import load_model
from tunelab.sources import resolve

pytestmark = pytest.mark.integration

N = 8


@pytest.fixture(scope="module")
def rows_file(tmp_path_factory):
    folder = tmp_path_factory.mktemp("eval-data")
    test = folder / "test.jsonl"
    assert (
        main(
            [
                "data",
                "arithmetic",
                "--digits",
                "1-3",
                "--n",
                "200",
                "--templates",
                "plain",
                "--out",
                str(folder / "train.jsonl"),
                "--test-out",
                str(test),
                "--test-n",
                str(N),
            ]
        )
        == 0
    )
    return test


def make_run(folder, init_lora_weights):
    """A training run's layout (RUN/adapter + RUN/config.yaml) with an untrained LoRA adapter."""
    from peft import LoraConfig, get_peft_model

    base = load_model(resolve("embedded"), torch.float32, "none", torch.device("cpu"))
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=init_lora_weights)
    get_peft_model(base, lora).save_pretrained(folder / "adapter")
    cfg = TrainConfig(model="embedded")
    cfg.data.template = "compact"
    (folder / "config.yaml").write_text(dump_yaml(cfg))
    return folder / "adapter"


def run_eval(capsys, *args):
    # One batch of all N rows, as in `base`: the same batches give the same padding and budgets.
    assert main(["eval", "--json", "--batch-size", str(N), *args]) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def responses(path):
    return [json.loads(line)["response"] for line in path.open()]


@pytest.fixture(scope="module")
def base(tmp_path_factory, rows_file):
    """The base model scored once: its summary, the --out file and the per-row predictions."""
    folder = tmp_path_factory.mktemp("base")
    out, predictions = folder / "eval.json", folder / "predictions.jsonl"
    assert (
        main(
            [
                "eval",
                "--json",
                "--data",
                str(rows_file),
                "--template",
                "compact",
                "--batch-size",
                str(N),
                "--out",
                str(out),
                "--predictions",
                str(predictions),
            ]
        )
        == 0
    )
    return json.loads(out.read_text()), predictions


def test_base_model_summary(base):
    summary, predictions = base
    assert summary["n"] == N and 0 <= summary["accuracy"] <= 1
    assert summary["model"] == "embedded" and summary["adapter"] is None and summary["template"] == "compact"
    assert set(summary["by_op"]) == {"add"} and summary["by_op"]["add"]["n"] == N
    assert {int(d) for d in summary["by_digits"]} <= {1, 2, 3}
    assert sum(b["n"] for b in summary["by_digits"].values()) == N
    assert summary["seconds"] > 0 and summary["rows_per_s"] > 0
    rows = [json.loads(line) for line in predictions.open()]
    assert len(rows) == N and sum(r["correct"] for r in rows) == summary["correct"]


def test_adapter_run_uses_its_config_and_is_applied(tmp_path, capsys, rows_file, base):
    _, base_pred = base
    same_pred, tuned_pred, fp32_pred = tmp_path / "same.jsonl", tmp_path / "tuned.jsonl", tmp_path / "fp32.jsonl"
    # A fresh LoRA (B = 0) changes nothing: scored with the run's template (compact, from its config.yaml)
    # it must answer exactly as the base does. In fp32: the fused LoRA layer's one GEMM over [W | sB] sums
    # in another order than the base's GEMM over W, which in bf16 moves some outputs by an ulp, enough to
    # flip a greedy choice now and then; in fp32 the difference is ~1e-7 relative.
    run_eval(
        capsys,
        "--data",
        str(rows_file),
        "--template",
        "compact",
        "--precision",
        "fp32",
        "--predictions",
        str(fp32_pred),
    )
    identity = make_run(tmp_path / "identity", init_lora_weights=True)
    summary = run_eval(
        capsys,
        "--data",
        str(rows_file),
        "--adapter",
        str(identity),
        "--precision",
        "fp32",
        "--predictions",
        str(same_pred),
    )
    assert summary["template"] == "compact" and summary["model"] == "embedded"
    assert summary["adapter"] == str(identity)
    assert responses(same_pred) == responses(fp32_pred)
    # A random nonzero adapter must be applied: its answers differ.
    random_adapter = make_run(tmp_path / "random", init_lora_weights=False)
    run_eval(capsys, "--data", str(rows_file), "--adapter", str(random_adapter), "--predictions", str(tuned_pred))
    assert responses(tuned_pred) != responses(base_pred)


def test_a_checkpoint_is_scored_as_the_adapter_saved_from_the_same_weights(tmp_path, capsys, rows_file):
    # A run's checkpoint (RUN/checkpoints/step-N: trainable weights, manifest) and the adapter saved from the
    # same weights answer alike; the checkpoint's run config supplies base model, template and LoRA settings.
    from tunelab.config import AdapterConfig, LoraConfig
    from tunelab.model.adapters import apply_adapter
    from tunelab.train import checkpoint

    adapter = AdapterConfig(lora=LoraConfig(r=4, alpha=8, targets=["q_proj", "v_proj"]))
    model = apply_adapter(load_model(resolve("embedded"), torch.float32, "none", torch.device("cpu")), adapter)
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(std=0.02)  # not the identity: the answers must move
    model.save_pretrained(tmp_path / "run" / "adapter")
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    step = checkpoint.save(tmp_path / "run" / "checkpoints", model, optimizer, scheduler, checkpoint.TrainState(3), 1)
    cfg = TrainConfig(model="embedded")
    cfg.data.template = "compact"
    cfg.adapter.lora = adapter.lora
    (tmp_path / "run" / "config.yaml").write_text(dump_yaml(cfg))

    saved, scored = tmp_path / "saved.jsonl", tmp_path / "checkpoint.jsonl"
    common = ["--data", str(rows_file), "--precision", "fp32"]
    run_eval(capsys, *common, "--adapter", str(tmp_path / "run" / "adapter"), "--predictions", str(saved))
    summary = run_eval(capsys, *common, "--adapter", str(step), "--predictions", str(scored))
    assert summary["template"] == "compact" and summary["adapter"] == str(step)
    assert responses(scored) == responses(saved)
    plain = tmp_path / "base.jsonl"
    run_eval(capsys, *common, "--template", "compact", "--predictions", str(plain))
    assert responses(scored) != responses(plain)  # the checkpoint's weights were read, not left at the base

    (step / "trainable.safetensors").write_bytes(b"cut short")
    assert main(["eval", "--data", str(rows_file), "--adapter", str(step)]) == 2
    assert "not a complete checkpoint" in capsys.readouterr().err
