"""`tunelab plan --from FILE` (plan/readers/): each tool's published example config read onto tunelab's settings and
the HF stack's switches, every key it does not model listed, bad files refused in one line, and the loss kernels'
memory (memory.loss_kernel_bytes) and Axolotl's multipack feeding in the prediction."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from tunelab.cli import main
from tunelab.errors import TunelabError
from tunelab.plan import hfstack, memory, readers

FIXTURES = Path(__file__).parents[2] / "fixtures" / "readers"

# Each fixture: the reader that must claim it, settings and HF switches it must yield (from the file's own keys).
CASES = {
    "axolotl_qlora-1b.yaml": (
        "axolotl",
        {"method": "qlora", "lora.r": 32, "seq_len": 2048, "micro_batch": 2, "grad_accum": 4, "grad_ckpt": True},
        {"padding": "multipack", "attn_implementation": "flash_attention_2", "optim": "adamw_bnb_8bit"},
    ),
    "axolotl_lora-1b-kernels.yaml": (
        "axolotl",
        {
            "method": "lora",
            "lora.r": 16,
            "micro_batch": 2,
            "grad_accum": 2,
            "data.path": "hf://teknium/GPT4-LLM-Cleaned",
        },
        {"padding": "multipack", "attn_implementation": "flash_attention_2", "optim": "adamw_8bit"},
    ),
    "llamafactory_llama3_lora_sft.yaml": (
        "llamafactory",
        {"lora.r": 8, "lora.alpha": 16.0, "lora.targets": "all-linear", "seq_len": 2048, "grad_ckpt": True},
        {"prepare_model_for_kbit_training": False},
    ),
    "llamafactory_llama3_lora_sft_otfq.yaml": ("llamafactory", {"method": "qlora", "eval.split": 0.1}, {}),
    "torchtune_3B_lora_single_device.yaml": (
        "torchtune",
        {
            "model": "llama-3.2-3b",
            "method": "lora",
            "lora.r": 64,
            "micro_batch": 4,
            "grad_ckpt": True,
            "packing": False,
        },
        {},
    ),
    "torchtune_3B_qlora_single_device.yaml": (
        "torchtune",
        {"method": "qlora", "lora.targets": ["q_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]},
        {},
    ),
    "trl_open-r1_grpo_config_demo.yaml": (  # a GRPOConfig: 16 completions a device batch, one group of 16
        "trl",
        {
            "objective": "grpo",
            "grpo.num_generations": 16,
            "grpo.max_completion_length": 1024,
            "micro_batch": 1,
            "grad_accum": 4,
            "seq_len": 512 + 1024,
            "data.path": "hf://open-r1/OpenR1-Math-220k",
        },
        {},
    ),
    "trl_example_config.yaml": (
        "trl",
        {"model": "Qwen/Qwen2.5-0.5B", "data.path": "hf://stanfordnlp/imdb", "seq_len": 1024, "method": "full"},
        {},
    ),
}


def _handlers(tool: str) -> dict:
    module = {"axolotl": readers.axolotl, "llamafactory": readers.llamafactory}
    if tool == "trl":
        return {**readers.trl.HANDLERS, **readers.trl.GRPO_HANDLERS}
    return module[tool].HANDLERS if tool in module else readers.torchtune.HANDLERS


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_tools_published_config_maps_its_keys_and_lists_the_rest(name):
    tool, settings, hf = CASES[name]
    path = FIXTURES / name
    assert path.read_text().startswith("# Source: https://github.com/")  # its source and licence in the header
    r = readers.read(path)
    assert r.tool == tool
    assert {k: r.settings.get(k) for k in settings} == settings
    assert {k: r.hf.get(k) for k in hf} == hf
    # Never silently: every key of the file with a value that no handler reads is listed, one line each.
    doc = yaml.safe_load(path.read_text())
    listed = {k.split(" ")[0].split(".")[0] for k, _ in r.skipped}
    unread = {k for k, v in doc.items() if k not in _handlers(tool) and v not in (None, "", False, [])}
    assert unread <= listed
    lines = r.lines()
    assert sum(line.startswith("  not modeled: ") for line in lines) == len(r.skipped)
    # The settings make a valid tunelab config.
    cfg = readers.config_of(r, ["data.path=null"])
    assert cfg.batch.seq_len == r.settings.get("seq_len", cfg.batch.seq_len)


def test_torchtunes_loss_is_a_memory_part_and_fused_lora_kernels_are_said_not_modeled():
    tt = readers.read(FIXTURES / "torchtune_3B_qlora_single_device.yaml")
    assert tt.parts == {"loss_kernel": "chunked_output", "pure_bf16": True} and not any(
        "Loss" in k for k, _ in tt.skipped
    )
    ax = readers.read(FIXTURES / "axolotl_lora-1b-kernels.yaml")
    assert {"lora_mlp_kernel", "lora_qkv_kernel", "lora_o_kernel"} <= {k for k, _ in ax.skipped}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("base_model: x\nmicro_batch_size: two\n", "micro_batch_size: expected a number, got 'two'"),
        ("base_model: x\nsequence_len: 512\nsample_packing: maybe\n", "sample_packing: expected true or false"),
        ("model:\n  _component_: torchtune.models.phi9.lora_phi9_1b\n", "model._component_ torchtune.models.phi9"),
        (
            "model_name_or_path: m\nnum_generations: 8\nper_device_train_batch_size: 3\n",
            "per_device_train_batch_size 3 x gradient_accumulation_steps 1 is not a multiple of num_generations 8",
        ),
        ("foo: 1\n", "name the tool with --tool"),
        ("- a\n- b\n", "the top level must be a mapping"),
        ("a: [\n", "cannot read it"),
    ],
)
def test_a_bad_file_is_one_line_naming_the_file_and_the_key(tmp_path, text, message):
    path = tmp_path / "tool.yaml"
    path.write_text(text)
    with pytest.raises(TunelabError) as e:
        readers.read(path)
    assert str(path) in str(e.value) and message in str(e.value)
    assert "\n" not in str(e.value)


def test_a_grpo_config_is_planned_as_a_generating_run_of_its_groups(capsys, tmp_path):
    """TRL counts completions a device batch, tunelab prompts: 16 completions x 4 accumulated with groups of 16 are 4
    prompts a step, 64 completions a generation batch; a device batch less than a group becomes one micro-batch."""
    argv = ["plan", "--from", str(FIXTURES / "trl_open-r1_grpo_config_demo.yaml"), "data.path=null"]
    assert main([*argv, "--examples", "100", "--gpu", "h100-sxm", "--json"]) == 0
    out, err = capsys.readouterr()
    line = json.loads(out.splitlines()[0])
    assert line["objective"] == "generating" and line["rows_per_batch"] == 64 and line["decode_steps"] == 1024
    assert "not modeled: use_vllm: generation by vLLM" in err and "not modeled: reward_funcs: ['accuracy'" in err
    small = tmp_path / "grpo.yaml"
    small.write_text(
        "model_name_or_path: Qwen/Qwen2.5-0.5B\nnum_generations: 8\nper_device_train_batch_size: 4\n"
        "gradient_accumulation_steps: 4\n"
    )
    r = readers.read(small)
    assert (r.settings["micro_batch"], r.settings["grad_accum"]) == (2, 1) and r.notes[0].startswith("a device batch")


def test_cut_cross_entropy_and_liger_keep_less_loss_memory_than_whole_logits():
    args = dict(positions=4096, vocab=128256, hidden=2048, a=2, chunk=1024)
    whole, liger, cce = (memory.loss_kernel_bytes(k, **args) for k in ("whole", "liger", "cce"))
    assert cce < liger < whole
    assert cce == 2 * 4096 * 2048 * 2  # the head's input and its gradient only
    # torchtune's chunked-output loss keeps every bf16 logit: above its own linear (chunked) loss
    assert memory.loss_kernel_bytes("chunked_output", **args) > memory.loss_kernel_bytes("chunked", **args)


def test_axolotl_cce_plugin_and_multipack_reach_the_prediction(tmp_path, capsys):
    doc = yaml.safe_load((FIXTURES / "axolotl_qlora-1b.yaml").read_text())
    doc["plugins"] = ["axolotl.integrations.cut_cross_entropy.CutCrossEntropyPlugin"]
    path = tmp_path / "cce.yml"
    path.write_text(yaml.safe_dump(doc))
    peaks = {}
    for name, file in (("plain", FIXTURES / "axolotl_qlora-1b.yaml"), ("cce", path)):
        argv = ["plan", "--from", str(file), "data.path=null", "--examples", "200", "--gpu", "a100-80gb", "--json"]
        assert main(argv) == 0
        out, err = capsys.readouterr()
        peaks[name] = json.loads(out.splitlines()[0])["peak_memory_bytes"]
        assert "not modeled: special_tokens" in err  # the listing goes to stderr beside --json
    assert readers.read(path).hf["cut_cross_entropy"] is True
    # CCE drops the whole logits: micro-batch 2 x 2,048 positions x 128,256 x 12 B
    assert peaks["plain"] - peaks["cce"] > 0.9 * 2 * 2048 * 128256 * 12
    # multipack: bins of seq_len, fed positions are the documents' own, keys their causal ones under flash
    spec = hfstack.HfStack(padding="multipack", attn_implementation="flash_attention_2")
    arr = np.array([100, 300, 500, 700] * 25)
    fed = hfstack.fed(spec, arr, 2, 2048, 0)
    assert fed.tokens_padded == arr.sum() and fed.widest_row == 2048
    assert fed.keys_per_token == pytest.approx((arr * (arr + 1) / 2).sum() / arr.sum())


def test_llamafactory_dataset_is_read_from_dataset_info_and_counted(tmp_path, capsys):
    (tmp_path / "data").mkdir()
    rows = [{"instruction": f"add {i} and {i}", "input": "", "output": str(2 * i)} for i in range(40)]
    (tmp_path / "data" / "sums.json").write_text(json.dumps(rows))
    (tmp_path / "data" / "dataset_info.json").write_text(json.dumps({"sums": {"file_name": "sums.json"}}))
    text = (FIXTURES / "llamafactory_llama3_lora_sft.yaml").read_text().replace("identity,alpaca_en_demo", "sums")
    (tmp_path / "lf.yaml").write_text(text)
    r = readers.read(tmp_path / "lf.yaml")
    assert r.settings["data.path"] == str(tmp_path / "data" / "sums.json")
    argv = ["plan", "--from", str(tmp_path / "lf.yaml"), "model=random:smollm2-135m", "--tokenizer", "embedded"]
    assert main([*argv, "--gpu", "l4", "--json"]) == 0
    out = json.loads(capsys.readouterr().out.splitlines()[0])
    own = ["plan", "model=random:smollm2-135m", "--tokenizer", "embedded", f"data.path={r.settings['data.path']}"]
    assert main([*own, "seq_len=2048", "epochs=3", "--gpu", "l4", "--json"]) == 0
    mine = json.loads(capsys.readouterr().out.splitlines()[0])
    assert out["tokens_total_nonpad"] == mine["tokens_total_nonpad"]  # counted as tunelab's own data counts them


def test_quantized_bases_bytes_a_weight_and_their_dequantization_scratch():
    from tunelab.sources import resolve_arch

    assert memory.NF4_BYTES == memory.nf4_bytes(double_quant=True)
    # without double quantization every block of 64 keeps an fp32 absmax: 4/64 B, not 1/64 + 4/(64 x 256)
    assert memory.nf4_bytes(double_quant=False) - memory.nf4_bytes() == pytest.approx(4 / 64 - 1 / 64 - 4 / 16384)
    assert memory.gptq_bytes(4, 128) == pytest.approx(0.5 + 2.5 / 128)
    arch = resolve_arch("llama-3.1-8b")
    assert memory.dequant_scratch_bytes(arch, 2) == 4096 * 14336 * 2  # the MLP's largest weight in bf16


def test_a_hub_model_read_as_a_catalog_row_keeps_its_own_id_for_the_tokenizer():
    """NousResearch/Llama-3.2-1B is planned on the catalog's Llama-3.2-1B row, whose short id names no tokenizer:
    the data is measured with the tool's own hub id (downloaded online), never with the short id."""
    r = readers.read(FIXTURES / "axolotl_qlora-1b.yaml")
    assert r.settings["model"] != "NousResearch/Llama-3.2-1B"  # planned on the catalog row
    assert r.tokenizer == "NousResearch/Llama-3.2-1B"
    own = readers.read(FIXTURES / "trl_example_config.yaml")  # a model plan's catalog names as it is
    assert own.tokenizer is None
