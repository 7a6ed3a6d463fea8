import json
import re

import pytest
import yaml
from conftest import REPO

from tunelab.config import TrainConfig, dump_yaml, load_config
from tunelab.errors import TunelabError

CONFIGS = sorted(REPO.joinpath("configs").glob("*.yaml"))


def test_defaults_load():
    cfg = load_config(None)
    assert isinstance(cfg, TrainConfig) and cfg.model == "embedded" and cfg.batch.packing is True


@pytest.mark.parametrize("path", CONFIGS, ids=[p.name for p in CONFIGS])
def test_every_shipped_config_loads(path):
    cfg = load_config(path)
    assert cfg.adapter.method in ("lora", "dora", "qlora", "full")


def test_shipped_configs_include_the_seed_recipes():
    names = {p.name for p in CONFIGS}
    assert {"quickstart.yaml", "llama2-7b-lora.yaml", "goat-7b.yaml", "tinyllama-lora.yaml"} <= names


def test_every_required_dotted_override(tmp_path):
    overrides = [
        "model=/some/dir",
        "data.path=rows.jsonl",
        "data.format=chat",
        "method=dora",
        "lora.r=32",
        "lora.alpha=64",
        "lora.dropout=0.05",
        "lora.targets=[q_proj,v_proj]",
        "seq_len=1024",
        "micro_batch=4",
        "grad_accum=2",
        "epochs=2",
        "max_steps=100",
        "lr=1e-4",
        "precision=bf16",
        "packing=false",
        "grad_ckpt=true",
        "save_steps=50",
        "save_total_limit=3",
        "output_dir=out",
        "seed=7",
    ]
    cfg = load_config(None, overrides)
    assert (cfg.model, cfg.data.path, cfg.data.format, cfg.adapter.method) == (
        "/some/dir",
        "rows.jsonl",
        "chat",
        "dora",
    )
    assert (cfg.adapter.lora.r, cfg.adapter.lora.alpha, cfg.adapter.lora.dropout, cfg.adapter.lora.targets) == (
        32,
        64.0,
        0.05,
        ["q_proj", "v_proj"],
    )
    assert (cfg.batch.seq_len, cfg.batch.micro_batch, cfg.batch.grad_accum, cfg.batch.epochs, cfg.batch.max_steps) == (
        1024,
        4,
        2,
        2.0,
        100,
    )
    assert (cfg.optimizer.lr, cfg.compute.precision, cfg.batch.packing, cfg.compute.grad_ckpt) == (
        1e-4,
        "bf16",
        False,
        True,
    )
    assert (cfg.run.save_steps, cfg.run.save_total_limit, cfg.run.output_dir, cfg.run.seed) == (50, 3, "out", 7)


def test_comma_list_override_for_targets():
    assert load_config(None, ["lora.targets=q_proj,v_proj"]).adapter.lora.targets == ["q_proj", "v_proj"]
    assert load_config(None, ["lora.targets=attn"]).adapter.lora.targets == "attn"


def test_an_override_value_with_a_colon_stays_a_string_unless_written_as_a_mapping():
    cfg = load_config(None, ["model=random:", "data.path=runs/a: b.jsonl"])
    assert (cfg.model, cfg.data.path) == ("random:", "runs/a: b.jsonl")
    mix = load_config(None, ["data.mix=[{path: x.jsonl, weight: 2}]"]).data.mix
    assert (mix[0].path, mix[0].weight) == ("x.jsonl", 2.0)


def test_yaml_file_plus_override(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("lr: 3.0e-4\nlora:\n  r: 8\n")
    cfg = load_config(f, ["lora.r=4"])
    assert cfg.optimizer.lr == 3e-4 and cfg.adapter.lora.r == 4


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["lora.rank=8"], "did you mean 'lora.r'"),
        (["learning_rate=1e-4"], "unknown key 'learning_rate'"),
        (["micro_batch=two"], "micro_batch must be int"),
        (["packing=maybe"], "packing must be bool"),
        (["method=qlroa"], "did you mean 'qlora'"),
        (["micro_batch=0"], "micro_batch must be at least 1"),
        (["method=qlora", "base_quant=int8"], "qlora"),
        (["method=full", "base_quant=nf4"], "full fine-tuning"),
        (["lora.targets=everything"], "lora.targets must be one of"),
        (["data.format=chat", "data.template=compact"], "data.template"),
        (["lr=0"], "lr must be positive"),
        (["eval.split=0.1", "eval.path=e.jsonl"], "eval.split and eval.path are exclusive"),
        (["eval.split=0.6"], r"eval.split must be in \(0, 0.5\]"),
        (["eval.split=0"], r"eval.split must be in \(0, 0.5\]"),
        (["eval.steps=0", "eval.split=0.1"], "eval.steps must be at least 1"),
        (["eval.steps=5"], "eval.steps needs held-out data; set eval.split"),
        (["eval.early_stopping_patience=2"], "eval.early_stopping_patience needs held-out data"),
        (["eval.split=0.1", "eval.early_stopping_patience=2"], "needs evaluations during the run; set eval.steps"),
        (["eval.spilt=0.1"], "did you mean 'eval.split'"),
        (["justakey"], "expected key=value"),
        (["optimizer=adamw8bit"], "optimizer must be one of .*did you mean 'adamw_8bit'"),
        (["optimizer_in_backward=true"], "optimizer_in_backward .* set max_grad_norm: 0"),
        (["optimizer_in_backward=true", "max_grad_norm=0", "grad_accum=2"], "set grad_accum: 1"),
        (["optimizer_in_backward=true", "max_grad_norm=0", "precision=fp16"], "set precision: bf16"),
        (["weights=bf16"], "weights: bf16 applies to method full"),
        (["method=full", "weights=bf16", "precision=fp32"], "set precision: bf16 or auto"),
        (["bf16_update=kahan"], "bf16_update applies to weights: bf16"),
        (["weights=fp16"], "weights must be one of fp32, bf16"),
        (
            ["data.shuffle=false"],
            r"key 'data.shuffle' was removed \(batches are always shuffled, by `seed`\); delete it",
        ),
    ],
)
def test_bad_values_fail_with_the_key(overrides, message):
    with pytest.raises(TunelabError, match=message):
        load_config(None, overrides)


def test_bad_yaml_names_the_file(tmp_path):
    f = tmp_path / "bad.yaml"
    f.write_text("lr: [1,\n")
    with pytest.raises(TunelabError, match=r"bad.yaml:2: not valid YAML \(.* at line 2 column 1\); fix that line"):
        load_config(f)
    with pytest.raises(TunelabError, match="config file not found"):
        load_config(tmp_path / "missing.yaml")


@pytest.mark.parametrize(
    "text, message",
    [
        ("seq_len: 128\nlr: 1.0e-4\nseq_len: 64\n", "c.yaml:3: key seq_len appears twice; keep one"),
        ("lora:\n  r: 8\n  alpha: 16\n  r: 4\n", "c.yaml:4: key lora.r appears twice; keep one"),
        (
            "data:\n  mix:\n    - path: a.jsonl\n      path: b.jsonl\n",
            "c.yaml:4: key data.mix[0].path appears twice; keep one",
        ),
    ],
)
def test_a_key_given_twice_names_the_key_and_its_line(tmp_path, text, message):
    f = tmp_path / "c.yaml"
    f.write_text(text)
    with pytest.raises(TunelabError) as e:
        load_config(f)
    assert str(e.value) == f"{tmp_path}/{message}"


def test_a_key_given_twice_in_an_override_value_names_the_override():
    with pytest.raises(TunelabError) as e:
        load_config(None, ["data.mix=[{path: a.jsonl, path: b.jsonl}]"])
    assert str(e.value) == (
        "override data.mix=[{path: a.jsonl, path: b.jsonl}]: key data.mix[0].path appears twice; keep one"
    )


def test_a_key_a_merge_brought_in_may_be_given_again(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("data:\n  mix:\n    - &a {path: a.jsonl, weight: 2}\n    - <<: *a\n      path: b.jsonl\n")
    mix = load_config(f).data.mix
    assert [(m.path, m.weight) for m in mix] == [("a.jsonl", 2.0), ("b.jsonl", 2.0)]


@pytest.mark.parametrize(
    "text, overrides, origin, message",
    [
        ("seq_len: 64\n", ["lr=-1"], "override lr=-1", "lr must be positive, got -1.0"),
        ("lr: -1\n", ["seq_len=32"], "FILE", "lr must be positive, got -1.0"),
        ("seq_len: 64\n", ["lr=abc"], "override lr=abc", "lr must be float, got 'abc'"),
        ("lora:\n  r: 0\n", ["lora.alpha=8"], "FILE", "lora.r must be at least 1, got 0"),
        ("seq_len: 64\n", ["lora={r: 0}"], "override lora={r: 0}", "lora.r must be at least 1, got 0"),
        # The section override replaced the key override before it, so the value is the section's.
        ("seq_len: 64\n", ["lora.r=0", "lora={r: 0}"], "override lora={r: 0}", "lora.r must be at least 1, got 0"),
        ("method: qlora\n", ["base_quant=int8"], "override base_quant=int8", "method qlora quantizes the base"),
        ("eval:\n  split: 0.1\n", ["eval.path=e.jsonl"], "override eval.path=e.jsonl", "eval.split and eval.path"),
    ],
)
def test_an_error_names_the_override_or_the_file_that_set_the_value(tmp_path, text, overrides, origin, message):
    f = tmp_path / "c.yaml"
    f.write_text(text)
    with pytest.raises(TunelabError) as e:
        load_config(f, overrides)
    assert str(e.value).startswith(f"{f if origin == 'FILE' else origin}: {message}")


def test_eval_section_defaults_and_overrides():
    cfg = load_config(None)
    assert (cfg.eval.split, cfg.eval.path, cfg.eval.steps, cfg.eval.keep_best) == (None, None, None, True)
    cfg = load_config(None, ["eval.split=0.1", "eval.steps=5", "eval.early_stopping_patience=3", "eval.max_rows=50"])
    assert (cfg.eval.split, cfg.eval.steps, cfg.eval.early_stopping_patience, cfg.eval.max_rows) == (0.1, 5, 3, 50)
    assert load_config(None, ["eval.path=e.jsonl", "save_steps=10", "eval.early_stopping_patience=1"]).eval.path


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["preference.beta=0.5"], r"the preference section applies to objective dpo or orpo"),
        (["objective=dpo", "packing=false"], r"objective dpo packs chosen and rejected .* set packing: true"),
        (["objective=dpo", "eval.split=0.1"], r"objective dpo has no held-out loss"),
        (["objective=orpo", "preference.precompute_reference=true"], r"objective orpo uses no reference model"),
        (["objective=dpo", "preference.reference=frozen-copy"], r"method lora takes reference adapter-disabled"),
        (["objective=dpo", "preference.label_smoothing=0.5"], r"label_smoothing must be in \[0, 0.5\)"),
        (["objective=dpo", "data.format=text"], r"objective dpo renders pairs as alpaca, completion, chat"),
    ],
)
def test_preference_settings_fail_with_the_key(overrides, message):
    with pytest.raises(TunelabError, match=message):
        load_config(None, overrides)


def test_preference_reference_follows_the_method():
    assert load_config(None, ["objective=dpo"]).objective.reference_kind("lora") == "adapter-disabled"
    assert load_config(None, ["objective=dpo"]).objective.reference_kind("full") == "frozen-copy"


@pytest.mark.parametrize(
    "name, ours",
    [
        ("learning_rate", "lr"),
        ("per_device_train_batch_size", "micro_batch"),
        ("gradient_accumulation_steps", "grad_accum"),
        ("num_train_epochs", "epochs"),
        ("max_seq_length", "seq_len"),
        ("lora_alpha", "lora.alpha"),
    ],
)
def test_a_hugging_face_name_gets_tunelabs_key(tmp_path, name, ours):
    """A TrainingArguments or PEFT name is answered with tunelab's key for it, not the nearest string (as text,
    `learning_rate` is nearest to `warmup_ratio`), in a file (with its name) and as an override."""
    path = tmp_path / "hf.yaml"
    path.write_text(f"model: embedded\n{name}: 2\n")
    with pytest.raises(TunelabError, match=rf"^{re.escape(str(path))}: unknown key '{name}'; did you mean '{ours}'\?"):
        load_config(path)
    with pytest.raises(TunelabError, match=rf"^override {name}=2: unknown key '{name}'; did you mean '{ours}'\?"):
        load_config(None, [f"{name}=2"])


def test_sections_own_their_keys_and_the_yaml_layout_is_unchanged():
    """Inline sections keep their keys at the top level: what a user writes is what config.yaml stores, and a
    section's rule fails naming the key as written."""
    cfg = load_config("configs/quickstart.yaml", ["lr=1e-3", "lora.r=8", "objective=sft"])
    assert (cfg.optimizer.lr, cfg.adapter.lora.r, cfg.objective.name, cfg.batch.seq_len) == (1e-3, 8, "sft", 256)
    written = yaml.safe_load(dump_yaml(cfg))
    assert written["lr"] == 1e-3 and written["lora"]["r"] == 8 and written["objective"] == "sft"
    assert "batch" not in written and "compute" not in written and written["optimizer"] == "adamw"
    assert load_config(None, [f"{k}={json.dumps(v)}" for k, v in written.items() if not isinstance(v, dict)])
    with pytest.raises(TunelabError, match="^override micro_batch=0: micro_batch must be at least 1, got 0$"):
        load_config(None, ["micro_batch=0"])


@pytest.mark.parametrize("path", CONFIGS, ids=[p.name for p in CONFIGS])
def test_validate_checks_and_changes_nothing(path):
    """validate() is pure: every section's settings are the same before and after it, for every shipped config and
    with a quoted `compile: "false"` (the word is normalised to the boolean where the section is made)."""
    import copy

    from tunelab.config import to_dict

    for cfg in (load_config(path), load_config(path, ['compile="false"'])):
        before = copy.deepcopy(to_dict(cfg))
        cfg.validate()
        assert to_dict(cfg) == before
    assert load_config(path, ['compile="false"']).compute.compile is False
    assert load_config(None, ['compile="true"']).compute.compile is True
