"""Memory from its parts (plan/memory.py, Job.parts): checkpointing variants, DeepSpeed ZeRO's buffers on one
GPU, a 4-bit base's scratch and double quantization, the loss kernel of another tool, varied row widths, and the
allocated / reserved / process figures; each reaching the prediction from a reader's switch."""

from __future__ import annotations

import json

import pytest

from tunelab import api
from tunelab.errors import TunelabError
from tunelab.plan import memory, readers

GIB = 2**30
# A catalog model (shapes only) on a catalog GPU: plan reads no weights.
BASE = ("model=meta-llama/Llama-3.2-1B", "seq_len=1024", "micro_batch=2", "packing=true", "compile=false")


def plan(*overrides, parts=None, gpu="a100-80gb", **kw):
    (r,) = api.estimate(None, *BASE, *overrides, gpu=gpu, examples=64, mean_tokens=1024, parts=parts, **kw)
    return r.single


def test_checkpointing_variants_order_their_saved_activations():
    layers, per_layer, layer_input = 16, 10.0, 1.0
    none, full = (memory.checkpointed_bytes(layers, per_layer, layer_input, e, False) for e in (0, 1))
    every2, every4, every16 = (memory.checkpointed_bytes(layers, per_layer, layer_input, e, False) for e in (2, 4, 16))
    offloaded = memory.checkpointed_bytes(layers, per_layer, layer_input, 1, True)
    assert none == layers * per_layer and full == layers * layer_input + per_layer
    assert none > every4 > every2 > full > offloaded
    # one layer in 16 is the last one, recomputed first while every other layer's activations are alive: no saving
    assert every16 == none + layer_input
    assert every2 == 8 * layer_input + 8 * per_layer + per_layer  # torchtune's ac_option 2: one layer in two


def test_a_torchtune_selective_config_and_its_loss_reach_the_prediction(tmp_path):
    path = tmp_path / "tt.yaml"
    path.write_text(
        "model:\n  _component_: torchtune.models.llama3_2.lora_llama3_2_1b\n  lora_attn_modules: [q_proj, v_proj]\n"
        "enable_activation_checkpointing: true\nac_mode: selective\nac_option: 2\n"
        "loss:\n  _component_: torchtune.modules.loss.CEWithChunkedOutputLoss\n"
    )
    r = readers.read(path)
    assert r.parts == {"ckpt_every": 2, "loss_kernel": "chunked_output", "pure_bf16": True}
    full, selective = plan("grad_ckpt=true"), plan("grad_ckpt=true", parts={"ckpt_every": 2})
    assert selective.memory.activations > full.memory.activations
    chunked_output = plan(parts={"loss_kernel": "chunked_output"})
    assert chunked_output.memory.logits_loss > plan().memory.logits_loss
    with pytest.raises(TunelabError, match="loss kernel 'fused'"):
        plan(parts={"loss_kernel": "fused"})


def test_zero_buffers_on_one_gpu_follow_the_stage_and_a_deepspeed_file_sets_it(tmp_path):
    trainable, total = 10_000_000, 1_000_000_000
    one, two = (memory.zero_buffer_bytes(s, trainable, total, 2, 2) for s in (1, 2))
    assert memory.zero_buffer_bytes(0, trainable, total, 2, 2) == 0
    assert two - one == trainable * 2  # stage 2's contiguous gradient buffer
    assert one == trainable * 4 + 2 * trainable * 2  # fp32 master copy + both buckets, capped by what trains
    (tmp_path / "ds.json").write_text(json.dumps({"zero_optimization": {"stage": 2}}))
    for name, value in (("ds.json", 2), ("deepspeed_configs/zero3_bf16.json", 3)):
        cfg = tmp_path / "args.yaml"
        cfg.write_text(f"model_name_or_path: meta-llama/Llama-3.2-1B\nbf16: true\ndeepspeed: {name}\n")
        assert readers.read(cfg, "trl").parts == {"zero_stage": value}
    with_zero = plan("method=full", "weights=bf16", parts={"zero_stage": 2})
    assert with_zero.memory.zero_buffers > 0 and plan("method=full", "weights=bf16").memory.zero_buffers == 0


def test_a_4bit_base_holds_its_dequantized_weight_and_double_quantization_saves_absmaxes():
    qlora, lora = plan("method=qlora"), plan("method=lora")
    assert qlora.memory.dequant_scratch == 8192 * 2048 * 2 and lora.memory.dequant_scratch == 0
    single = plan("method=qlora", parts={"double_quant": False})
    assert single.memory.weights > qlora.memory.weights and single.memory.total > qlora.memory.total
    assert plan("method=qlora", parts={"gptq_bits": 4}).memory.weights > qlora.memory.weights


def test_the_stated_figures_order_allocated_reserved_process_and_the_peak_is_the_process():
    e = plan()
    f = e.figures
    assert f.allocated < f.reserved < f.process == e.memory.total
    assert f.process - f.reserved == memory.CUDA_CONTEXT_BYTES
    assert memory.FIGURE_KINDS["active"] == "allocated"


def test_rows_of_varied_width_add_the_allocators_reserve_only_when_padded_per_batch():
    from tunelab.sources import resolve_arch

    e = plan(stack="hf-peft", hf={"padding": "longest"})
    arch, job, lay = resolve_arch(BASE[0].split("=")[1]), e.job, e.layout
    per_layer, _, _ = memory._layer_bytes(arch, job, lay)
    assert memory.varied_reserve_bytes(arch, job, lay, lay.row_len / 4) == pytest.approx(per_layer * 3 / 4)
    assert memory.varied_reserve_bytes(arch, job, lay, lay.row_len) == 0  # one width: blocks reused
    assert e.varied_reserve == 0  # the assumed equal lengths
    f = memory.stated_figures(10 * GIB, GIB, memory.CUDA_CONTEXT_BYTES, varied_reserve=GIB)
    assert f.reserved - f.allocated == GIB - memory.CUDA_CONTEXT_BYTES + GIB


CASES = """
cases:
- id: tt-lora
  stack: torchtune (lora_finetune_single_device)
  model: meta-llama/Llama-3.2-1B-Instruct
  gpu: A100 (80GB implied)
  gpus: 1
  method: lora
  seq_len: 1024
  micro_batch: 2
  grad_accum: 1
  packing: true
  grad_ckpt: true
  lora_r: 8
  lora_targets: q_proj, v_proj
  precision: bf16
  attn_compile: torch.compile on; chunked cross-entropy
  notes: ''
  tok_s: 20000
  mem_gib: 3.0
- id: tt-unpacked
  stack: torchtune (full_finetune_single_device)
  model: meta-llama/Llama-3.2-1B-Instruct
  gpu: A100 (80GB implied)
  gpus: 1
  method: full
  seq_len: 1024
  micro_batch: 2
  grad_accum: 1
  packing: false
  grad_ckpt: false
  precision: bf16
  attn_compile: no compile; standard cross-entropy
  notes: ''
  tok_s: 2000
  mem_gib: 20.0
"""


def test_bench_fit_published_holds_each_stack_against_the_figure_it_publishes(tmp_path, capsys):
    from tunelab.bench import published
    from tunelab.cli import main

    path = tmp_path / "cases.yaml"
    path.write_text(CASES)
    lora, unpacked = published.rows([path])
    assert lora.mem_kind == "active" and lora.parts == {"pure_bf16": True, "loss_kernel": "chunked_output"}
    assert unpacked.tok_why and unpacked.mem_why  # padded rows of unpublished lengths: not held
    s = published.summary([lora, unpacked])["torchtune"]
    assert s["tok"]["rows"] == 1 and s["tok"]["median_abs"] == pytest.approx(abs(lora.tok_error))
    assert main(["bench", "fit", "--published", str(path)]) == 0
    out = capsys.readouterr().out
    assert "| tt-lora | torchtune |" in out and "| torchtune | 1 |" in out
    bad = tmp_path / "bad.yaml"
    bad.write_text("a: 1\n")
    with pytest.raises(TunelabError, match="no `cases:` list"):
        published.rows([bad])


def test_llamafactory_and_trl_quantization_and_offloaded_checkpointing_switches_reach_the_parts(tmp_path):
    lf = tmp_path / "lf.yaml"
    lf.write_text(
        "model_name_or_path: meta-llama/Llama-3.2-1B\nstage: sft\nfinetuning_type: lora\nquantization_bit: 4\n"
        "double_quantization: false\nuse_unsloth_gc: true\n"
    )
    r = readers.read(lf)
    assert r.parts == {"double_quant": False} and r.settings["activation_offload"] is True
    trl = tmp_path / "trl.yaml"
    trl.write_text("model_name_or_path: meta-llama/Llama-3.2-1B\nload_in_4bit: true\nuse_bnb_nested_quant: false\n")
    assert readers.read(trl, "trl").parts == {"double_quant": False}


def test_a_gptq_base_from_axolotl_or_llamafactory_is_priced_at_gptqs_bytes(tmp_path):
    ax = tmp_path / "ax.yaml"
    ax.write_text("base_model: meta-llama/Llama-3.2-1B\nadapter: lora\ngptq: true\nsequence_len: 512\n")
    lf = tmp_path / "lf.yaml"
    lf.write_text(
        "model_name_or_path: meta-llama/Llama-3.2-1B\nstage: sft\nfinetuning_type: lora\nquantization_method: gptq\n"
    )
    for path in (ax, lf):
        r = readers.read(path)
        assert r.parts == {"gptq_bits": 4} and r.settings["method"] == "qlora", path.name


def test_torchtune_chunked_output_on_a_cpu_holds_the_head_copies_its_bmm_makes(monkeypatch):
    # measured: the head over each sequence chunk of a 2-row micro-batch copies the head weight once a row on a CPU
    # (benchmarks/plan-accuracy/cpu-memory-parts_epyc-avx512bf16-2c_2026-12-07.md); a GPU's term has no copies
    from tunelab import probe

    monkeypatch.setattr(probe, "matmul_peak", lambda d, dev: (1e11, 256))  # no probe: memory only
    monkeypatch.setattr(probe, "copy_bandwidth", lambda dev: 1e10)
    parts = {"loss_kernel": "chunked_output"}
    cpu = plan("compile=true", "precision=fp32", parts=parts, gpu="local").memory.logits_loss
    gpu = plan("compile=true", parts=parts).memory.logits_loss
    v, h, p = 128256, 2048, 2 * 1024
    copies = 2 * v * h * 4
    assert cpu == round(memory.loss_kernel_bytes("chunked_output", p, v, h, 4, 1024, True) + copies)
    assert gpu == round(memory.loss_kernel_bytes("chunked_output", p, v, h, 2, 1024, True))
