"""plan's HF Trainer + PEFT stack (plan/hfstack.py): the spec's validation, each part's direction on time and
memory, the `--hf` flags end to end, and the Python API's `hf=`."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tunelab import api
from tunelab.cli import main
from tunelab.config import AdapterConfig, BatchConfig, ComputeConfig, LoraConfig, RunConfig
from tunelab.errors import TunelabError
from tunelab.plan import catalog, hfstack, workload
from tunelab.plan.estimate import Device, Job, estimate
from tunelab.sources import resolve_arch


def one_b():
    return resolve_arch("random:llama-3.2-1b")


def h100() -> Device:
    return Device(catalog.gpu("h100-sxm"), catalog.runtime_overhead("cuda"))


def lengths(lo: int = 200, hi: int = 4000, n: int = 256) -> workload.Lengths:
    arr = np.random.default_rng(0).integers(lo, hi, n)
    return workload.Lengths(len(arr), float(arr.mean()), float(arr.mean()) / 2, "test", arr)


def hf_job(seq_len: int = 4096, micro_batch: int = 2, grad_ckpt: bool = False, method: str = "lora", **spec) -> Job:
    quant = "nf4" if method == "qlora" else "none"
    return Job(
        adapter=AdapterConfig(method=method, base_quant=quant, lora=LoraConfig(r=16)),
        batch=BatchConfig(seq_len=seq_len, micro_batch=micro_batch),
        compute=ComputeConfig(precision="bf16", compile=False, grad_ckpt=grad_ckpt),
        run=RunConfig(save_total_limit=1),
        stack="hf-peft",
        hf=hfstack.HfStack(**spec).check(),
    )


def run(job: Job, data: workload.Lengths | None = None):
    return estimate(one_b(), data or lengths(), job, h100())


@pytest.mark.parametrize(
    ("items", "message"),
    [
        (["attn_implementation=flash"], "hf attn_implementation='flash': choose from eager, sdpa, flash_attention_2"),
        (["padding=bucketed"], "hf padding='bucketed': choose from longest, max_length, padding_free, packed"),
        (["optim=sgd"], "hf optim='sgd': choose from adamw_torch"),
        (["use_liger_kernel=maybe"], "hf use_liger_kernel='maybe': choose from true, false"),
        (["padding=padding_free"], "only in flash_attention_2"),
        (["nonsense=1"], "hf nonsense: not a choice plan models; choose from attn_implementation"),
        (["torch_compile=true"], "hf torch_compile: plan models an HF script's eager blocks only"),
        (["attn_implementation"], "--hf 'attn_implementation': write KEY=VALUE"),
    ],
)
def test_bad_hf_choices_name_the_key_and_the_choices(items, message):
    with pytest.raises(TunelabError, match=None) as err:
        hfstack.parse(items)
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_hf_names_of_tunelab_settings_become_config_overrides():
    spec, overrides = hfstack.parse(
        ["attn_implementation=eager", "gradient_checkpointing=true", "per_device_train_batch_size=4", "bf16=true"]
    )
    assert spec.attn_implementation == "eager"
    assert overrides == ["grad_ckpt=true", "micro_batch=4", "precision=bf16"]
    assert hfstack.parse({"use_liger_kernel": True, "optim": "paged_adamw_8bit"})[0].optimizer == "paged_adamw_8bit"


def test_eager_attention_holds_the_scores_and_takes_longer_than_sdpa_at_long_seq():
    data = lengths(6000, 8000)
    eager, sdpa = run(hf_job(8192, 1, attn_implementation="eager"), data), run(hf_job(8192, 1), data)
    assert eager.memory.activations > 2 * sdpa.memory.activations
    assert eager.step.total > sdpa.step.total


def test_flash_attention_computes_causal_keys_and_padding_nothing():
    sdpa, flash = run(hf_job()), run(hf_job(attn_implementation="flash_attention_2"))
    assert flash.step.attention_s < 0.6 * sdpa.step.attention_s
    assert flash.memory.activations < sdpa.memory.activations  # no k, v repeated to every head


def test_liger_removes_the_whole_vocabulary_logits():
    plain, liger = run(hf_job()), run(hf_job(use_liger_kernel=True))
    assert plain.memory.logits_loss > 20 * liger.memory.logits_loss
    assert liger.memory.activations < plain.memory.activations  # fused norms and SwiGLU keep less
    assert liger.step.memory_s < plain.step.memory_s and liger.step.fixed_s < plain.step.fixed_s


def test_gradient_checkpointing_lowers_memory_and_raises_time():
    off, on = run(hf_job()), run(hf_job(grad_ckpt=True))
    assert on.memory.activations < 0.5 * off.memory.activations
    assert on.step.total > off.step.total


def test_an_8bit_optimizer_keeps_fewer_state_bytes_and_a_fused_one_moves_fewer():
    torch_adamw, eight = run(hf_job()), run(hf_job(optim="adamw_8bit"))
    assert eight.memory.optimizer_states < 0.5 * torch_adamw.memory.optimizer_states
    assert eight.job.optimizer.optimizer == "adamw_8bit"
    fused = run(hf_job(optim="adamw_torch_fused"))
    assert fused.step.memory_s < torch_adamw.step.memory_s


def test_padding_to_max_length_feeds_more_than_the_longest_and_padding_free_feeds_none():
    longest, grouped = run(hf_job()), run(hf_job(group_by_length=True))
    full = run(hf_job(padding="max_length"))
    free = run(hf_job(padding="padding_free", attn_implementation="flash_attention_2"))
    fed = {
        k: e.work.tokens_padded for k, e in (("max", full), ("longest", longest), ("grouped", grouped), ("free", free))
    }
    assert fed["max"] > fed["longest"] > fed["grouped"] > fed["free"] == longest.work.tokens_nonpad
    assert full.speed.train_s > longest.speed.train_s > free.speed.train_s


def test_kbit_preparation_keeps_the_unquantized_weights_in_fp32():
    arch = one_b()
    prepared = estimate(arch, lengths(), hf_job(method="qlora"), h100())
    plain = estimate(arch, lengths(), hf_job(method="qlora", prepare_model_for_kbit_training=False), h100())
    rest = arch.total_params - arch.block_linear_params
    assert prepared.memory.weights - plain.memory.weights == pytest.approx(rest * 2, rel=1e-6)


def test_the_hf_stack_takes_its_optimizer_from_optim_not_the_config():
    job = hf_job(optim="paged_adamw_8bit")
    assert run(job).job.optimizer.optimizer == "paged_adamw_8bit"
    assert run(job.but(stack="tunelab", hf=None)).job.optimizer.optimizer == "adamw"


def test_plan_cli_takes_hf_flags_and_says_what_tunelab_would_save(capsys):
    argv = [
        "plan",
        "--model",
        "llama-3.2-1b",
        "--examples",
        "500",
        "--mean-tokens",
        "1500",
        "--seq-len",
        "2048",
        "--gpu",
        "h100-sxm",
    ]
    assert (
        main([*argv, "--stack", "hf-peft", "--hf", "attn_implementation=eager", "--hf", "gradient_checkpointing=true"])
        == 0
    )
    out = capsys.readouterr().out
    assert "HF script assumed: attn_implementation=eager" in out and "gradient_checkpointing=True" in out
    assert "tunelab with this config" in out and "saves" in out
    assert "compile auto" not in out
    assert main([*argv, "--stack", "hf-peft", "--hf", "use_liger_kernel=true", "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert "use_liger_kernel=True" in record["hf"] and record["tunelab_time_s"] < record["time_s"]
    assert main([*argv, "--hf", "optim=adamw_torch"]) == 2  # --hf without --stack hf-peft
    assert "add --stack hf-peft" in capsys.readouterr().err


def test_api_estimate_takes_the_hf_choices():
    def peak(**hf):
        (r,) = api.estimate(
            None,
            "model=random:llama-3.2-1b",
            "seq_len=4096",
            gpu="h100-sxm",
            examples=64,
            mean_tokens=2048,
            stack="hf-peft",
            hf=hf,
        )
        return r.single

    plain, ckpt = peak(), peak(gradient_checkpointing=True, attn_implementation="flash_attention_2")
    assert ckpt.job.compute.grad_ckpt and ckpt.job.hf.attn_implementation == "flash_attention_2"
    assert ckpt.memory.total < plain.memory.total


def test_shipped_fit_prices_sdpas_masked_kernel_per_device_kind():
    cuda, rows = catalog.stack_pair_bytes("hf-peft", "cuda")
    cpu, _ = catalog.stack_pair_bytes("hf-peft", "cpu")
    assert cuda > 0 and cpu > 0 and any("hf-trainer-liger" in r for r in rows)
    assert catalog.stack_pair_bytes("tunelab", "cuda") == (0.0, ())


def test_only_attention_with_a_padding_mask_pays_the_masked_kernel():
    """The fitted bytes per head-pair are attention's with a 4D padding mask: a flash_attention_2, padding-free or
    packed run takes a causal path and pays none of it, so its attention is the kernel's FLOPs alone."""
    data = lengths(1000, 1100)  # nearly equal lengths: padding changes little between the runs
    masked = run(hf_job(), data)
    flash = run(hf_job(attn_implementation="flash_attention_2"), data)
    assert masked.job.hf.masked_kernel and not flash.job.hf.masked_kernel
    assert not hfstack.HfStack(padding="packed").masked_kernel
    assert masked.step.attention_s > 3 * flash.step.attention_s
    assert "masked attention" in masked.efficiency.label and "masked attention" not in flash.efficiency.label


def test_plan_suggests_the_hf_scripts_own_changes():
    from tunelab.plan.estimate import suggestions

    base = run(hf_job())
    found = {s.change: s for s in suggestions(one_b(), lengths(), base)}
    assert found["--hf use_liger_kernel=true"].peak_memory_bytes < base.memory.total
    assert found["--hf padding=padding_free attn_implementation=flash_attention_2"].saved_s > 0
    assert "packing on" not in found  # an HF script's packing is its padding choice


def test_trl_packing_fills_rows_and_attends_over_the_whole_row():
    """TRL's packing=True without position ids: rows of seq_len, no padding, causal over the whole row, so fewer
    micro-batches than padded examples and more attention per token than padding-free's documents."""
    data = lengths(200, 1000)
    packed = run(hf_job(4096, 2, padding="packed"), data)
    free = run(hf_job(4096, 2, padding="padding_free", attn_implementation="flash_attention_2"), data)
    assert packed.work.tokens_padded == pytest.approx(packed.work.tokens_nonpad, rel=0.03)  # the last row
    assert packed.work.epoch.micro_batches < free.work.epoch.micro_batches
    assert packed.layout.row_len == 4096
    per_token = [e.step.attention_s * e.work.epoch.micro_batches / e.work.epoch.tokens_padded for e in (packed, free)]
    assert per_token[0] > 3 * per_token[1]


def test_hf_choices_load_from_a_yaml_file(tmp_path):
    path = tmp_path / "hf.yaml"
    path.write_text("attn_implementation: eager\ngradient_checkpointing: true\nuse_liger_kernel: true\n")
    spec, overrides = hfstack.parse([str(path), "optim=adamw_8bit"])
    assert (spec.attn_implementation, spec.use_liger_kernel, spec.optim) == ("eager", True, "adamw_8bit")
    assert overrides == ["grad_ckpt=true"]
    (tmp_path / "bad.yaml").write_text("- a list\n")
    with pytest.raises(TunelabError, match="expected a mapping of TrainingArguments names"):
        hfstack.parse([str(tmp_path / "bad.yaml")])


def test_the_shipped_hf_choices_are_the_tuned_peers(capsys):
    """configs/hf/trainer-tuned.yaml is bench/peers.py's tuned recipe (hfstack.TUNED_PEER, what the measured HF
    rows ran), and `tunelab plan --hf FILE` takes it."""
    from pathlib import Path

    path = Path(__file__).resolve().parents[3] / "configs" / "hf" / "trainer-tuned.yaml"
    spec, overrides = hfstack.parse([str(path)])
    assert spec == hfstack.TUNED_PEER
    assert overrides == ["grad_ckpt=false", "micro_batch=16", "precision=bf16"]
    argv = ["plan", "--model", "llama-3.2-1b", "--examples", "200", "--mean-tokens", "600", "--gpu", "h200"]
    assert main([*argv, "--stack", "hf-peft", "--hf", str(path)]) == 0
    assert "group_by_length=True, optim=adamw_torch_fused" in capsys.readouterr().out
