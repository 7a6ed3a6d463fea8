"""`tunelab eval --tasks`: lm-evaluation-harness on the base and the tuned model side by side, offline, over a local
YAML task of a few jsonl rows and a tiny random Llama with a random LoRA adapter."""

import json

import pytest
import torch

from tunelab.cli import main

pytest.importorskip("lm_eval", reason="the lm-eval extra is not installed (pip install 'tunelab[lm-eval]')")


@pytest.fixture
def local_task(tmp_path):
    rows = [{"question": f"{a} plus {b} is", "answer": f" {a + b}"} for a, b in ((1, 2), (3, 4), (5, 1))]
    data = tmp_path / "sums.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "sums.yaml").write_text(
        "task: tiny_sums\ndataset_path: json\ndataset_kwargs:\n  data_files:\n"
        f"    test: {data}\noutput_type: loglikelihood\ntest_split: test\n"
        'doc_to_text: "{{question}}"\ndoc_to_target: "{{answer}}"\n'
        "metric_list:\n  - metric: perplexity\n    aggregation: perplexity\n    higher_is_better: false\n"
    )
    return tasks


def random_adapter(model_dir, folder):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = get_peft_model(AutoModelForCausalLM.from_pretrained(model_dir), LoraConfig(r=4, target_modules=["q_proj"]))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 1.0)
    model.save_pretrained(folder)
    return folder


def test_tasks_scored_on_base_and_tuned_side_by_side(local_task, tiny_model_dir, tmp_path, capsys):
    adapter = random_adapter(tiny_model_dir, tmp_path / "adapter")
    args = ["eval", "--tasks", "tiny_sums", "--tasks-path", str(local_task), "--model", str(tiny_model_dir)]
    assert main([*args, "--adapter", str(adapter), "--precision", "fp32", "--json"]) == 0
    scores = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["scores"]
    base, tuned = (scores[k]["tiny_sums"]["perplexity"] for k in scores)
    assert list(scores)[0].startswith("base") and list(scores)[1].startswith("tuned")
    assert base > 0 and tuned > 0 and base != tuned  # the tuned column is scored with the adapter on


def test_unknown_task_is_one_line(local_task, monkeypatch, capsys):
    import lm_eval.tasks

    class OwnOnly(lm_eval.tasks.TaskManager):  # the harness's own thousands of tasks take seconds to index
        def __init__(self, include_path=None, include_defaults=True, **kwargs):
            super().__init__(include_path=include_path, include_defaults=False, **kwargs)

    monkeypatch.setattr(lm_eval.tasks, "TaskManager", OwnOnly)
    assert main(["eval", "--tasks", "tiny_sums,no_such_task", "--tasks-path", str(local_task)]) == 2
    error = capsys.readouterr().err.strip()
    assert "unknown task no_such_task;" in error and len(error.splitlines()) == 1
