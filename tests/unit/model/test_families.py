"""Model families beyond Llama, built tiny and random in code: tunelab's loss (its own attention paths, its fused
head and loss) equals transformers' own loss on the same rows, packed or not, with each family's features active:
sliding windows narrower than the test documents, Gemma-2's attention and final logit soft-capping (small caps
and a wide initialisation, so the tanh bites), Gemma's embedding scaling. Families tunelab cannot train are
refused in one line before any weights load (families.py).

Comparisons are fp32: the paths differ from transformers' eager attention only in summation order.
"""

from __future__ import annotations

import json

import pytest
import torch
from conftest import TINY_SHAPE, make_tokenizer, packed_ids, write_jsonl

from tunelab import families, sources
from tunelab.cli import main
from tunelab.data.packing import layout_from_lengths
from tunelab.errors import TunelabError
from tunelab.model import attention
from tunelab.plan import arch as archmod
from tunelab.train.loss import CausalLMLoss

WINDOW = 8  # narrower than every test document, so windowed layers differ from full ones
WIDTH = 64
ROWS = [[20, 25, 19], [30, 22]]  # documents packed per row; the second row has a 12-token padded tail

TINY = dict(TINY_SHAPE, initializer_range=0.2)


def family_config(family: str, vocab: int, window: int | None = WINDOW):
    """A tiny config of `family` with its features on: every windowed family gets a WINDOW-token window (on
    one of the two layers where the family mixes window and full layers)."""
    import transformers as tf

    # Gemma's sliding layers also take another RoPE base, so "no window" keeps the layer types and widens the
    # window past every test row instead.
    both = ["sliding_attention", "full_attention"]
    if family == "qwen2":
        return tf.Qwen2Config(
            **TINY, vocab_size=vocab, use_sliding_window=window is not None, sliding_window=window, max_window_layers=1
        )
    if family == "qwen3":
        return tf.Qwen3Config(
            **TINY, vocab_size=vocab, use_sliding_window=window is not None, sliding_window=window, max_window_layers=1
        )
    if family == "mistral":
        return tf.MistralConfig(**TINY, vocab_size=vocab, sliding_window=window)
    if family == "phi3":
        return tf.Phi3Config(**TINY, vocab_size=vocab, sliding_window=window)
    if family == "gemma2":
        return tf.Gemma2Config(
            **TINY,
            vocab_size=vocab,
            head_dim=16,
            query_pre_attn_scalar=16,
            sliding_window=window or 4096,
            layer_types=both,
            attn_logit_softcapping=1.5,
            final_logit_softcapping=2.0,
        )
    if family == "gemma3":
        return tf.Gemma3TextConfig(
            **TINY,
            vocab_size=vocab,
            head_dim=16,
            query_pre_attn_scalar=16,
            sliding_window=window or 4096,
            layer_types=both,
        )
    raise AssertionError(family)


FAMILIES = ["qwen2", "qwen3", "mistral", "gemma2", "gemma3", "phi3"]


def build(family: str, vocab: int, implementation: str, window: int | None = WINDOW, seed: int = 0):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(family_config(family, vocab, window), attn_implementation=implementation)
    return model.float()


@pytest.fixture(scope="module")
def vocab():
    return len(make_tokenizer())


def pair(family, vocab, path):
    """tunelab's model on `path` (slots | flex) and transformers' eager reference, with the same weights."""
    ours = build(family, vocab, attention.register(path))
    reference = build(family, vocab, "eager")
    reference.load_state_dict(ours.state_dict())
    return ours.train(), reference.train()


def packed(rows, vocab, seed=0):
    return packed_ids(rows, vocab, WIDTH, seed)


def documents(rows):
    out = []
    for r, row in enumerate(rows):
        at = 0
        for n in row:
            out.append((r, at, n))
            at += n
    return out


def transformers_sum(reference, ids, rows):
    """Summed token loss of every document run alone through transformers' own forward (its loss is a mean)."""
    total = 0.0
    for r, s, n in documents(rows):
        doc = ids[r : r + 1, s : s + n]
        total = total + reference(input_ids=doc, labels=doc).loss * (n - 1)
    return total


def tunelab_packed(model, ids, positions, rows, path):
    """tunelab's summed loss over the packed rows: every document's tokens but its first are targets."""
    docs = documents(rows)
    index = torch.cat([torch.arange(r * WIDTH + s, r * WIDTH + s + n - 1) for r, s, n in docs])
    targets = torch.cat([ids[r, s + 1 : s + n] for r, s, n in docs])
    layout = layout_from_lengths(rows, WIDTH) if path == "slots" else None
    return CausalLMLoss(model)(ids, positions, index, targets, layout)


def attention_grad(model):
    return model.model.layers[0].self_attn.o_proj.weight.grad.clone()


@pytest.mark.parametrize("path", ["slots", "flex"])
@pytest.mark.parametrize("family", FAMILIES)
def test_packed_loss_equals_transformers_one_by_one(family, path, vocab):
    """Packed rows through tunelab (slot or flex path, training forward and backward) give the summed loss and
    the gradients that transformers' own forward gives for each document alone: windows, soft-caps and
    embedding scaling all applied, nothing leaking across documents."""
    ours, reference = pair(family, vocab, path)
    ids, positions = packed(ROWS, vocab)
    loss = tunelab_packed(ours, ids, positions, ROWS, path)
    loss.backward()
    expected = transformers_sum(reference, ids, ROWS)
    expected.backward()
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
    assert torch.allclose(attention_grad(ours), attention_grad(reference), rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("family", FAMILIES)
def test_unpacked_rows_equal_transformers_loss(family, vocab):
    """One document per row, no layout (the path evaluation and unpacked batches take): the fused loss equals
    transformers' `model(input_ids, labels=...)` loss, final-logit soft-capping included."""
    ours, reference = pair(family, vocab, "slots")
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(3, vocab, (2, 40), generator=generator)
    index = torch.cat([torch.arange(r * 40, r * 40 + 39) for r in range(2)])
    with torch.no_grad():
        loss = CausalLMLoss(ours)(ids, None, index, ids[:, 1:].reshape(-1))
        expected = reference(input_ids=ids, labels=ids).loss * index.numel()
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)


@pytest.mark.parametrize("family", FAMILIES)
def test_the_window_is_what_the_equality_tests(family, vocab):
    """The same weights without a window give another loss at these lengths: the equalities above hold because
    the window is applied, not because it never mattered."""
    ids, positions = packed(ROWS, vocab)
    with torch.no_grad():
        windowed = tunelab_packed(build(family, vocab, attention.register("slots")), ids, positions, ROWS, "slots")
        full = tunelab_packed(build(family, vocab, attention.register("slots"), None), ids, positions, ROWS, "slots")
    assert families.sliding_windows(family_config(family, vocab)) == {WINDOW}
    assert abs(windowed.item() - full.item()) > 1e-4 * abs(full.item())  # 10x the tolerance of the equalities


@pytest.mark.slow
def test_gemma2_flex_kernel_applies_window_and_softcap(vocab):
    """Without grad the flex path runs the compiled kernel with its score_mod and windowed BlockMask: per-token
    logits of packed rows equal transformers' for each document alone."""
    ours, reference = pair("gemma2", vocab, "flex")
    ids, positions = packed(ROWS, vocab)
    with torch.no_grad():
        extra = attention.flex_tensors(positions, families.sliding_windows(ours.config))
        logits = ours.eval()(input_ids=ids, position_ids=positions, **extra).logits
        for r, s, n in documents(ROWS):
            alone = reference.eval()(input_ids=ids[r : r + 1, s : s + n]).logits[0]
            assert torch.allclose(logits[r, s : s + n], alone, atol=1e-4, rtol=1e-5)


def moe_config(kind: str, vocab: int):
    import transformers as tf

    if kind == "mixtral":
        return tf.MixtralConfig(**TINY, vocab_size=vocab, num_local_experts=4, num_experts_per_tok=2)
    if kind == "gpt_oss":
        return tf.GptOssConfig(**TINY, vocab_size=vocab, num_local_experts=4, num_experts_per_tok=2)
    return tf.Qwen2MoeConfig(**TINY, vocab_size=vocab, num_experts=6, num_experts_per_tok=2, moe_intermediate_size=32)


@pytest.mark.parametrize("kind, key", [("gpt_oss", "num_local_experts=4")])
def test_moe_train_refuses_a_family_it_does_not_train_yet_and_plan_counts_it(
    kind, key, vocab, tmp_path, addition_rows, capsys, monkeypatch
):
    """An MoE config (config.json only) whose family's row does not train (its `trains` capability off, as each
    family's was until its training path honoured all of it) is refused by train in one line naming its expert
    count, before anything loads or is written; plan answers with its active parameters."""
    import dataclasses

    row = dataclasses.replace(families.MOE_FAMILIES[kind], trains=False)
    monkeypatch.setitem(families.MOE_FAMILIES, kind, row)
    model = tmp_path / kind
    moe_config(kind, vocab).save_pretrained(model)
    out = tmp_path / "run"
    data = write_jsonl(tmp_path / "add.jsonl", addition_rows)
    config = tmp_path / "c.yaml"
    config.write_text("method: lora\ndata:\n  template: compact\nprecision: fp32\ndevice: cpu\n")
    argv = ["train", "--config", str(config), f"model={model}", f"data.path={data}", f"output_dir={out}", "--quiet"]
    assert not families.MOE_FAMILIES[kind].trains  # the family this test names must be one train refuses
    assert main(argv) == 2
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert len(err.splitlines()) == 1 and not captured.out
    assert "tunelab train: error:" in err and key in err and "does not train it yet" in err
    assert not out.exists()
    assert main(["plan", "--model", str(model), "--examples", "1000", "--seq-len", "128"]) == 0
    assert "active per token" in capsys.readouterr().out


REFUSED = [  # (config, attention setting, what the one line must name)
    ("PhiConfig", {}, None, "has a bias on its LM head"),
    ("CohereConfig", {"logit_scale": 0.0625}, None, "logit_scale=0.0625"),
    ("GraniteConfig", {"logits_scaling": 8.0}, None, "logits_scaling=8.0"),
    ("Gemma3TextConfig", {"use_bidirectional_attention": True}, None, "use_bidirectional_attention"),
    ("Gemma2Config", {}, "sdpa", "attention=sdpa has no attention logit soft-capping"),
]


@pytest.mark.parametrize("name, fields, attn, message", REFUSED)
def test_unsupported_features_are_one_line_refusals(name, fields, attn, message, vocab):
    import transformers as tf

    config = getattr(tf, name)(**TINY, vocab_size=vocab, **fields)
    with pytest.raises(TunelabError, match=message) as e:
        families.check(config, "m", attn)
    assert "\n" not in str(e.value) and "model m:" in str(e.value)
    if attn is not None:
        families.check(config, "m", "auto")  # refused for that attention setting only


def test_vision_language_gemma3_is_refused(vocab):
    from transformers import Gemma3Config

    with pytest.raises(TunelabError, match="vision-language model .*text-only Gemma3ForCausalLM"):
        families.check(Gemma3Config(), "google/gemma-3-4b-it")


@pytest.mark.parametrize("family", FAMILIES)
def test_supported_families_pass_the_check(family, vocab):
    families.check(family_config(family, vocab), "m", "auto")


@pytest.mark.parametrize("family", FAMILIES)
def test_plan_reads_every_supported_family(family, vocab, tmp_path, capsys):
    """A supported family's config.json (no weights) is planned like any Llama-shaped decoder."""
    family_config(family, vocab).save_pretrained(tmp_path)
    argv = ["plan", "--model", str(tmp_path), "--seq-len", "128", "--examples", "1000", "--mean-tokens", "100"]
    assert main([*argv, "--json"]) == 0
    shape = archmod.from_hf_config("m", family_config(family, vocab), "test")
    assert json.loads(capsys.readouterr().out)["memory_breakdown"]["weights"] == 2 * shape.total_params


@pytest.mark.slow
@pytest.mark.parametrize("family", ["gemma2", "phi3"])  # soft-caps and windows; fused projections
def test_trains_end_to_end_with_lora(family, vocab, tmp_path, addition_rows):
    """`tunelab train` on a saved tiny model of the family: loaded with tunelab's attention, LoRA on every
    linear layer of its blocks (Phi-3's fused qkv_proj and gate_up_proj included), two steps, an adapter saved."""
    from conftest import tiny_train_config

    from tunelab.recipes.finetune import finetune

    model_dir = tmp_path / family
    build(family, vocab, "eager").save_pretrained(model_dir)
    make_tokenizer().save_pretrained(model_dir)
    data = write_jsonl(tmp_path / "add.jsonl", addition_rows)
    cfg = tiny_train_config(model_dir, data, tmp_path / "run", "max_steps=2", "method=lora", "device=cpu")
    summary = finetune(cfg, show_progress=False)
    assert (tmp_path / "run" / "adapter" / "adapter_model.safetensors").is_file()
    config = json.loads((tmp_path / "run" / "adapter" / "adapter_config.json").read_text())
    expected = (
        {"qkv_proj", "o_proj", "gate_up_proj", "down_proj"}
        if family == "phi3"
        else {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    )
    assert set(config["target_modules"]) == expected
    assert summary["loss_last"] < summary["loss_first"]


def test_loads_outside_training_pick_an_attention_the_family_supports(vocab, tmp_path):
    """Evaluation, generation and export load with transformers' own choice, not a forced SDPA: Gemma-2 gets
    whatever the installed transformers picks for its soft-capping (eager in 5.24, SDPA in 5.17) instead of a
    load error; a family with SDPA keeps it."""
    from transformers import AutoModelForCausalLM

    from tunelab.model import load

    for family, expected in (("gemma2", None), ("qwen3", "sdpa")):
        build(family, vocab, "eager").save_pretrained(tmp_path / family)
        model = load.load_model(
            sources.ModelSource(family, tmp_path / family), torch.float32, "none", torch.device("cpu")
        )
        if expected is None:  # the installed transformers' own choice
            expected = AutoModelForCausalLM.from_pretrained(tmp_path / family).config._attn_implementation
        assert model.config._attn_implementation == expected
