"""Evaluation during training on the tiny random Llama: the eval loss against the model computed directly,
early stopping, best/, and resume keeping the evaluation state."""

import json

import pytest
import torch
from conftest import tiny_train_config as config
from conftest import write_jsonl
from safetensors.torch import load_file

from tunelab.data.examples import IGNORE
from tunelab.data.pipeline import prepare_split
from tunelab.recipes.finetune import finetune
from tunelab.train import loop

pytestmark = pytest.mark.slow  # every test here trains or compiles


@pytest.fixture
def data_file(tmp_path, addition_rows):
    return write_jsonl(tmp_path / "add.jsonl", addition_rows)


def read_metrics(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def eval_records(out):
    return [m for m in read_metrics(out) if "eval_loss" in m]


def fake_evaluate(monkeypatch, losses):
    """loop.eval_loss returning `losses` in turn (with the real loss-token count): a run whose eval loss is chosen."""
    queue = list(losses)

    def fake(model, batches, device, accelerator=None):
        return queue.pop(0), batches.tokens_loss

    monkeypatch.setattr(loop, "eval_loss", fake)


def test_eval_loss_is_the_token_mean_over_the_held_out_rows(tiny_model_dir, data_file, tmp_path, tokenizer):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    out = tmp_path / "run"
    cfg = config(tiny_model_dir, data_file, out, "max_steps=3", "eval.split=0.25", "eval.steps=3", "lora.dropout=0.1")
    summary = finetune(cfg, show_progress=False)
    (record,) = eval_records(out)
    assert record["step"] == 3 and summary["best_step"] == 3 and summary["evaluations"] == 1

    # The final adapter is the state evaluated at step 3; compute the loss example by example with the model.
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir), out / "adapter").eval()
    _, held = prepare_split(*cfg.data_specs(), tokenizer)
    total, tokens = 0.0, 0
    with torch.no_grad():
        for i in range(len(held)):
            start, end = held.offsets[i], held.offsets[i + 1]
            ids = torch.from_numpy(held.ids[start:end]).long()[None]
            targets = torch.from_numpy(held.targets[start:end]).long()
            logits = model(input_ids=ids).logits[0].double()
            total += torch.nn.functional.cross_entropy(logits, targets, ignore_index=IGNORE, reduction="sum").item()
            tokens += int((targets != IGNORE).sum())
    assert record["eval_tokens"] == tokens == summary["eval_tokens_loss"]
    assert record["eval_loss"] == pytest.approx(total / tokens, rel=1e-5)
    assert summary["best_eval_loss"] == record["eval_loss"]
    assert record["eval_s"] == pytest.approx(summary["eval_s"])


def test_early_stopping_stops_after_patience_and_still_saves(tiny_model_dir, data_file, tmp_path, monkeypatch, capsys):
    fake_evaluate(monkeypatch, [2.0, 1.5, 1.6, 1.7, 1.0])
    out = tmp_path / "run"
    cfg = config(
        tiny_model_dir, data_file, out, "max_steps=8", "log_steps=3", "eval.split=0.25", "eval.steps=1",
        "eval.early_stopping_patience=2",
    )  # fmt: skip
    summary = finetune(cfg)
    printed = capsys.readouterr().out
    # Evaluations at 1, 2 (best), 3, 4: two in a row without improvement stop the run at step 4.
    assert [(m["step"], m["eval_loss"]) for m in eval_records(out)] == [(1, 2.0), (2, 1.5), (3, 1.6), (4, 1.7)]
    assert summary["steps"] == 4 and summary["early_stopped"] and summary["finished"]
    assert (summary["best_step"], summary["best_eval_loss"]) == (2, 1.5)
    assert (out / "adapter" / "adapter_model.safetensors").is_file()
    assert [m["step"] for m in read_metrics(out) if "loss" in m] == [3, 4]  # the stopped step's window is logged
    assert "early stopping at step 4: 2 evaluations without a lower eval loss than 1.5000 (step 2)" in printed
    assert "best: step 2, eval loss 1.5000" in printed
    assert "step 3/8 | eval loss 1.6000" in printed


def peft_names(trainable: dict) -> dict:
    """Checkpoint parameter names as PEFT's save_pretrained writes them (no adapter name)."""
    return {name.replace(".default", ""): t for name, t in trainable.items()}


def adapter_at(checkpoint):
    return peft_names(load_file(checkpoint / "trainable.safetensors"))


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_best_holds_the_weights_of_the_best_step(tiny_model_dir, data_file, tmp_path, monkeypatch):
    fake_evaluate(monkeypatch, [3.0, 1.0, 2.0])
    out = tmp_path / "run"
    cfg = config(
        tiny_model_dir, data_file, out, "max_steps=3", "save_steps=1", "save_total_limit=5", "eval.split=0.25"
    )  # evaluations at the saves (1, 2) and at the end (3)
    summary = finetune(cfg, show_progress=False)
    assert (summary["best_step"], summary["best_eval_loss"], summary["evaluations"]) == (2, 1.0, 3)
    assert json.loads((out / "best" / "tunelab_best.json").read_text()) == {"step": 2, "eval_loss": 1.0}
    best = load_file(out / "best" / "adapter_model.safetensors")
    assert same(best, adapter_at(out / "checkpoints" / "step-0000002"))
    # lr 1e-2 moves every adapter each step, so these differ from step 2's weights
    assert not same(best, adapter_at(out / "checkpoints" / "step-0000001"))
    assert not same(best, load_file(out / "adapter" / "adapter_model.safetensors"))
    assert (out / "best" / "tokenizer.json").is_file()


def test_keep_best_false_writes_no_best(tiny_model_dir, data_file, tmp_path):
    out = tmp_path / "run"
    cfg = config(tiny_model_dir, data_file, out, "max_steps=2", "eval.split=0.25", "eval.keep_best=false")
    summary = finetune(cfg, show_progress=False)
    assert summary["best_step"] == 2 and not (out / "best").exists()


def test_resume_keeps_best_loss_patience_and_best_dir(tiny_model_dir, data_file, tmp_path, monkeypatch):
    """Checkpoint 2 holds best 1.0 (step 1) and one evaluation without improvement. The first run went on to
    a better step 3 before it died; resumed from checkpoint 2, best/ is step 1's again, and the resumed
    evaluation at 3 is the second without improvement, so the run stops there naming step 1."""
    out = tmp_path / "run"
    args = ["max_steps=8", "save_steps=1", "save_total_limit=5", "eval.split=0.25", "eval.steps=1"]
    args.append("eval.early_stopping_patience=2")
    fake_evaluate(monkeypatch, [1.0, 1.2, 0.5])
    finetune(config(tiny_model_dir, data_file, out, *args), show_progress=False, measure=loop.Measurement(stop_at=3))
    assert json.loads((out / "best" / "tunelab_best.json").read_text())["step"] == 3
    fake_evaluate(monkeypatch, [1.1])
    resume = f"resume={out / 'checkpoints' / 'step-0000002'}"
    summary = finetune(config(tiny_model_dir, data_file, out, *args, resume), show_progress=False)
    assert summary["steps"] == 3 and summary["early_stopped"]
    assert (summary["best_step"], summary["best_eval_loss"], summary["evaluations"]) == (1, 1.0, 3)
    assert [(m["step"], m["eval_loss"]) for m in eval_records(out)] == [(1, 1.0), (2, 1.2), (3, 1.1)]
    assert json.loads((out / "best" / "tunelab_best.json").read_text())["step"] == 1
    best = load_file(out / "best" / "adapter_model.safetensors")
    assert same(best, adapter_at(out / "checkpoints" / "step-0000001"))
