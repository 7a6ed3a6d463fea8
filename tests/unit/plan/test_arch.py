"""plan/arch.py's GGUF header reader against gguf's own GGUFReader, and the Arch plan builds from a GGUF file."""

import gguf
import numpy as np
import pytest

from tunelab.errors import TunelabError
from tunelab.plan.arch import from_gguf, gguf_header


def write_gguf(path, fields: dict, tensors: dict) -> None:
    """A GGUF file with `fields` (key -> (adder name, value)) and `tensors` (name -> array)."""
    writer = gguf.GGUFWriter(path, "llama")
    for key, (adder, value) in fields.items():
        getattr(writer, adder)(key, value)
    for name, array in tensors.items():
        writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


EVERY_TYPE = {
    "t.u8": ("add_uint8", 200),
    "t.i8": ("add_int8", -100),
    "t.u16": ("add_uint16", 60000),
    "t.i16": ("add_int16", -30000),
    "t.u32": ("add_uint32", 4_000_000_000),
    "t.i32": ("add_int32", -2_000_000_000),
    "t.f32": ("add_float32", 0.5),
    "t.bool": ("add_bool", True),
    "t.string": ("add_string", "Grüße 🚀"),
    "t.u64": ("add_uint64", 2**60),
    "t.i64": ("add_int64", -(2**60)),
    "t.f64": ("add_float64", 1e-300),
    "t.ints": ("add_array", [1, 2, 3, 4, 5]),
    "t.strings": ("add_array", ["a", "bc", "", "déf"]),
}


def test_the_header_reader_reads_what_gguf_reads(tmp_path):
    path = tmp_path / "m.gguf"
    tensors = {"token_embd.weight": np.zeros((8, 4), np.float32), "blk.0.attn_q.weight": np.ones((4, 4), np.float16)}
    write_gguf(path, EVERY_TYPE, tensors)
    fields, names = gguf_header(path)
    reader = gguf.GGUFReader(path)
    assert names == [t.name for t in reader.tensors] == list(tensors)
    expected = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    expected = {k: len(v) if isinstance(v, list) else v for k, v in expected.items()}  # arrays: their length
    assert fields == expected
    assert fields["t.string"] == "Grüße 🚀" and fields["t.strings"] == 4 and fields["t.u64"] == 2**60


LLAMA = {
    "llama.block_count": ("add_uint32", 2),
    "llama.embedding_length": ("add_uint32", 64),
    "llama.feed_forward_length": ("add_uint32", 176),
    "llama.attention.head_count": ("add_uint32", 4),
    "llama.attention.head_count_kv": ("add_uint32", 2),
    "llama.context_length": ("add_uint32", 2048),
    "tokenizer.ggml.tokens": ("add_array", [f"t{i}" for i in range(300)]),
}


@pytest.mark.parametrize("head", [False, True], ids=["tied", "own-head"])
def test_plan_reads_a_gguf_models_shape_from_its_header(tmp_path, head):
    path = tmp_path / "m.gguf"
    tensors = {"token_embd.weight": np.zeros((300, 64), np.float32)}
    if head:
        tensors["output.weight"] = np.zeros((300, 64), np.float32)
    write_gguf(path, LLAMA, tensors)
    arch = from_gguf("m", path)
    assert (arch.layers, arch.hidden, arch.intermediate, arch.heads, arch.kv_heads) == (2, 64, 176, 4, 2)
    assert (arch.head_dim, arch.vocab, arch.max_positions, arch.tied) == (16, 300, 2048, not head)


def test_a_truncated_or_mixture_of_experts_gguf_is_one_error(tmp_path):
    path = tmp_path / "m.gguf"
    write_gguf(path, LLAMA, {"token_embd.weight": np.zeros((300, 64), np.float32)})
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(path.read_bytes()[:2000])  # inside the token list
    with pytest.raises(TunelabError, match="cut.gguf is not a readable GGUF file: .* truncated; download it again"):
        from_gguf("cut", cut)
    data_cut = tmp_path / "data-cut.gguf"  # the header whole, the tensor data cut (a partial download)
    write_gguf(data_cut, LLAMA, {"token_embd.weight": np.zeros((300, 64), np.float32), "x": np.zeros(8, np.float32)})
    data_cut.write_bytes(data_cut.read_bytes()[: -300 * 64 * 4 + 100])
    with pytest.raises(TunelabError, match="data-cut.gguf is not a readable GGUF file: .* truncated"):
        from_gguf("data-cut", data_cut)
    (tmp_path / "not.gguf").write_bytes(b"not a gguf file" * 10)
    with pytest.raises(TunelabError, match="not a readable GGUF file"):
        from_gguf("not", tmp_path / "not.gguf")
    moe = tmp_path / "moe.gguf"
    write_gguf(moe, {**LLAMA, "llama.expert_count": ("add_uint32", 8)}, {})
    with pytest.raises(TunelabError, match="Mixture-of-Experts"):
        from_gguf("moe", moe)
