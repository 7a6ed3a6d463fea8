"""FlexAttention over packed rows (model/attention.py, attention=flex): document-causal, equal to running each
document alone and to the slot path, and static in shape, so compiled blocks compile once per run.

FlexAttention has no backward on CPU in torch 2.13 (flex_attention refuses inputs that require grad there,
compiled or not), so on CPU training's forward expands the same mask_mod densely and runs SDPA with it;
forwards without grad run the compiled flex kernel. Both are checked here. All comparisons are fp32: the
paths differ only in summation order (online softmax over 128-wide blocks against one pass), which moves
fp32 results by a few ulps of values of magnitude ~1-10, hence atol 1e-4 on logits.
"""

import inspect

import pytest
import torch
import torch.nn.functional as F
from conftest import make_tiny_llama
from torch.nn.attention.flex_attention import BlockMask, create_mask

from tunelab.config import AdapterConfig, LoraConfig
from tunelab.model import attention
from tunelab.model.adapters import apply_adapter
from tunelab.recipes.finetune import compile_blocks
from tunelab.runtime import attention_path
from tunelab.train.loss import CausalLMLoss

WIDTH = 128


def packed(row_lengths: list[list[int]], vocab: int, seed: int = 0):
    """Token ids and restarted position_ids of rows packed from documents of these lengths; a row shorter
    than WIDTH gets a padded tail whose positions restart, as data/packing.collate builds it."""
    positions = []
    for row in row_lengths:
        tail = WIDTH - sum(row)
        positions.append([p for n in row + ([tail] if tail else []) for p in range(n)])
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (len(row_lengths), WIDTH), generator=generator)
    return ids, torch.tensor(positions)


def documents(row_lengths):
    """(row, start, length) of every document."""
    out = []
    for r, row in enumerate(row_lengths):
        at = 0
        for n in row:
            out.append((r, at, n))
            at += n
    return out


ROWS = [[30, 50, 48], [70, 40]]  # the second row has an 18-token padded tail
# On CUDA training runs the flex kernel's own backward, which CPU does not have.
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


@pytest.mark.slow
def test_block_mask_is_document_causal_across_blocks():
    """Three 128-wide blocks per row: the element mask is same-document-and-causal, blocks that hold no
    shared document are skipped, and the flex kernel matches SDPA under the dense mask (GQA, fp32)."""
    lengths = [[100, 200, 84], [130, 254], [10, 374]]
    positions = torch.tensor([[p for n in row for p in range(n)] for row in lengths])
    mask = attention.document_block_mask(positions)
    assert isinstance(mask, BlockMask) and mask.shape == (3, 1, 384, 384)
    document = torch.tensor([[d for d, n in enumerate(row) for _ in range(n)] for row in lengths])
    index = torch.arange(384)
    expected = (document[:, None, :, None] == document[:, None, None, :]) & (index[:, None] >= index[None, :])
    assert torch.equal(create_mask(mask.mask_mod, 3, 1, 384, 384, device="cpu"), expected)
    # Row 1: the last block (tokens 256-383, document 1) shares nothing with the first (0-127, document 0).
    blocks = mask.to_dense()
    assert blocks[1, 0, 2, 0] == 0 and blocks[0, 0, 2, 0] == 1
    assert torch.equal(blocks[:, 0].bool(), expected.view(3, 3, 128, 3, 128).any(4).any(2))

    torch.manual_seed(0)
    q, k, v = torch.randn(3, 4, 384, 16), torch.randn(3, 2, 384, 16), torch.randn(3, 2, 384, 16)
    with torch.no_grad():
        ours = attention._flex_attention()(q, k, v, block_mask=mask, enable_gqa=True)
    reference = F.scaled_dot_product_attention(q, k, v, attn_mask=expected, enable_gqa=True)
    assert torch.allclose(ours, reference, atol=1e-5)


def test_block_mask_builder_is_pure_tensor():
    """No device->host sync by construction: the builder reads nothing back to the host."""
    source = inspect.getsource(attention.document_block_mask) + inspect.getsource(attention.flex_tensors)
    for sync in (".item(", ".tolist(", ".cpu(", "numpy", "int(", "bool("):
        assert sync not in source


def _flex_and_reference(tokenizer_len, device: str = "cpu"):
    model = make_tiny_llama(tokenizer_len, initializer_range=0.5)
    model.set_attn_implementation(attention.register("flex"))
    reference = make_tiny_llama(tokenizer_len, initializer_range=0.5)
    reference.load_state_dict(model.state_dict())
    reference.set_attn_implementation("sdpa")
    return model.to(device).eval(), reference.to(device).eval()


@pytest.mark.slow
@pytest.mark.parametrize("device", DEVICES)
def test_packed_equals_one_by_one(tokenizer, device):
    """Per-token logits of packed rows under the flex kernel (forward, compiled) equal those of each
    document run alone through transformers' SDPA; the training forward (CPU: the dense expansion of the
    same mask; CUDA: the flex kernel) gives the same summed loss and gradients."""
    model, reference = _flex_and_reference(len(tokenizer), device)
    ids, positions = (t.to(device) for t in packed(ROWS, len(tokenizer)))
    with torch.no_grad():
        logits = model(input_ids=ids, position_ids=positions, **attention.flex_tensors(positions)).logits
        for r, start, n in documents(ROWS):
            alone = reference(input_ids=ids[r : r + 1, start : start + n]).logits[0]
            assert torch.allclose(logits[r, start : start + n], alone, atol=1e-4, rtol=1e-5)

    flex = CausalLMLoss(model.train())
    assert flex.flex_attention
    # Loss on every real token except each document's last (its target would be the next document's).
    real = documents(ROWS)
    index = torch.cat([torch.arange(r * WIDTH + s, r * WIDTH + s + n - 1) for r, s, n in real]).to(device)
    targets = torch.cat([ids[r, s + 1 : s + n] for r, s, n in real])
    model.zero_grad()
    packed_loss = flex(ids, positions, index, targets)
    packed_loss.backward()
    packed_grad = model.model.layers[0].self_attn.q_proj.weight.grad.clone()

    alone = CausalLMLoss(reference.train())
    singles = []
    for r, s, n in real:
        reference.zero_grad()
        loss = alone(ids[r : r + 1, s : s + n], None, torch.arange(n - 1, device=device), ids[r, s + 1 : s + n])
        loss.backward()
        singles.append((loss.item(), reference.model.layers[0].self_attn.q_proj.weight.grad.clone()))
    assert packed_loss.item() == pytest.approx(sum(l for l, _ in singles), rel=1e-5)
    # fp32 sums in a different order: gradients of magnitude ~30 agree to ~1e-4 absolute (as test_data's
    # slot-path check).
    assert torch.allclose(packed_grad, sum(g for _, g in singles), rtol=1e-4, atol=1e-3)


def test_flex_equals_slot_path(tokenizer):
    """The same packed micro-batch through flex and through the per-sequence slots: the same logits at every
    real token, the same loss and gradients."""
    from tunelab.data.packing import layout_from_lengths

    model, _ = _flex_and_reference(len(tokenizer))
    slots = make_tiny_llama(len(tokenizer), initializer_range=0.5)
    slots.load_state_dict(model.state_dict())
    slots.set_attn_implementation(attention.register("slots"))
    ids, positions = packed(ROWS, len(tokenizer))
    layout = layout_from_lengths(ROWS, WIDTH)
    with torch.no_grad():
        a = model(input_ids=ids, position_ids=positions, **attention.flex_tensors(positions)).logits
        b = slots.eval()(input_ids=ids, position_ids=positions, **attention.layout_tensors(layout, ids.device)).logits
    for r, s, n in documents(ROWS):
        assert torch.allclose(a[r, s : s + n], b[r, s : s + n], atol=1e-4, rtol=1e-5)

    index = torch.tensor([r * WIDTH + s + j for r, s, n in documents(ROWS) for j in range(n - 1)])
    targets = ids.reshape(-1)[index + 1]
    grads = []
    for m, wrapped in ((model, CausalLMLoss(model.train())), (slots, CausalLMLoss(slots.train()))):
        m.zero_grad()
        loss = wrapped(ids, positions, index, targets, layout)
        loss.backward()
        grads.append((loss.item(), m.model.layers[1].self_attn.k_proj.weight.grad.clone()))
    assert grads[0][0] == pytest.approx(grads[1][0], rel=1e-5)
    assert torch.allclose(grads[0][1], grads[1][1], rtol=1e-4, atol=1e-3)


MIXES = [  # four micro-batches of two rows, each a different mix of document lengths
    [[30, 50, 48], [70, 40]],
    [[128], [5, 6, 7, 8, 9, 10]],
    [[64, 64], [100]],
    [[1, 2, 3], [90, 30, 8]],
]


@pytest.mark.slow
@pytest.mark.gpu
def test_compiled_blocks_compile_once(tokenizer, device="cuda"):
    """LoRA over compiled blocks with attention=flex: four micro-batches of different document mixes, forward
    and backward; after the first, dynamo compiles nothing new (under LoRA the first block's input needs no
    grad and the later blocks' inputs do, two graphs, both in the first micro-batch). Then the same without
    grad, where the blocks run the flex kernel itself. On CPU the training loop's own test covers this, with
    evaluations between steps (test_loop.py::test_a_compiled_run_compiles_nothing_after_its_first_steps)."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    model = make_tiny_llama(len(tokenizer))
    model.set_attn_implementation(attention.register("flex"))
    model = apply_adapter(model.to(device), AdapterConfig(lora=LoraConfig(r=8, alpha=16.0)))
    compile_blocks(model)
    wrapped = CausalLMLoss(model).train()
    counters.clear()
    try:
        graphs = []
        for seed, mix in enumerate(MIXES):
            ids, positions = (t.to(device) for t in packed(mix, len(tokenizer), seed))
            index = torch.arange(0, ids.numel(), 3, device=device)
            wrapped(ids, positions, index, ids.reshape(-1)[index]).backward()
            graphs.append(counters["stats"]["unique_graphs"])
        assert graphs[0] > 0 and graphs[1:] == [graphs[0]] * 3, graphs

        graphs = []
        with torch.no_grad():
            for seed, mix in enumerate(MIXES):
                ids, positions = (t.to(device) for t in packed(mix, len(tokenizer), seed))
                wrapped(ids, positions, torch.arange(0, ids.numel(), 3, device=device), ids.reshape(-1)[::3])
                graphs.append(counters["stats"]["unique_graphs"])
        assert graphs[1:] == [graphs[0]] * 3, graphs
    finally:
        torch._dynamo.reset()


def test_auto_is_flex_on_cuda_and_slots_on_cpu():
    assert attention_path("auto", "cuda") == "flex"
    assert attention_path("auto", "cuda", flash_attn=True) == "flash"
    assert attention_path("auto", "cpu") == "slots"
    assert attention_path("sdpa", "cuda") == "sdpa"


def test_attention_key_is_validated():
    from tunelab.config import load_config
    from tunelab.errors import TunelabError

    assert load_config(None, ["attention=flex"]).compute.attention == "flex"
    with pytest.raises(TunelabError, match=r"attention must be one of .*did you mean 'slots'"):
        load_config(None, ["attention=slot"])


@pytest.mark.parametrize("width", [384, 300, 64])
def test_block_mask_equals_create_block_masks_without_the_element_mask(width):
    """The block-level builder (no T x T mask, which at 131,072 tokens would be 17 GB) gives create_block_mask's
    BlockMask: the same partial and full blocks and the same elements, for rows whose last block is partial."""
    from torch.nn.attention.flex_attention import create_block_mask

    g = torch.Generator().manual_seed(width)
    rows = []
    for _ in range(4):
        row, left = [], width
        while left:
            n = min(left, int(torch.randint(1, 200, (1,), generator=g)))
            row += list(range(n))
            left -= n
        rows.append(row)
    positions = torch.tensor(rows)
    ours = attention.document_block_mask(positions)
    document = (positions == 0).cumsum(-1)
    reference = create_block_mask(
        lambda b, h, q, kv: (document[b, q] == document[b, kv]) & (q >= kv), 4, None, width, width, device="cpu"
    )
    assert ours.shape == reference.shape
    assert torch.equal(ours.to_dense(), reference.to_dense())
    n = reference.full_kv_num_blocks
    assert torch.equal(ours.full_kv_num_blocks, n) and torch.equal(ours.kv_num_blocks, reference.kv_num_blocks)
    for b in range(4):
        for i in range(ours.kv_num_blocks.shape[-1]):
            k = int(n[b, 0, i])
            assert set(ours.full_kv_indices[b, 0, i, :k].tolist()) == set(
                reference.full_kv_indices[b, 0, i, :k].tolist()
            )
    assert torch.equal(
        create_mask(ours.mask_mod, 4, 1, width, width, device="cpu"),
        create_mask(reference.mask_mod, 4, 1, width, width, device="cpu"),
    )
