"""The shipped Accelerate configs (configs/accelerate/) parse as `accelerate launch` reads them, and tunelab
says in one line which of them this machine cannot run."""

import importlib.util
import re
import sys

import pytest
from conftest import REPO

from tunelab.errors import TunelabError
from tunelab.train import distributed, launch

CONFIGS = sorted((REPO / "configs" / "accelerate").glob("*.yaml"))


def test_the_four_configs_are_shipped():
    assert [p.stem for p in CONFIGS] == ["ddp", "fsdp2", "zero2", "zero3"]


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_config_parses_and_every_key_is_a_launch_argument(path):
    from accelerate.commands.config.config_args import load_config_from_file
    from accelerate.commands.launch import launch_command_parser

    cfg = load_config_from_file(str(path))
    known = vars(launch_command_parser().parse_args(["x.py"]))
    for section in ("fsdp_config", "deepspeed_config"):
        for key in getattr(cfg, section) or {}:
            assert key in known, f"{path.name}: {section}.{key} is not an accelerate launch argument"
    assert cfg.mixed_precision == "no"  # tunelab's precision setting decides
    if path.stem == "fsdp2":
        assert cfg.fsdp_config["fsdp_version"] == 2
        assert cfg.fsdp_config["fsdp_transformer_layer_cls_to_wrap"] == "LlamaDecoderLayer"
    if path.stem.startswith("zero"):
        assert cfg.deepspeed_config["zero_stage"] == int(path.stem[-1])


@pytest.mark.skipif(importlib.util.find_spec("deepspeed") is not None, reason="DeepSpeed is installed")
def test_deepspeed_configs_name_the_missing_package_in_one_line():
    with pytest.raises(TunelabError, match=r"zero3.yaml: needs DeepSpeed, which is not installed \(pip install"):
        launch.read_accelerate_config(REPO / "configs" / "accelerate" / "zero3.yaml")


def test_fsdp_settings_that_tunelab_does_not_honour_are_refused_naming_the_key(tmp_path):
    shipped = (REPO / "configs" / "accelerate" / "fsdp2.yaml").read_text()
    assert launch.read_accelerate_config(REPO / "configs" / "accelerate" / "fsdp2.yaml")["distributed_type"] == "FSDP"
    for old, new, message in [
        ("fsdp_version: 2", "fsdp_version: 1", "fsdp_version 1: tunelab shards with FSDP2; set fsdp_version: 2"),
        ("fsdp_activation_checkpointing: false", "fsdp_activation_checkpointing: true", "grad_ckpt: true"),
    ]:
        path = tmp_path / "fsdp.yaml"
        path.write_text(shipped.replace(old, new))
        with pytest.raises(TunelabError, match=f"--accelerate-config {path}: .*{re.escape(message)}"):
            launch.read_accelerate_config(path)


@pytest.fixture
def base(tiny_model_dir, tmp_path) -> list[str]:
    """Overrides of a loadable run config over the tiny model."""
    (tmp_path / "d.jsonl").write_text('{"text": "x"}\n')
    return [f"model={tiny_model_dir}", f"data.path={tmp_path / 'd.jsonl'}"]


def test_fsdp_runs_take_checkpoints_and_refuse_nf4_naming_the_key(base):
    from tunelab.config import load_config

    launch.check_fsdp_run(load_config(None, base), "c.yaml")
    launch.check_fsdp_run(load_config(None, [*base, "save_steps=5", "resume=true"]), "c.yaml")
    for override, message in [
        ("method=qlora", "c.yaml: method qlora with base weights in nf4: FSDP shards floating-point weights only"),
    ]:
        changed = load_config(None, [*base, override])
        with pytest.raises(TunelabError, match=re.escape(message)):
            launch.check_fsdp_run(changed, "c.yaml")


def test_launch_command(tmp_path):
    plain = launch.launch_command(2, None, ["train", "--config", "c.yaml"])
    assert plain[:3] == [sys.executable, "-m", "accelerate.commands.launch"]
    assert plain[-5:] == ["-m", "tunelab.cli", "train", "--config", "c.yaml"]
    assert "--multi_gpu" in plain and plain[plain.index("--num_processes") + 1] == "2"
    assert "--multi_gpu" not in launch.launch_command(1, None, ["train"])
    ddp = str(REPO / "configs" / "accelerate" / "ddp.yaml")
    with_config = launch.launch_command(4, ddp, ["train"])
    assert with_config[3:7] == ["--config_file", ddp, "--num_processes", "4"]
    assert "--multi_gpu" not in with_config  # the config's distributed_type decides
    with pytest.raises(TunelabError, match="needs at least 1"):
        launch.launch_command(0, None, ["train"])
    with pytest.raises(TunelabError, match="no such file"):
        launch.launch_command(2, str(tmp_path / "nope.yaml"), ["train"])
    (tmp_path / "bad.yaml").write_text("mixed_precision: 'no'\n")
    with pytest.raises(TunelabError, match="no distributed_type"):
        launch.launch_command(2, str(tmp_path / "bad.yaml"), ["train"])


def test_deepspeed_configs_are_refused_on_a_machine_without_gpus(monkeypatch):
    """Accelerate starts CPU processes as plain DDP whatever a DeepSpeed config says: tunelab says so."""
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: object() if name == "deepspeed" else real(name, *a)
    )
    monkeypatch.setattr(launch, "has_cuda", lambda: False)
    for stage in ("zero2", "zero3"):
        path = REPO / "configs" / "accelerate" / f"{stage}.yaml"
        with pytest.raises(TunelabError, match=rf"{stage}.yaml: DeepSpeed runs on GPUs only .*fsdp2.yaml"):
            launch.read_accelerate_config(path)


def test_deepspeed_runs_refuse_checkpoints_naming_the_key(base):
    from tunelab.config import load_config

    launch.check_deepspeed_run(load_config(None, base), "c.yaml")
    for override in ("save_steps=5", "resume=true"):
        key = override.split("=")[0]
        with pytest.raises(
            TunelabError, match=rf"c.yaml: {key}: tunelab's checkpoints are not written or read under DeepSpeed"
        ):
            launch.check_deepspeed_run(load_config(None, [*base, override]), "c.yaml")


class _FakeZero:
    """deepspeed.zero's two entry points that tunelab calls, recording what they were given."""

    def __init__(self):
        self.external: list[tuple[object, object]] = []
        self.gathered: list[list] = []

    def register_external_parameter(self, module, parameter):
        self.external.append((module, parameter))

    def GatheredParameters(self, params, modifier_rank=None):  # noqa: N802  (DeepSpeed's name)
        import contextlib

        self.gathered.append(list(params))
        return contextlib.nullcontext()


@pytest.fixture
def fake_deepspeed(monkeypatch):
    import types

    zero = _FakeZero()
    module = types.ModuleType("deepspeed")
    module.zero = zero
    monkeypatch.setitem(sys.modules, "deepspeed", module)
    monkeypatch.setitem(sys.modules, "deepspeed.zero", zero)
    return zero


def _lora_root(tiny_model_dir):
    import torch

    from tunelab.config import AdapterConfig, LoraConfig
    from tunelab.model.adapters import apply_adapter
    from tunelab.model.load import load_model
    from tunelab.sources import resolve
    from tunelab.train.loss import CausalLMLoss

    model = load_model(resolve(str(tiny_model_dir)), torch.float32, "none", torch.device("cpu"))
    return CausalLMLoss(apply_adapter(model, AdapterConfig(lora=LoraConfig(r=4, alpha=8.0))))


def test_zero3_gathers_every_weight_read_outside_its_own_module(tiny_model_dir, fake_deepspeed):
    from tunelab.model.lora_linear import _FusedForward

    root = _lora_root(tiny_model_dir)
    config: dict = {}
    distributed.prepare_deepspeed(config, root, micro_batch=6, stage=2)
    assert config == {"train_micro_batch_size_per_gpu": 6, "gradient_clipping": 1.0} and not fake_deepspeed.external

    distributed.prepare_deepspeed(config, root, micro_batch=6, stage=3)
    head = root.model.get_output_embeddings().weight
    fused = [m for m in root.modules() if isinstance(m, _FusedForward)]
    assert len(fused) == 7 * root.model.config.num_hidden_layers  # every linear of every block
    expected = [(root, head)] + [
        (m, p) for m in fused for p in (m.base_layer.weight, m.lora_A["default"].weight, m.lora_B["default"].weight)
    ]
    assert [(id(m), id(p)) for m, p in fake_deepspeed.external] == [(id(m), id(p)) for m, p in expected]


def test_zero3_saves_gather_the_weights_named_as_the_model_names_them(tiny_model_dir, fake_deepspeed):
    import torch

    root = _lora_root(tiny_model_dir)
    trainable = {n for n, p in root.model.named_parameters() if p.requires_grad}
    adapter = distributed.zero3_state_dict(root, trainable_only=True)
    assert set(adapter) == trainable and all(v.device.type == "cpu" for v in adapter.values())
    gathered = [p for group in fake_deepspeed.gathered for p in group]
    assert {id(p) for p in gathered} == {id(p) for p in root.model.parameters() if p.requires_grad}
    fake_deepspeed.gathered.clear()
    full = distributed.zero3_state_dict(root, trainable_only=False)
    expected = root.model.state_dict()
    assert list(full) == list(expected) and all(torch.equal(full[k], expected[k]) for k in expected)
    # One module's own weights at a time, never the model at once: the largest group is one layer's weight.
    largest = max(sum(p.numel() for p in group) for group in fake_deepspeed.gathered)
    assert largest == max(sum(p.numel() for p in m.parameters(recurse=False)) for m in root.model.modules())
    assert largest < sum(p.numel() for p in root.model.parameters()) / 10
