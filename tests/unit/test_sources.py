"""Code shipped with a model runs only when the config says so, and then with a warning."""

import pytest
import torch
from conftest import tiny_train_config, write_jsonl

from tunelab import sources
from tunelab.model import load
from tunelab.recipes.finetune import prepare_run


@pytest.fixture
def calls(monkeypatch):
    """(class, trust_remote_code) of each transformers Auto* from_pretrained that tunelab makes."""
    import transformers

    seen = []
    for name in ("AutoConfig", "AutoTokenizer", "AutoModelForCausalLM"):
        cls = getattr(transformers, name)

        def record(*args, _name=name, _real=cls.from_pretrained, **kwargs):
            seen.append((_name, kwargs.get("trust_remote_code", "not passed")))
            return _real(*args, **kwargs)

        monkeypatch.setattr(cls, "from_pretrained", record)
    return seen


def test_the_default_config_passes_false_to_every_load(tiny_model_dir, tmp_path, addition_rows, calls, capsys):
    cfg = tiny_train_config(tiny_model_dir, write_jsonl(tmp_path / "a.jsonl", addition_rows), tmp_path / "out")
    assert cfg.trust_remote_code is False
    prep = prepare_run(cfg)
    load.load_model(prep.source, torch.float32, "none", torch.device("cpu"))
    assert {name for name, _ in calls} == {"AutoConfig", "AutoTokenizer", "AutoModelForCausalLM"}
    assert all(trust is False for _, trust in calls)  # transformers' own nested loads included
    assert "trust_remote_code" not in capsys.readouterr().err


def test_true_is_passed_on_with_a_one_line_warning(tiny_model_dir, calls, capsys):
    source = sources.resolve(str(tiny_model_dir), trust_remote_code=True)
    sources.model_config(source)
    assert calls == [("AutoConfig", True)]
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"model {tiny_model_dir}: trust_remote_code is on" in err
