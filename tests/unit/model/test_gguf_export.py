"""GGUF export on tiny random models: every family read back by transformers' own GGUF loader, the names llama.cpp
loads, the refusals, the GGUF LoRA, the Modelfile, and that an interrupted write leaves no file."""

from __future__ import annotations

import gguf
import pytest
import torch
from conftest import TINY_SHAPE, make_tiny_llama

from tunelab.cli import main
from tunelab.errors import TunelabError
from tunelab.model import gguf_export as ge
from tunelab.model.modelfile import OLLAMA_CHATML, PromptSpec, default_system, modelfile

COMMON = TINY_SHAPE
# One tiny config per family tunelab exports. The head sizes are those transformers' GGUF loader assumes where
# it reads none from the file (Qwen3: 128, Gemma: query_pre_attn_scalar 256), as in the real checkpoints.
FAMILIES = {
    "llama": dict(tie_word_embeddings=False),
    "mistral": dict(tie_word_embeddings=False, sliding_window=None),
    "qwen2": dict(tie_word_embeddings=True),
    "qwen3": dict(tie_word_embeddings=True, head_dim=128),
    "gemma2": dict(
        head_dim=256,
        sliding_window=64,
        attn_logit_softcapping=50.0,
        final_logit_softcapping=30.0,
        query_pre_attn_scalar=256,
    ),
    "gemma3_text": dict(head_dim=256, sliding_window=64, query_pre_attn_scalar=256),
    "phi3": dict(tie_word_embeddings=False),
}


def tiny(model_type: str, vocab: int, **overrides):
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    config = AutoConfig.for_model(model_type, vocab_size=vocab, **{**COMMON, **FAMILIES[model_type], **overrides})
    model = AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():  # norms away from 1 (or 0 for Gemma), so a norm written wrong shows in the logits
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
    return model


def plan(model_type: str, quant: str = "f32") -> ge.ModelPlan:
    """A plan as check_model makes it, for the tiny word-level tokenizer (which check_model refuses)."""
    return ge.ModelPlan(ge.FAMILIES[model_type], model_type, *ge.QUANTS[quant], "gpt2", "gpt-2")


def write(tmp_path, tokenizer, model, model_type, quant="f32"):
    tokenizer.save_pretrained(tmp_path)
    model.config.save_pretrained(tmp_path)
    return ge.write_model(model, tmp_path, plan(model_type, quant), tmp_path / "m.gguf", "tiny")


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_every_family_reads_back_in_transformers_with_the_same_logits(model_type, tokenizer, tmp_path):
    from transformers import AutoModelForCausalLM

    model = tiny(model_type, len(tokenizer))
    out = write(tmp_path, tokenizer, model, model_type)
    back = AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file=out.name, dtype=torch.float32).eval()
    ids = torch.tensor([[5, 17, 30, 40, 50, 60, 7, 8]])
    with torch.no_grad():
        assert (model(ids).logits - back(ids).logits).abs().max().item() <= 1e-5
    # Every tensor is one llama.cpp loads for the architecture (gguf.MODEL_TENSORS mirrors llama-arch.cpp).
    arch = ge.FAMILIES[model_type].arch
    known = {gguf.TENSOR_NAMES[t].format(bid=b) for t in gguf.MODEL_TENSORS[arch] for b in range(2)}
    names = {t.name.rsplit(".", 1)[0] for t in gguf.GGUFReader(out).tensors}
    assert names <= known, names - known


def test_llama_q_and_k_rows_are_permuted_for_ggml_rope_and_head_dim_written_only_off_default(tokenizer, tmp_path):
    model = make_tiny_llama(len(tokenizer))
    reader = gguf.GGUFReader(write(tmp_path, tokenizer, model, "llama"))
    tensors = {t.name: torch.from_numpy(t.data.copy()) for t in reader.tensors}
    attn = model.model.layers[0].self_attn
    assert torch.equal(tensors["blk.0.attn_q.weight"], ge.permute(attn.q_proj.weight.detach(), 4, 4))
    assert torch.equal(tensors["blk.0.attn_k.weight"], ge.permute(attn.k_proj.weight.detach(), 4, 2))
    assert not torch.equal(tensors["blk.0.attn_q.weight"], attn.q_proj.weight.detach())
    assert "llama.attention.key_length" not in reader.fields  # 64 / 4 heads is llama.cpp's default
    assert reader.fields["llama.rope.dimension_count"].contents() == 16


def test_q8_0_quantizes_matrices_and_keeps_norms_f32(tokenizer, tmp_path):
    reader = gguf.GGUFReader(write(tmp_path, tokenizer, make_tiny_llama(len(tokenizer)), "llama", "q8_0"))
    types = {t.name: t.tensor_type for t in reader.tensors}
    assert types["blk.0.attn_q.weight"] == gguf.GGMLQuantizationType.Q8_0
    assert types["token_embd.weight"] == gguf.GGMLQuantizationType.Q8_0
    assert types["blk.0.attn_norm.weight"] == gguf.GGMLQuantizationType.F32
    assert reader.fields["general.file_type"].contents() == gguf.LlamaFileType.MOSTLY_Q8_0


def test_an_interrupted_write_leaves_no_file(tokenizer, tmp_path, monkeypatch):
    real, calls = ge._encode, []

    def interrupted(data, qtype):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(data, qtype)

    monkeypatch.setattr(ge, "_encode", interrupted)
    with pytest.raises(KeyboardInterrupt):
        write(tmp_path, tokenizer, make_tiny_llama(len(tokenizer)), "llama")
    assert not (tmp_path / "m.gguf").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def config_of(model_type, **overrides):
    from transformers import AutoConfig

    return AutoConfig.for_model(model_type, vocab_size=100, **{**COMMON, **FAMILIES.get(model_type, {}), **overrides})


@pytest.mark.parametrize(
    "model_type, overrides, words",
    [
        ("gpt2", {}, "model_type gpt2"),
        ("jetmoe", {"num_local_experts": 4}, "Mixture-of-Experts.*jetmoe"),
        ("qwen3_moe", {"num_experts": 4, "norm_topk_prob": True, "mlp_only_layers": [1]}, "every layer sparse"),
        ("qwen2_moe", {"num_experts": 4, "norm_topk_prob": True}, "norm_topk_prob=True"),
        ("llama", {"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}, "'dynamic'"),
        (
            "phi3",
            {
                "rope_scaling": {
                    "rope_type": "longrope",
                    "short_factor": [1.0] * 8,
                    "long_factor": [1.0] * 8,
                    "original_max_position_embeddings": 128,
                }
            },
            "'longrope'",
        ),
        ("gemma2", {"query_pre_attn_scalar": 100}, "query_pre_attn_scalar=100"),
    ],
)
def test_what_gguf_cannot_carry_is_refused_naming_it(model_type, overrides, words, tmp_path):
    """Refused from the config alone: tmp_path holds no tokenizer, which is read after."""
    config = config_of(model_type, **overrides)
    with pytest.raises(TunelabError, match=words):
        ge.check_model(config, tmp_path, "bf16", "m")


def test_a_word_level_tokenizer_and_an_unknown_quant_are_refused(tokenizer, tmp_path):
    tokenizer.save_pretrained(tmp_path)
    with pytest.raises(TunelabError, match="WordLevel"):
        ge.check_model(config_of("llama"), tmp_path, "bf16", "m")
    with pytest.raises(TunelabError, match="q4_k_m.*q8_0.*llama-quantize"):
        ge.check_model(config_of("llama"), tmp_path, "q4_k_m", "m")


def tiny_run(tmp_path, tiny_model_dir, **lora):
    """A run's layout (RUN/adapter, RUN/config.yaml) with a LoRA whose B is not zero."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from tunelab.config import TrainConfig, dump_yaml

    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    spec = dict(r=4, lora_alpha=8, target_modules=["q_proj", "k_proj", "v_proj"], init_lora_weights=False)
    model = get_peft_model(base, LoraConfig(**{**spec, **lora}))
    model.save_pretrained(tmp_path / "run" / "adapter")
    cfg = TrainConfig(model=str(tiny_model_dir))
    cfg.data.template = "compact"
    (tmp_path / "run" / "config.yaml").write_text(dump_yaml(cfg))
    return tmp_path / "run" / "adapter", model


def test_export_refuses_before_merging_or_writing(tiny_model_dir, tmp_path, capsys):
    adapter, _ = tiny_run(tmp_path, tiny_model_dir)
    out = tmp_path / "out" / "m.gguf"
    assert main(["export", "--adapter", str(adapter), "--format", "gguf", "--out", str(out)]) == 2
    assert "WordLevel" in capsys.readouterr().err
    assert not out.parent.exists()
    assert main(["export", "--adapter", str(adapter), "--format", "gguf", "--out", str(tmp_path / "m.bin")]) == 2
    assert "*.gguf" in capsys.readouterr().err


def test_gguf_lora_is_convert_lora_to_gguf_layout_with_b_rows_permuted(tiny_model_dir, tmp_path):
    adapter, model = tiny_run(tmp_path, tiny_model_dir)
    out = tmp_path / "a.gguf"
    assert (
        main(["export", "--adapter", str(adapter), "--format", "gguf-lora", "--quant", "f32", "--out", str(out)]) == 0
    )
    reader = gguf.GGUFReader(out)
    assert reader.fields["general.type"].contents() == "adapter"
    assert reader.fields["adapter.type"].contents() == "lora"
    assert reader.fields["adapter.lora.alpha"].contents() == 8.0
    tensors = {t.name: torch.from_numpy(t.data.copy()) for t in reader.tensors}
    assert set(tensors) == {f"blk.{i}.attn_{p}.weight.lora_{ab}" for i in range(2) for p in "qkv" for ab in "ab"}
    # B @ A is the update of the base weight as the GGUF model stores it: q and k rows permuted.
    layer = model.base_model.model.model.layers[0].self_attn
    for proj, short, kv in (("q_proj", "q", 4), ("k_proj", "k", 2), ("v_proj", "v", None)):
        lora = getattr(layer, proj)
        delta = (lora.lora_B["default"].weight @ lora.lora_A["default"].weight).detach()
        want = ge.permute(delta, 4, kv) if kv else delta
        got = tensors[f"blk.0.attn_{short}.weight.lora_b"] @ tensors[f"blk.0.attn_{short}.weight.lora_a"]
        assert torch.allclose(got, want, atol=1e-6)
    text = (tmp_path / "Modelfile").read_text()
    assert f"FROM {tiny_model_dir}" in text and "ADAPTER ./a.gguf" in text


def test_gguf_lora_refuses_dora_and_per_module_ranks_and_rescales_rslora():
    config = config_of("llama")
    lora = {"peft_type": "LORA", "r": 16, "lora_alpha": 32}
    assert ge.check_lora(lora, config, "f16", "m").alpha == 32.0
    assert ge.check_lora({**lora, "use_rslora": True}, config, "f16", "m").alpha == pytest.approx(32 * 4)
    for key, value in (("use_dora", True), ("rank_pattern", {"q_proj": 8})):
        with pytest.raises(TunelabError, match=f"{key} is set"):
            ge.check_lora({**lora, key: value}, config, "f16", "m")
    with pytest.raises(TunelabError, match="f32, f16, bf16, q8_0"):
        ge.check_lora(lora, config, "q4_0", "m")
    with pytest.raises(TunelabError, match="stacked experts"):  # per-expert factors: export those merged
        ge.check_lora({**lora, "target_parameters": ["experts.gate_up_proj"]}, config, "f16", "m")


def test_modelfile_template_is_the_training_prompt():
    compact = modelfile("./m.gguf", PromptSpec("alpaca", "compact"), None, "</s>")
    assert 'TEMPLATE """### Instruction:\n{{ .Prompt }}\n### Response:\n"""' in compact
    assert 'PARAMETER stop "</s>"' in compact and compact.startswith("FROM ./m.gguf\n")
    chatml = (
        "{% if messages[0]['role'] != 'system' %}{{ '<|im_start|>system\\nYou are SmolLM.<|im_end|>\\n' }}{% endif %}"
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    )
    chat = modelfile("./m.gguf", PromptSpec("chat"), chatml, "<|im_end|>")
    assert f'TEMPLATE """{OLLAMA_CHATML}"""' in chat
    assert 'SYSTEM """You are SmolLM."""' in chat and chat.count("PARAMETER stop") == 1
    assert default_system(chatml) == "You are SmolLM."
    other = modelfile("./m.gguf", PromptSpec("chat"), "{{ bos_token }}[INST] ...", "</s>")
    assert "TEMPLATE" not in other  # Ollama reads tokenizer.chat_template from the GGUF itself


def spm_tokenizer():
    """A SentencePiece-style BPE (Llama-2, Mistral, Gemma): metaspace words, unknown bytes as <0xNN> tokens."""
    import string

    from tokenizers import Tokenizer, decoders, models, normalizers
    from transformers import PreTrainedTokenizerFast

    pieces = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256)), "\u2581"]
    pieces += [*string.ascii_letters, *string.digits, *".,!?", "\u2581t", "he", "\u2581the"]
    merges = [("\u2581", "t"), ("h", "e"), ("\u2581t", "he")]
    vocab = {piece: i for i, piece in enumerate(pieces)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, byte_fallback=True, unk_token="<unk>", fuse_unk=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    tok.decoder = decoders.Sequence(
        [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")


def test_a_sentencepiece_style_tokenizer_is_written_with_scores_and_reads_back_to_the_same_ids(tmp_path):
    from transformers import AutoTokenizer

    tokenizer = spm_tokenizer()
    tokenizer.save_pretrained(tmp_path)
    model = make_tiny_llama(len(tokenizer), pad_token_id=None)
    model.config.save_pretrained(tmp_path)
    spm = ge.check_model(model.config, tmp_path, "f32", "spm")
    assert (spm.tokenizer, spm.pre) == ("llama", "default")
    out = ge.write_model(model, tmp_path, spm, tmp_path / "m.gguf", "spm")
    reader = gguf.GGUFReader(out)
    assert reader.fields["tokenizer.ggml.model"].contents() == "llama"
    assert len(reader.fields["tokenizer.ggml.scores"].contents()) == len(tokenizer)
    back = AutoTokenizer.from_pretrained(tmp_path, gguf_file=out.name)
    for text in ("the cat", "Hello, World!", "ünïcode 日本"):  # the last two need byte fallback
        assert back.encode(text) == tokenizer.encode(text)


# One tiny config per MoE family (issue 67), every layer sparse and the top-k normalisation llama.cpp applies. The
# Qwen expert widths are transformers' defaults, which its GGUF loader assumes (it reads no expert width back).
MOE = {
    "qwen3_moe": dict(num_experts=4, num_experts_per_tok=2, norm_topk_prob=True, head_dim=16),
    "qwen2_moe": dict(num_experts=4, num_experts_per_tok=2),
    "mixtral": dict(num_local_experts=4, num_experts_per_tok=2, tie_word_embeddings=False),
    "olmoe": dict(num_experts=4, num_experts_per_tok=2, intermediate_size=32),
    "gpt_oss": dict(num_local_experts=4, num_experts_per_tok=2, intermediate_size=32, head_dim=16, sliding_window=8),
}


@pytest.mark.parametrize("model_type", sorted(MOE))
def test_moe_families_write_llamacpp_expert_stacks_and_qwen_read_back_with_the_same_logits(
    model_type, tokenizer, tmp_path
):
    """Stacked experts as llama.cpp's ffn_{gate,up,down}_exps (gate_up split gate first), routers F32 as
    ffn_gate_inp, the expert metadata; transformers' GGUF loader (Qwen2-MoE and Qwen3-MoE: the MoE architectures
    it reads) gives the same logits."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config_of(model_type, **MOE[model_type])).eval()
    out = write(tmp_path, tokenizer, model, model_type, "q8_0" if model_type == "olmoe" else "f32")
    reader = gguf.GGUFReader(out)
    arch = ge.FAMILIES[model_type].arch
    known = {gguf.TENSOR_NAMES[t].format(bid=b) for t in gguf.MODEL_TENSORS[arch] for b in range(2)}
    tensors = {t.name: t for t in reader.tensors}
    assert {n.rsplit(".", 1)[0] for n in tensors} <= known
    prefix = gguf.MODEL_ARCH_NAMES[arch]
    assert reader.fields[f"{prefix}.expert_count"].contents() == 4
    assert reader.fields[f"{prefix}.expert_used_count"].contents() == 2
    experts = model.model.layers[0].mlp.experts
    assert tensors["blk.0.ffn_gate_inp.weight"].tensor_type == gguf.GGMLQuantizationType.F32
    if model_type == "olmoe":  # quantized stacks: their types and byte shapes; no reader to compare values
        assert tensors["blk.0.ffn_up_exps.weight"].tensor_type == gguf.GGMLQuantizationType.Q8_0
        return
    read = {k: torch.from_numpy(tensors[f"blk.0.ffn_{k}_exps.weight"].data.copy()) for k in ("gate", "up", "down")}
    if model_type == "gpt_oss":  # GptOssModel: transposed stacks, gate and up interleaved, their biases, the sinks
        gate_up, bias = experts.gate_up_proj.detach().transpose(1, 2), experts.gate_up_proj_bias.detach()
        assert torch.equal(read["gate"], gate_up[:, ::2]) and torch.equal(read["up"], gate_up[:, 1::2])
        assert torch.equal(read["down"], experts.down_proj.detach().transpose(1, 2))
        for name, want in (("gate", bias[:, ::2]), ("up", bias[:, 1::2]), ("down", experts.down_proj_bias)):
            assert torch.equal(torch.from_numpy(tensors[f"blk.0.ffn_{name}_exps.bias"].data.copy()), want.detach())
        sinks = torch.from_numpy(tensors["blk.0.attn_sinks.weight"].data.copy())
        assert torch.equal(sinks, model.model.layers[0].self_attn.sinks.detach())
        assert "blk.0.ffn_gate_inp.bias" in tensors and "blk.0.post_attention_norm.weight" in tensors
        assert reader.fields[f"{prefix}.attention.sliding_window"].contents() == 8
        assert reader.fields[f"{prefix}.expert_feed_forward_length"].contents() == 32
        assert reader.fields[f"{prefix}.rope.scaling.yarn_beta_fast"].contents() == 32.0
        return
    width = experts.gate_up_proj.shape[1] // 2
    assert torch.equal(read["gate"], experts.gate_up_proj.detach()[:, :width])
    assert torch.equal(read["up"], experts.gate_up_proj.detach()[:, width:])
    assert torch.equal(read["down"], experts.down_proj.detach())
    if model_type == "qwen2_moe":
        assert reader.fields[f"{prefix}.expert_shared_feed_forward_length"].contents() == 5632
    if model_type not in ("qwen2_moe", "qwen3_moe"):
        return
    assert reader.fields[f"{prefix}.expert_feed_forward_length"].contents() == experts.down_proj.shape[-1]
    back = AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file=out.name, dtype=torch.float32).eval()
    ids = torch.tensor([[5, 17, 30, 40, 50, 60, 7, 8]])
    with torch.no_grad():
        assert (model(ids).logits - back(ids).logits).abs().max().item() <= 1e-5
