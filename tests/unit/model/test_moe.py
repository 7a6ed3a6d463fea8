"""Mixture-of-Experts families, built tiny and random in code (model/moe.py): tunelab's loss (its attention path,
its grouped experts, its fused head, the router's load-balancing loss weighted by the config's coefficient)
equals transformers' own loss, packed or not; LoRA on the stacked experts fused into the grouped products equals
PEFT's own forward and its merged model; bad targets and router keys are one line.

Comparisons are fp32: the paths differ from transformers' eager experts and attention only in summation order.
"""

from __future__ import annotations

import pytest
import torch
from conftest import TINY_SHAPE, make_tokenizer, packed_ids

from tunelab.data.packing import layout_from_lengths
from tunelab.errors import TunelabError
from tunelab.model import attention, moe
from tunelab.train.loss import CausalLMLoss

WIDTH = 48
ROWS = [[20, 17], [30]]  # documents packed per row; the second row has an 18-token padded tail
TINY = dict(TINY_SHAPE, initializer_range=0.2, hidden_size=32, intermediate_size=64, num_attention_heads=4)


def moe_config(family: str, vocab: int, aux: bool = True, **shape):
    """A tiny config of `family`: 6 experts, top-2, the router's loss in the training loss (`aux`) with a
    coefficient large enough that dropping it moves the loss past the tolerance; `shape` overrides TINY's keys."""
    import transformers as tf

    head_dim = shape.pop("head_dim", 8)  # the families that take one
    common = dict(
        **{**TINY, **shape}, vocab_size=vocab, num_experts_per_tok=2, output_router_logits=aux, router_aux_loss_coef=0.5
    )
    if family == "qwen3_moe":
        # the second layer dense (mlp_only_layers), as Qwen3-MoE configs may keep some
        return tf.Qwen3MoeConfig(
            **common, num_experts=6, moe_intermediate_size=24, head_dim=head_dim, mlp_only_layers=[1]
        )
    if family == "qwen2_moe":
        return tf.Qwen2MoeConfig(**common, num_experts=6, moe_intermediate_size=24, shared_expert_intermediate_size=40)
    if family == "mixtral":
        return tf.MixtralConfig(**common, num_local_experts=6)
    if family == "olmoe":
        return tf.OlmoeConfig(**common, num_experts=6)
    if family == "gpt_oss":
        return tf.GptOssConfig(
            **common,
            num_local_experts=6,
            head_dim=head_dim,
            sliding_window=8,
            layer_types=["sliding_attention", "full_attention"],
        )
    raise AssertionError(family)


FAMILIES = ["qwen3_moe", "qwen2_moe", "mixtral", "olmoe", "gpt_oss"]


@pytest.fixture(scope="module")
def vocab():
    return len(make_tokenizer())


def build(family, vocab, implementation, aux=True, seed=0, **shape):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(
        moe_config(family, vocab, aux, **shape), attn_implementation=implementation
    )
    return model.float()


def pair(family, vocab, aux=True):
    """tunelab's model (slot attention, grouped experts) and transformers' eager one, with the same weights."""
    ours = build(family, vocab, attention.register("slots"), aux)
    moe.use_grouped(ours)
    reference = build(family, vocab, "eager", aux)
    reference.set_experts_implementation("eager")
    reference.load_state_dict(ours.state_dict())
    return ours.train(), reference.train()


def test_grouped_experts_equal_transformers_eager_forward_and_gradients(vocab):
    """The grouped experts (sorted tokens, grouped products) give transformers' per-expert loop's output and input
    gradient on the same routing."""
    ours, reference = pair("qwen3_moe", vocab)
    block = ours.model.layers[0].mlp.experts
    torch.manual_seed(1)
    x = torch.randn(40, TINY["hidden_size"], requires_grad=True)
    index = torch.randint(0, 6, (40, 2))
    weights = torch.rand(40, 2)
    out = moe.grouped_experts_forward(block, x, index, weights)
    x2 = x.detach().clone().requires_grad_(True)
    expected = reference.model.layers[0].mlp.experts(x2, index, weights)
    assert torch.allclose(out, expected, atol=1e-5)
    out.square().sum().backward()
    expected.square().sum().backward()
    assert torch.allclose(x.grad, x2.grad, atol=1e-5)


@pytest.mark.parametrize("family", FAMILIES)
def test_unpacked_loss_equals_transformers_with_router_loss(family, vocab):
    """Rows without a layout: tunelab's summed loss is transformers' `(CE mean + coef x aux) x targets`, the router's
    load-balancing loss included because the config's output_router_logits asks for it; without it, the CE alone."""
    for aux in (True, False):
        ours, reference = pair(family, vocab, aux)
        generator = torch.Generator().manual_seed(1)
        ids = torch.randint(3, vocab, (2, 24), generator=generator)
        index = torch.cat([torch.arange(r * 24, r * 24 + 23) for r in range(2)])
        loss_fn = CausalLMLoss(ours)
        loss = loss_fn(ids, None, index, ids[:, 1:].reshape(-1))
        expected = reference(input_ids=ids, labels=ids)
        assert loss.item() == pytest.approx(expected.loss.item() * index.numel(), rel=1e-5)
        router = reference(input_ids=ids, output_router_logits=True).aux_loss.item()  # reported either way
        assert loss_fn.window_metrics()["router_aux_loss"] == pytest.approx(router, rel=1e-5)
    assert router * 0.5 * index.numel() > 1e-3 * loss.item()  # the term is not negligible against the tolerance


def packed(rows, vocab):
    return packed_ids(rows, vocab, WIDTH, seed=2)


def documents(rows):
    return [(r, sum(row[:i]), n) for r, row in enumerate(rows) for i, n in enumerate(row)]


@pytest.mark.parametrize("family", FAMILIES)
def test_packed_rows_equal_documents_one_by_one(family, vocab):
    """Packed rows (slot attention, padded tail) give the documents' summed cross-entropy run alone through
    transformers plus coef x its own load-balancing loss over the documents' tokens (the tail excluded) x targets;
    the gradients of an expert stack agree too."""
    import importlib

    ours, reference = pair(family, vocab)
    load_balancing_loss_func = importlib.import_module(type(reference).__module__).load_balancing_loss_func
    ids, positions = packed(ROWS, vocab)
    docs = documents(ROWS)
    index = torch.cat([torch.arange(r * WIDTH + s, r * WIDTH + s + n - 1) for r, s, n in docs])
    targets = torch.cat([ids[r, s + 1 : s + n] for r, s, n in docs])
    loss = CausalLMLoss(ours)(ids, positions, index, targets, layout_from_lengths(ROWS, WIDTH))
    ce, logits = 0.0, []
    for r, s, n in docs:
        out = reference(
            input_ids=ids[r : r + 1, s : s + n], labels=ids[r : r + 1, s : s + n], output_router_logits=False
        )
        ce = ce + out.loss * (n - 1)
        logits.append(reference.model(input_ids=ids[r : r + 1, s : s + n], output_router_logits=True).router_logits)
    per_layer = tuple(torch.cat([doc[layer] for doc in logits]) for layer in range(len(logits[0])))
    aux = load_balancing_loss_func(per_layer, 6, 2, None)
    expected = ce + 0.5 * aux * index.numel()
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
    loss.backward()
    expected.backward()
    grad = ours.model.layers[0].mlp.experts.down_proj.grad
    assert torch.allclose(grad, reference.model.layers[0].mlp.experts.down_proj.grad, rtol=1e-4, atol=1e-5)


def lora_adapter(targets="all-linear", router=False, method="lora"):
    from tunelab.config import load_config

    cfg = load_config(None, [f"method={method}", "lora.r=4", f"lora.router={str(router).lower()}"])
    if targets != "all-linear":
        cfg.adapter.lora.targets = targets
    return cfg.adapter


@pytest.mark.parametrize("family", FAMILIES)
def test_lora_on_experts_fused_equals_peft_forward_and_merged_model(family, vocab, tmp_path):
    """LoRA on attention and on every expert's projections (PEFT's target_parameters): the grouped forward with the
    factors fused gives PEFT's own (parametrized) forward; the adapter saves and loads in PEFT, and the merged
    model in plain transformers gives the same logits."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from tunelab.model.adapters import apply_adapter

    ours, reference = pair(family, vocab)
    model = apply_adapter(ours, lora_adapter())
    for name, p in model.named_parameters():  # B nonzero, so the adapter changes the output
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.1)
    params = model.peft_config["default"].target_parameters
    assert {p.split(".")[-1] for p in params} == {"down_proj", "gate_up_proj"}
    routers = [p for n, p in model.named_parameters() if n.endswith(("mlp.gate.weight", "mlp.router.weight"))]
    assert routers and not any(p.requires_grad for p in routers)  # the router is frozen by default
    ids = torch.randint(3, vocab, (2, 16), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        fused = model(input_ids=ids).logits
        with model.disable_adapter():
            without = model(input_ids=ids).logits
    assert (fused - without).abs().max() > 1e-2  # the adapter (experts' factors included) moves the logits
    model.save_pretrained(tmp_path / "adapter")
    base = build(family, vocab, "eager")
    base.set_experts_implementation("eager")
    loaded = PeftModel.from_pretrained(base, tmp_path / "adapter")  # PEFT's own forward over transformers' experts
    with torch.no_grad():
        peft_logits = loaded(input_ids=ids).logits
        merged = loaded.merge_and_unload()
        merged.save_pretrained(tmp_path / "merged")
        plain = AutoModelForCausalLM.from_pretrained(tmp_path / "merged").float()
        merged_logits = plain(input_ids=ids).logits
    assert torch.allclose(fused, peft_logits, atol=1e-4)
    assert torch.allclose(fused, merged_logits, atol=1e-4)


def test_router_trains_by_key_and_saves_with_the_adapter(vocab):
    from tunelab.model.adapters import apply_adapter

    ours, _ = pair("qwen3_moe", vocab)
    model = apply_adapter(ours, lora_adapter(router=True))
    trained = [n for n, p in model.named_parameters() if p.requires_grad and ".mlp.gate." in n]  # the router only
    assert trained and all("modules_to_save" in n for n in trained)
    # all-linear adapts a dense layer's MLP beside the experts (PEFT 0.21 left it out once target_parameters was set)
    assert any(".mlp.gate_proj.lora_A" in n for n, _ in model.named_parameters())


def test_bad_moe_input_is_one_line(vocab):
    """lora.targets naming no attention or expert module of an MoE model, lora.router on a dense model, and a top-k
    above the expert count: each one line, before anything trains."""
    import transformers as tf

    from tunelab import families
    from tunelab.model.adapters import apply_adapter

    ours, _ = pair("qwen3_moe", vocab)
    with pytest.raises(TunelabError, match="names no attention or expert module") as e:
        apply_adapter(ours, lora_adapter(targets=["gate_proj", "up_proj"]))  # the dense layer's MLP only
    assert "\n" not in str(e.value)
    dense = tf.AutoModelForCausalLM.from_config(tf.Qwen3Config(**TINY, vocab_size=vocab, head_dim=8))
    with pytest.raises(TunelabError, match="lora.router: qwen3 has no router") as e:
        apply_adapter(dense, lora_adapter(router=True))
    with pytest.raises(TunelabError, match="stacked experts are not quantized") as e:
        apply_adapter(ours, lora_adapter(method="qlora"))  # a base whose experts stayed 16-bit (int8, say)
    assert "\n" not in str(e.value)
    config = moe_config("qwen3_moe", vocab)
    config.num_experts_per_tok = 7
    with pytest.raises(TunelabError, match="num_experts_per_tok=7") as e:
        families.check(config, "m")
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(  # Qwen3-MoE and gpt-oss (sinks, biases): the equalities above cover the others
    "family, method", [("qwen3_moe", "lora"), ("qwen3_moe", "qlora"), ("gpt_oss", "lora"), ("gpt_oss", "qlora")]
)
def test_trains_end_to_end_with_lora_on_experts(family, method, vocab, tmp_path, addition_rows):
    """`tunelab train` on a saved tiny MoE model: LoRA on attention and the experts through the grouped path
    (QLoRA: over 4-bit linears and 4-bit experts), the loss falls, the router's loss is its own column of
    metrics.jsonl, and the adapter names the expert stacks and loads in PEFT with the trained factors."""
    import json

    from conftest import tiny_train_config, write_jsonl
    from peft import PeftModel
    from safetensors.torch import load_file

    from tunelab.recipes.finetune import finetune

    model_dir = tmp_path / family
    # QLoRA: 4-bit rows of 64 inputs, which bitsandbytes 0.50.2 dequantizes right on the CPU (load.check_cpu_nf4)
    shape = {"hidden_size": 64, "head_dim": 16} if method == "qlora" else {}
    build(family, vocab, "eager", **shape).save_pretrained(model_dir)
    make_tokenizer().save_pretrained(model_dir)
    data = write_jsonl(tmp_path / "add.jsonl", addition_rows)
    cfg = tiny_train_config(model_dir, data, tmp_path / "run", "max_steps=4", f"method={method}", "device=cpu")
    summary = finetune(cfg, show_progress=False)
    assert summary["loss_last"] < summary["loss_first"]
    # QLoRA: 4 attention linears a layer, Qwen3-MoE's dense MLP's 3 (layer 1) and 2 expert stacks a sparse layer
    # (Qwen3-MoE's layer 0, both of gpt-oss's), all in 4 bits
    nf4 = {"qwen3_moe": 4 * 2 + 3 + 2, "gpt_oss": 4 * 2 + 2 * 2}[family]
    assert summary["nf4_layers"] == (nf4 if method == "qlora" else 0)
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    aux = [r["router_aux_loss"] for r in records if "router_aux_loss" in r]
    assert len(aux) == 4 and all(a > 0 for a in aux)
    adapter = tmp_path / "run" / "adapter"
    config = json.loads((adapter / "adapter_config.json").read_text())
    assert {p.split(".")[-1] for p in config["target_parameters"]} >= {"gate_up_proj", "down_proj"}
    loaded = PeftModel.from_pretrained(build(family, vocab, "eager", **shape), adapter)
    saved = load_file(adapter / "adapter_model.safetensors")
    key = next(k for k in saved if "experts" in k and "lora_B" in k)
    assert saved[key].abs().max() > 0  # the experts' factors trained (B starts at zero)
    ours = dict(loaded.named_parameters())[key.replace(".weight", ".default.weight")]
    assert torch.equal(ours.detach().to(saved[key].dtype), saved[key])


def test_qlora_experts_are_nf4_and_equal_a_dequantized_reference(vocab):
    """4-bit experts (moe.quantize_experts): each expert's slice within NF4's rounding of its 16-bit weights (half
    the widest gap between NF4 levels, -1 to -0.696, so 0.152 times its block's absmax), the 16-bit stack freed, the model's logits
    and gradients those of transformers' eager model holding the dequantized weights, and the bytes and weight
    count that plan's memory model charges (nf4_bytes a weight, the catalog arch's expert projections)."""
    from tunelab.plan import memory
    from tunelab.plan.arch import from_hf_config

    ours, reference = pair("qwen3_moe", vocab)
    experts = ours.model.layers[0].mlp.experts
    original = {name: getattr(experts, name).detach().clone() for name in ("gate_up_proj", "down_proj")}
    assert moe.quantize_experts(ours) == 2
    stacks = moe.quantized_stacks(ours)
    values = 0
    for name, w in original.items():
        stack = experts.tunelab_nf4[name]
        placeholder = getattr(experts, name)
        assert placeholder.shape == w.shape and placeholder.untyped_storage().nbytes() == 4  # no 16-bit copy kept
        dequantized = torch.stack([stack.expert(e) for e in range(stack.num)])
        blocks = w.reshape(-1, moe.NF4_BLOCK)
        error = (dequantized.reshape(-1, moe.NF4_BLOCK) - blocks).abs()
        assert (error <= 0.152 * blocks.abs().amax(1, keepdim=True) * 1.01).all() and error.max() > 0
        getattr(reference.model.layers[0].mlp.experts, name).data.copy_(dequantized)
        values += w.numel()
    ids = torch.randint(3, vocab, (2, 16), generator=torch.Generator().manual_seed(4))
    out, expected = ours(input_ids=ids, labels=ids), reference(input_ids=ids, labels=ids)
    assert torch.allclose(out.logits, expected.logits, atol=1e-4)
    out.loss.backward()
    expected.loss.backward()
    grad = ours.model.layers[0].self_attn.q_proj.weight.grad
    assert torch.allclose(grad, reference.model.layers[0].self_attn.q_proj.weight.grad, rtol=1e-4, atol=1e-6)
    arch = from_hf_config("m", ours.config, "config.json")
    assert sum(m.params for m in arch.modules() if m.group == "expert") == values
    per_weight = sum(s.nbytes() for s in stacks) / values
    assert per_weight == pytest.approx(memory.nf4_bytes(), rel=0.015)
    # Quantized in host memory, then moved to the device (load_model away from the CPU): the 4-bit values and
    # scales move, and the stand-ins stay broadcast (moving one as it is would allocate the stack's full size).
    moe.move_quantized(ours, torch.device("meta"))
    assert all(p.device.type == "meta" for p in ours.parameters())
    assert experts.gate_up_proj.stride() == (0, 0, 0) and experts.down_proj.stride() == (0, 0, 0)
    assert all(x.device.type == "meta" for s in stacks for packed, state in s.experts for x in (packed, state.absmax))


@pytest.mark.parametrize("tile", [4, 64])
def test_segmented_lora_product_and_gradients_equal_per_row_reference(tile, monkeypatch):
    """The CPU path's projection (model/moe.py Segments, its written-out backward) over rows in tiles: x·Wₑ +
    s·(x·Aₑ)·Bₑ per row, the low-rank part added in place, and the gradients of x, the stack (full fine-tuning) and
    the factors equal autograd over per-row products, with tiles of 4 rows (several per expert, the last padded) and
    of 64 (one per expert); the padding rows stay zero in the output and in x's gradient."""
    monkeypatch.setattr(moe, "TILE_MIN", tile)
    monkeypatch.setattr(moe, "TILE_MAX", tile)
    torch.manual_seed(0)
    e, rows, din, dout, r = 5, 23, 12, 10, 3
    expert_ids = torch.sort(torch.randint(0, e - 1, (rows,))).values  # the last expert gets no rows
    seg = moe.Segments(expert_ids, torch.bincount(expert_ids, minlength=e), e)
    assert seg.tile == tile and (seg.tiles > e - 1) == (tile == 4) and seg.rows == seg.tiles * tile
    x, w, a, b = (torch.randn(shape) for shape in ((rows, din), (e, din, dout), (e, din, r), (e, r, dout)))
    tiled = torch.zeros(seg.rows, din).index_copy_(0, seg.pos, x)  # as _Dispatch lays the rows out
    leaves = [t.requires_grad_(True) for t in (tiled, w.clone(), a.clone(), b.clone())]
    out = moe._SegmentedLinear.apply(*leaves, 0.5, seg)
    x, w, a, b = (t.requires_grad_(True) for t in (x, w, a, b))
    expected = torch.einsum("si,sio->so", x, w[expert_ids]) + 0.5 * torch.einsum(
        "sr,sro->so", torch.einsum("si,sir->sr", x, a[expert_ids]), b[expert_ids]
    )
    assert torch.allclose(out[seg.pos], expected, atol=1e-5)
    assert not out[seg.padding].any()
    grad = torch.randn(rows, dout)
    out.backward(torch.zeros(seg.rows, dout).index_copy_(0, seg.pos, grad))  # zero on the padding, as _Combine's
    expected.backward(grad)
    assert torch.allclose(leaves[0].grad[seg.pos], x.grad, atol=1e-5) and not leaves[0].grad[seg.padding].any()
    for ours, theirs in zip(leaves[1:], (w, a, b)):
        assert torch.allclose(ours.grad, theirs.grad, atol=1e-5)


def test_segment_products_rounded_up_into_the_next_experts_rows_stay_exact(monkeypatch):
    """Segments.mm runs each expert's product over its rows rounded up to a few sizes (moe.rounded): within its
    tiles' padding, or past it into the next expert's rows, which that expert's own product then overwrites, and
    for the last expert no further than the rows end. Every row still equals its own expert's product, and the
    padding rows are zero."""
    monkeypatch.setattr(moe, "TILE_MAX", 16)
    counts = torch.tensor([520, 0, 70, 33, 515])  # rounded: 544 (past its 528 tiled rows), 72, 34, 544 (cut at the end)
    assert [moe.rounded(int(n)) for n in counts if n] == [544, 72, 34, 544]
    expert_ids = torch.repeat_interleave(torch.arange(5), counts)
    seg = moe.Segments(expert_ids, counts, 5)
    assert seg.tile == 16 and seg.starts[2] == 528 and seg.rows == 528 + 80 + 48 + 528
    torch.manual_seed(0)
    x, w = torch.randn(int(counts.sum()), 6), torch.randn(5, 6, 7)
    out = seg.mm(torch.zeros(seg.rows, 6).index_copy_(0, seg.pos, x), w)
    assert torch.allclose(out[seg.pos], torch.einsum("si,sio->so", x, w[expert_ids]), atol=1e-5)
    assert not out[seg.padding].any()


def preference_batch(vocab):
    """Two pairs (prompt, chosen, rejected) packed as the pipeline packs them, and their sequences alone."""
    import numpy as np

    from tunelab.data.examples import IGNORE, DatasetStats, TokenizedData
    from tunelab.data.packing import collate

    g = torch.Generator().manual_seed(5)
    rand = lambda n: torch.randint(3, vocab, (n,), generator=g).tolist()  # noqa: E731
    pairs = [(rand(5), rand(4), rand(6)), (rand(3), rand(7), rand(2))]
    ids, targets = [], []
    for prompt, *sides in pairs:
        for response in sides:
            ids.append(prompt + response)
            targets.append([IGNORE] * (len(prompt) - 1) + response + [IGNORE])
    lengths = np.array([len(s) for s in ids])
    stats = DatasetStats(len(pairs), len(ids), 0, 0, int(lengths.sum()), 0, int(lengths.max()), 0.0)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    data = TokenizedData(
        np.concatenate(ids).astype(np.int32),
        np.concatenate(targets).astype(np.int32),
        offsets,
        stats,
        np.repeat(np.arange(len(pairs)), 2),
        np.zeros(len(ids), bool),
    )
    return collate(data, [[0, 1, 2, 3]], WIDTH, 0, True, sequences=True), ids


@pytest.mark.parametrize("objective", ["dpo", "orpo", "grpo"])
def test_router_loss_in_preference_and_grpo_objectives(objective, vocab):
    """DPO, ORPO and GRPO on a tiny Qwen3-MoE: the step loss holds router_aux_loss_coef x transformers' own
    load-balancing loss over the policy's real tokens (each sequence run alone through transformers, padding and a
    packed row's tail left out), as many times as the objective's mean counts (pairs; 1 / micro-batches), and
    metrics report that loss apart as `router_aux_loss`."""
    import importlib

    from tunelab.config import GrpoConfig, ObjectiveConfig
    from tunelab.train.grpo import GrpoLoss, Rollout
    from tunelab.train.pair_loss import PreferenceLoss

    ours, reference = pair("qwen3_moe", vocab)
    load_balancing_loss_func = importlib.import_module(type(reference).__module__).load_balancing_loss_func
    if objective == "grpo":
        g = torch.Generator().manual_seed(6)
        prompts = [torch.randint(3, vocab, (n,), generator=g).tolist() for n in (4, 6, 5)]
        completions = [torch.randint(3, vocab, (n,), generator=g).tolist() for n in (3, 8, 1)]
        rollout = Rollout.build(prompts, completions, pad_id=0)
        sequences = [p + c for p, c in zip(prompts, completions)]
        root = GrpoLoss(ours, GrpoConfig(num_generations=3, beta=0.0))
        adv = torch.linspace(-1, 1, rollout.loss_index.numel())
        run = lambda: root(rollout, None, None, adv, micro_batches=2, step_tokens=12).loss  # noqa: E731
        units = 1 / 2
    else:
        batch, sequences = preference_batch(vocab)
        root = PreferenceLoss(ours, ObjectiveConfig(name=objective))
        tensors = [
            torch.from_numpy(getattr(batch, k)) for k in ("input_ids", "position_ids", "loss_index", "loss_targets")
        ]
        run = lambda: root(*tensors, batch.layout, seqs=batch.seqs)  # noqa: E731
        units = 2  # pairs
    with torch.no_grad():
        logits = [
            reference.model(input_ids=torch.tensor([s]), output_router_logits=True).router_logits for s in sequences
        ]
    per_layer = tuple(torch.cat([seq[layer] for seq in logits]) for layer in range(len(logits[0])))
    aux = load_balancing_loss_func(per_layer, 6, 2, None)
    trained = run()  # with gradients, as a step runs: the metrics count it
    root.router.trains = False
    with torch.no_grad():
        without = run()  # the same step without the term
    assert (trained - without).item() == pytest.approx(0.5 * aux.item() * units, rel=1e-4)
    assert root.window_metrics()["router_aux_loss"] == pytest.approx(aux.item(), rel=1e-5)

    class Accelerator:  # another process ran a forward; this one reduces with it though it ran none since
        device, calls = torch.device("cpu"), []

        def reduce(self, tensor, op):
            self.calls.append(op)
            return tensor + torch.tensor([3.0, 1.0], dtype=tensor.dtype)

    assert root.window_metrics(Accelerator())["router_aux_loss"] == 3.0 and Accelerator.calls == ["sum"]


def test_gpt_oss_attention_sinks_on_every_path(vocab):
    """gpt-oss's per-head sinks (one more logit in each query's softmax, attending to nothing; the loss equalities
    above check the training path): GRPO's whole-row path gives transformers' eager logits and gradients too;
    sampling over padded prompts runs on eager, since SDPA would drop the sinks; flex's renormalisation by the
    log-sum-exp (`with_sinks`) is the explicit softmax with the sinks' column; `attention=sdpa` is refused in one
    line, and `auto` takes flex over flash-attn on CUDA (flash-attn 2 has no sinks)."""
    from tunelab import families
    from tunelab.runtime import attention_path

    rows = build("gpt_oss", vocab, attention.register_rows())
    reference = build("gpt_oss", vocab, "eager")
    ids = torch.randint(3, vocab, (2, 20), generator=torch.Generator().manual_seed(4))
    outs = []
    for model in (rows, reference):
        logits = model(input_ids=ids).logits
        logits.square().mean().backward()
        outs.append([logits.detach(), model.model.layers[0].self_attn.sinks.grad])
    for a, b in zip(*outs):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
    with attention.with_padding_masks(rows):
        assert rows.config._attn_implementation == "eager"

    torch.manual_seed(5)
    q, k, v = (torch.randn(2, 4, 9, 8) for _ in range(3))
    sinks = torch.randn(4)
    causal = attention._causal(9, None, q.device)
    scores = (q @ k.transpose(-1, -2) * 8**-0.5).masked_fill(~causal, float("-inf"))
    plain = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    renormalised = attention.with_sinks(plain, scores.logsumexp(-1), sinks)
    explicit = attention._masked_attention(q, k, v, causal, None, None, sinks=sinks)
    torch.testing.assert_close(renormalised, explicit, atol=1e-5, rtol=1e-4)
    assert not torch.allclose(plain, explicit, atol=1e-3)  # the sinks move the output

    with pytest.raises(TunelabError, match="attention=sdpa drops gpt_oss's attention sinks") as e:
        families.check(moe_config("gpt_oss", vocab), "m", "sdpa")
    assert "\n" not in str(e.value)
    assert attention_path("auto", "cuda", flash_attn=True, sinks=True) == "flex"
    assert attention_path("auto", "cuda", flash_attn=True) == "flash"


def test_gpt_oss_mxfp4_checkpoints_load_dequantized(vocab, tmp_path, monkeypatch):
    """A checkpoint that publishes MXFP4 experts (gpt-oss's config.json quantization_config) is loaded with
    transformers' dequantize switch, so that the experts are 16-bit stacks the grouped path and LoRA take, also on
    a GPU where transformers would otherwise keep them packed and frozen."""
    import json

    import transformers as tf

    from tunelab import sources
    from tunelab.model import load

    directory = tmp_path / "gpt-oss"
    build("gpt_oss", vocab, "eager").save_pretrained(directory)
    path = directory / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "quantization_config": {"quant_method": "mxfp4"}}))
    seen = {}

    def from_pretrained(_path, **kwargs):
        seen.update(kwargs)
        raise RuntimeError("stop here")

    monkeypatch.setattr(tf.AutoModelForCausalLM, "from_pretrained", from_pretrained)
    with pytest.raises(TunelabError, match="stop here"):
        load.load_model(sources.resolve(str(directory)), torch.float32, "none", torch.device("cpu"))
    assert isinstance(seen["quantization_config"], tf.Mxfp4Config) and seen["quantization_config"].dequantize
    assert not load.published_mxfp4(moe_config("gpt_oss", vocab))


@pytest.mark.parametrize("family", ["qwen3_moe", "gpt_oss"])
def test_sampling_an_moe_model_that_asks_for_its_router_loss(family, vocab):
    """GRPO's and eval's sampler over a model whose config sets output_router_logits (which training reads): every
    decode step runs without the router's loss (transformers' over a cached step fails on its mask), and greedy
    completions equal transformers' own greedy generate, in the dynamic and the static-cache modes; gpt-oss samples
    on eager attention, its sinks applied."""
    from tunelab.eval.sampling import sample

    ours, reference = pair(family, vocab)  # output_router_logits=True in both configs
    prompts = [[5, 17, 30, 40], [7, 8, 9], [5, 17, 30, 40]]
    expected = []
    with torch.no_grad():
        for p in prompts:
            ids = reference.eval().generate(
                torch.tensor([p]), max_new_tokens=5, do_sample=False, output_router_logits=False, pad_token_id=0
            )
            expected.append(ids[0, len(p) :].tolist())
    for decode in ("dynamic", "static"):
        with attention.with_padding_masks(ours):  # as GRPO samples: SDPA (eager for gpt-oss) over padded prompts
            out = sample(ours, prompts, 5, stop_ids=[vocab + 1], pad_id=0, temperature=0, decode=decode)
        assert out.ids == expected, decode
    assert ours.config.output_router_logits is True  # as it was, for the training step after


@pytest.mark.gpu
def test_gpt_oss_packed_rows_on_flex_equal_documents_on_eager(vocab, device="cuda"):
    """gpt-oss on CUDA's path (`attention: auto` takes flex for its sinks): packed rows through the flex kernel,
    renormalised by its log-sum-exp (attention.with_sinks), give each document's loss alone through transformers'
    eager attention, and the same gradients for the sinks and a query projection: the sinks' gradient flows
    through the kernel's log-sum-exp."""
    ours = build("gpt_oss", vocab, attention.register("flex"), aux=False).to(device)
    moe.use_grouped(ours)
    reference = build("gpt_oss", vocab, "eager", aux=False).to(device)
    reference.set_experts_implementation("eager")
    reference.load_state_dict(ours.state_dict())
    ids, positions = (t.to(device) for t in packed(ROWS, vocab))
    docs = documents(ROWS)
    index = torch.cat([torch.arange(r * WIDTH + s, r * WIDTH + s + n - 1) for r, s, n in docs]).to(device)
    targets = torch.cat([ids[r, s + 1 : s + n] for r, s, n in docs])
    loss = CausalLMLoss(ours.train())(ids, positions, index, targets)
    loss.backward()
    expected = sum(
        reference.train()(input_ids=ids[r : r + 1, s : s + n], labels=ids[r : r + 1, s : s + n]).loss * (n - 1)
        for r, s, n in docs
    )
    expected.backward()
    assert loss.item() == pytest.approx(expected.item(), rel=1e-4)
    for name in ("self_attn.sinks", "self_attn.q_proj.weight"):
        ours_grad = ours.get_submodule("model.layers.0").get_parameter(name).grad
        theirs = reference.get_submodule("model.layers.0").get_parameter(name).grad
        torch.testing.assert_close(ours_grad, theirs, rtol=1e-3, atol=1e-5)
