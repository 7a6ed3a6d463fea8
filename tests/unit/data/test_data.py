import numpy as np
import pytest
import torch
from conftest import make_tiny_llama, write_jsonl

from tunelab.data.examples import IGNORE
from tunelab.data.formats import prompt_text
from tunelab.data.packing import collate, epoch_micro_batches, epoch_rows
from tunelab.data.pipeline import DataSpec, prepare
from tunelab.data.read import read_rows
from tunelab.errors import TunelabError
from tunelab.train.loss import CausalLMLoss


def spec(path, fmt="alpaca", seq_len=64, template="compact", train_on_inputs=False):
    return DataSpec(str(path), fmt, template, train_on_inputs, seq_len)


def decode_targets(tokenizer, data, i):
    start, end = data.offsets[i], data.offsets[i + 1]
    t = data.targets[start:end]
    return tokenizer.decode([x for x in t if x != IGNORE])


def test_alpaca_masks_the_prompt(tmp_path, tokenizer):
    path = write_jsonl(tmp_path / "a.jsonl", [{"instruction": "2 + 3", "output": "2 + 3 = 5"}])
    data = prepare(spec(path), tokenizer)
    assert decode_targets(tokenizer, data, 0) == "2 + 3 = 5</s>"
    ids = tokenizer.decode(data.ids[: data.offsets[1]])
    assert ids == prompt_text("alpaca", "compact", {"instruction": "2 + 3"}) + "2 + 3 = 5</s>"
    assert data.stats.tokens_loss == len("2 + 3 = 5") + 1


def test_bare_template_is_the_instruction_and_a_newline():
    assert prompt_text("alpaca", "bare", {"instruction": "2 + 3"}) == "2 + 3\n"
    assert prompt_text("alpaca", "bare", {"instruction": "Add", "input": "2 + 3"}) == "Add\n2 + 3\n"


def test_train_on_inputs_trains_the_prompt_too(tmp_path, tokenizer):
    path = write_jsonl(tmp_path / "a.jsonl", [{"instruction": "2 + 3", "output": "5"}])
    data = prepare(spec(path, train_on_inputs=True), tokenizer)
    assert data.stats.tokens_loss == data.stats.tokens_nonpad - 1  # every token but the first is predicted


def test_chat_trains_only_assistant_turns(tmp_path, tokenizer):
    row = {
        "messages": [
            {"role": "system", "content": "S"},
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "yo"},
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": "a"},
        ]
    }
    path = write_jsonl(tmp_path / "c.jsonl", [row])
    data = prepare(spec(path, "chat", template="alpaca"), tokenizer)
    # Each assistant turn's content and its end-of-turn marker (the template's stop token, so no EOS is
    # appended); never a user/system turn or a role header.
    assert decode_targets(tokenizer, data, 0) == "yo<|im_end|>\na<|im_end|>\n"


def test_completion_and_text(tmp_path, tokenizer):
    path = write_jsonl(tmp_path / "c.jsonl", [{"prompt": "Q:", "completion": "A"}])
    assert decode_targets(tokenizer, prepare(spec(path, "completion", template="alpaca"), tokenizer), 0) == "A</s>"
    path = write_jsonl(tmp_path / "t.jsonl", [{"text": "abc"}])
    assert decode_targets(tokenizer, prepare(spec(path, "text", template="alpaca"), tokenizer), 0) == "bc</s>"


def test_truncation_and_dropping_are_counted(tmp_path, tokenizer):
    rows = [
        {"instruction": "x" * 80, "output": "y"},
        {"instruction": "1", "output": "z" * 80},
        {"instruction": "1", "output": "2"},
    ]
    data = prepare(spec(write_jsonl(tmp_path / "d.jsonl", rows), seq_len=40), tokenizer)
    s = data.stats
    assert (s.rows, s.examples, s.truncated, s.dropped) == (3, 2, 1, 1)
    assert s.max_len == 40 and len(data) == 2


def test_csv_and_parquet(tmp_path, tokenizer):
    import datasets

    rows = [{"instruction": "1 + 1", "output": "2"}] * 3
    datasets.Dataset.from_list(rows).to_csv(tmp_path / "r.csv")
    datasets.Dataset.from_list(rows).to_parquet(tmp_path / "r.parquet")
    assert prepare(spec(tmp_path / "r.csv"), tokenizer).stats.examples == 3
    assert prepare(spec(tmp_path / "r.parquet"), tokenizer).stats.examples == 3


@pytest.mark.parametrize(
    "content, message",
    [
        ('{"instruction": "a", "output": "b"}\n{"instruction": "a", "output"\n', r"bad.jsonl:2: not valid JSON"),
        ('{"instruction": "a", "output": "b"}\n{"instruction": "a"}\n', r"bad.jsonl:2: missing field 'output'"),
        ("\n\n", "the dataset is empty"),
        ("[1, 2]\n", r"bad.jsonl:1: each line must be a JSON object"),
    ],
)
def test_bad_jsonl_names_file_and_line(tmp_path, tokenizer, content, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    with pytest.raises(TunelabError, match=message):
        prepare(spec(path), tokenizer)


@pytest.mark.parametrize(
    "line, problem",
    [
        # json would place this at "line 2 column 1": the newline ending the file's line 4.
        ('{"instruction": "a", "output": \n', "Expecting value at the end of the line"),
        ('{"instruction": "a" "output": "b"}\n', "Expecting ',' delimiter at column 21"),
        ('{"instruction": "a\tb", "output": "b"}\n', "Invalid control character at column 19"),
        ('{"instruction": "a", "output": "b"} x\n', "Extra data at column 37"),
    ],
)
def test_bad_json_is_placed_by_the_files_line_and_a_column_in_it(tmp_path, line, problem):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"instruction": "a", "output": "b"}\n' * 2 + "\n" + line)
    with pytest.raises(TunelabError) as e:
        read_rows(path, "alpaca", None)
    assert str(e.value) == f"{path}:4: not valid JSON ({problem}); fix or remove the line"


@pytest.mark.parametrize(
    "name, text",
    [
        ("rows.jsonl", '{"instruction": "a", "output": "b"}\n{"instruction": "c", "output": "d"}\n'),
        ("rows.json", '[{"instruction": "a", "output": "b"}, {"instruction": "c", "output": "d"}]\n'),
        ("rows.csv", "instruction,output\na,b\nc,d\n"),
    ],
)
def test_a_file_saved_with_a_byte_order_mark_loads(tmp_path, name, text):
    path = tmp_path / name
    path.write_bytes(b"\xef\xbb\xbf" + text.encode())  # the UTF-8 BOM Windows Notepad writes
    ds = read_rows(path, "alpaca", None)
    assert ds.column_names == ["instruction", "output"]
    assert ds.to_list() == [{"instruction": "a", "output": "b"}, {"instruction": "c", "output": "d"}]


def test_unknown_extension_and_missing_file(tmp_path, tokenizer):
    (tmp_path / "x.txt").write_text("hi")
    with pytest.raises(TunelabError, match="unknown file type"):
        prepare(spec(tmp_path / "x.txt"), tokenizer)
    with pytest.raises(TunelabError, match="data file not found"):
        prepare(spec(tmp_path / "nope.jsonl"), tokenizer)


def test_tokenization_is_cached(tmp_path, tokenizer, addition_rows):
    path = write_jsonl(tmp_path / "a.jsonl", addition_rows)
    first = prepare(spec(path), tokenizer)
    second = prepare(spec(path), tokenizer)
    assert np.array_equal(first.ids, second.ids)
    cache_files = list((tmp_path).glob("**/cache-*.arrow"))
    # datasets keeps the map output beside its own cache; the fingerprint is stable, so no second file
    assert len({p.name for p in cache_files}) <= 1


def test_packing_uses_each_example_once_and_fits(tokenizer, tmp_path, addition_rows):
    data = prepare(spec(write_jsonl(tmp_path / "a.jsonl", addition_rows)), tokenizer)
    rows = epoch_rows(data.lengths, 64, True, np.random.default_rng(0))
    flat = sorted(i for r in rows for i in r)
    assert flat == list(range(len(data)))
    assert all(data.lengths[r].sum() <= 64 for r in rows)
    batch = collate(data, rows[:2], 64, 0, packing=True)
    assert batch.input_ids.shape == (2, 64)
    first_len = int(data.lengths[rows[0][0]])
    assert list(batch.position_ids[0, : first_len + 2]) == list(range(first_len)) + [0, 1]
    assert batch.tokens_nonpad == int(data.lengths[rows[0]].sum() + data.lengths[rows[1]].sum())


def test_packed_micro_batches_all_have_the_same_row_count():
    """The last micro-batch is filled by splitting rows, so compiled blocks see one batch shape."""
    rng = np.random.default_rng(0)
    lengths = rng.integers(20, 60, size=997)
    rows = epoch_rows(lengths, 256, True, np.random.default_rng(1))
    assert len(rows) % 16  # without the fill the last micro-batch would be short
    batches = epoch_micro_batches(lengths, 256, 16, True, np.random.default_rng(1))
    assert len(batches) == -(-len(rows) // 16)
    assert all(len(b) == 16 for b in batches)
    flat = [i for b in batches for r in b for i in r]
    assert sorted(flat) == list(range(len(lengths)))
    assert flat == [i for r in rows for i in r]  # same training order
    assert all(lengths[r].sum() <= 256 for b in batches for r in b)


def test_a_small_set_of_single_example_rows_is_filled_with_empty_rows(tokenizer, tmp_path):
    """Three examples that each fill a row cannot be split into more rows: empty rows (padding, no targets)
    make the micro-batch full, so an evaluation set that small keeps the training batches' shape."""
    lengths = np.array([60, 61, 62])
    batches = epoch_micro_batches(lengths, 64, 4, True, np.random.default_rng(0))
    assert len(batches) == 1 and len(batches[0]) == 4 and batches[0].count([]) == 1
    assert sorted(i for r in batches[0] for i in r) == [0, 1, 2]
    rows = [{"instruction": "1 + 2", "output": "3"}] * 3
    data = prepare(spec(write_jsonl(tmp_path / "a.jsonl", rows), seq_len=64), tokenizer)
    assert data.lengths.min() > 32  # one example a row
    plan = epoch_micro_batches(data.lengths, 64, 4, True, np.random.default_rng(0))
    (batch,) = [collate(data, rows, 64, tokenizer.pad_token_id, True, 0) for rows in plan]
    assert batch.input_ids.shape == (4, 64) and batch.tokens_nonpad == int(data.lengths.sum())
    assert len(batch.loss_index) == int((data.targets != IGNORE).sum())
    # a data-parallel rank whose share of that micro-batch is the empty row: padding only, the run's slot count
    share = collate(data, [[]], 64, tokenizer.pad_token_id, True, min_slots=3)
    assert share.input_ids.shape == (1, 64) and share.tokens_nonpad == 0 and len(share.loss_index) == 0
    assert share.layout.gather.shape[0] == 3 and not share.layout.valid.any()


def test_every_packed_batch_of_a_run_has_the_same_slot_shape(tokenizer, tmp_path):
    """The epoch's last batches hold split rows and fewer sequences; their attention-slot count must still
    be the run's, or compiled blocks compile again at the end of the run."""
    from tunelab.config import BatchConfig
    from tunelab.train.batches import BatchSpec, Schedule

    rng = np.random.default_rng(0)
    rows = [{"instruction": f"{a} + {b}", "output": f"{a + b}"} for a, b in rng.integers(0, 10**6, (1100, 2))]
    data = prepare(spec(write_jsonl(tmp_path / "a.jsonl", rows), seq_len=256), tokenizer)
    schedule = Schedule(
        data,
        BatchSpec(BatchConfig(seq_len=256, micro_batch=16, grad_accum=1, packing=True), 0, tokenizer.pad_token_id),
        epochs=2,
        max_steps=None,
    )
    batches = [b for _, bs in schedule.iterate(0, schedule.total_steps) for b in bs]
    sequences = [int(b.layout.valid.any(1).sum()) for b in batches]
    assert min(sequences) <= max(sequences) - 16  # the last batches do hold fewer sequences
    assert {b.layout.gather.shape[0] for b in batches} == {max(sequences)}  # no padding slots beyond the run's most


def test_unpacked_batches_are_length_grouped(tokenizer, tmp_path, addition_rows):
    data = prepare(spec(write_jsonl(tmp_path / "a.jsonl", addition_rows)), tokenizer)
    batches = epoch_micro_batches(data.lengths, 64, 8, False, np.random.default_rng(0))
    spread = np.mean([np.ptp([data.lengths[r[0]] for r in b]) for b in batches])
    random_spread = np.mean([np.ptp(data.lengths[i : i + 8]) for i in range(0, len(data), 8)])
    assert spread < random_spread


def test_packed_loss_equals_one_by_one(tokenizer, tmp_path):
    """Block-diagonal attention + restarted positions: a packed row is exactly its sequences run alone."""
    rows = [{"instruction": f"{a} + {b}", "output": f"{a + b}"} for a, b in [(1, 22), (333, 4), (55, 66)]]
    data = prepare(spec(write_jsonl(tmp_path / "p.jsonl", rows), seq_len=128, train_on_inputs=True), tokenizer)
    # Large init so that attention depends strongly on context (the control below must be able to fail).
    model = CausalLMLoss(make_tiny_llama(len(tokenizer), initializer_range=0.5).eval())
    packed = collate(data, [[0, 1, 2]], 128, tokenizer.pad_token_id, packing=True)

    def loss_of(batch, select=slice(None)):
        positions = None if batch.position_ids is None else torch.from_numpy(batch.position_ids)
        return model(
            torch.from_numpy(batch.input_ids),
            positions,
            torch.from_numpy(batch.loss_index[select]),
            torch.from_numpy(batch.loss_targets[select]),
        ).item()

    with torch.no_grad():
        packed_total = loss_of(packed)
        singles = [loss_of(collate(data, [[i]], 128, tokenizer.pad_token_id, packing=False)) for i in range(3)]
        # Per sequence inside the packed row: that sequence's targets only.
        offsets = np.concatenate([[0], np.cumsum(data.lengths)])
        per_seq = [
            loss_of(packed, (packed.loss_index >= offsets[i]) & (packed.loss_index < offsets[i + 1])) for i in range(3)
        ]
    assert per_seq == pytest.approx(singles, rel=1e-5)
    assert packed_total == pytest.approx(sum(singles), rel=1e-5)

    # Control: without restarted positions the packed row attends across sequences and the loss changes.
    with torch.no_grad():
        leaky = model(
            torch.from_numpy(packed.input_ids),
            None,
            torch.from_numpy(packed.loss_index),
            torch.from_numpy(packed.loss_targets),
        ).item()
    assert leaky != pytest.approx(sum(singles), rel=1e-3)


@pytest.mark.parametrize("kernel", ["products", "sdpa"])
def test_packed_slot_attention_matches_one_by_one(tokenizer, tmp_path, monkeypatch, kernel):
    """tunelab's per-sequence-slot attention (model/attention.py), with its slots as explicit products or through
    SDPA (runtime.SLOT_MAX_LEN decides by length), gives the same losses and gradients as running each sequence
    alone."""
    from tunelab import runtime
    from tunelab.model import attention

    monkeypatch.setitem(runtime.SLOT_MAX_LEN, (False, False), 128 if kernel == "products" else 0)

    # The slot path, not the block-diagonal-mask fallback (which would also match), must be the one tested.
    gathers, products = [], []
    regather, slot_attention = attention._Regather.forward, attention._SlotAttention.forward
    monkeypatch.setattr(
        attention._Regather, "forward", staticmethod(lambda ctx, *a: gathers.append(1) or regather(ctx, *a))
    )
    monkeypatch.setattr(
        attention._SlotAttention, "forward", staticmethod(lambda ctx, *a: products.append(1) or slot_attention(ctx, *a))
    )

    rows = [{"instruction": f"{a} + {b}", "output": f"{a + b}"} for a, b in [(1, 22), (333, 4), (55, 66), (7, 8)]]
    data = prepare(spec(write_jsonl(tmp_path / "p.jsonl", rows), seq_len=128, train_on_inputs=True), tokenizer)
    model = make_tiny_llama(len(tokenizer), initializer_range=0.5)
    model.set_attn_implementation(attention.register())
    wrapped = CausalLMLoss(model)
    assert wrapped.packed_attention
    packed = collate(data, [[0, 1], [2, 3]], 128, tokenizer.pad_token_id, packing=True)
    assert packed.layout is not None and packed.layout.valid.any(1).sum() == 4

    def run(batch):
        model.zero_grad()
        positions = None if batch.position_ids is None else torch.from_numpy(batch.position_ids)
        loss = wrapped(
            torch.from_numpy(batch.input_ids),
            positions,
            torch.from_numpy(batch.loss_index),
            torch.from_numpy(batch.loss_targets),
            batch.layout,
        )
        loss.backward()
        return loss.item(), model.model.layers[0].self_attn.q_proj.weight.grad.clone()

    packed_loss, packed_grad = run(packed)
    assert len(gathers) == 4 * model.config.num_hidden_layers  # q, k, v into slots and the output back
    assert len(products) == (model.config.num_hidden_layers if kernel == "products" else 0)
    singles = [run(collate(data, [[i]], 128, tokenizer.pad_token_id, packing=False)) for i in range(4)]
    assert packed_loss == pytest.approx(sum(l for l, _ in singles), rel=1e-5)
    # fp32 sums in a different order: gradients of magnitude ~30 agree to ~1e-4 absolute
    assert torch.allclose(packed_grad, sum(g for _, g in singles), rtol=1e-4, atol=1e-3)
