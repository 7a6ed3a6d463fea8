"""`tunelab export --format gguf` on the embedded SmolLM2-135M, proven by reading the file back without the writer:
its keys and tensor names against the embedded GGUF (which llama.cpp's own converter wrote), its logits and token
ids through transformers' GGUF loader."""

from __future__ import annotations

import copy
import functools
import os

import gguf
import pytest
import torch

from tunelab.cli import main
from tunelab.config import TrainConfig, dump_yaml
from tunelab.model.load import load_model
from tunelab.plan.arch import gguf_header
from tunelab.sources import embedded_gguf, resolve

pytestmark = pytest.mark.integration

# Held out: none of these is in any data tunelab's tests train on.
TEXTS = [
    "### Instruction:\n4821+377=\n### Response:\n",
    "The capital of France is",
    "def fibonacci(n):\n    return",
    "<|im_start|>user\nWhat is 7 times 8?<|im_end|>\n<|im_start|>assistant\n",
    "Ça va? Grüße aus Zürich, 3.14159 🚀",
]
# The keys that name the file, not the model: the converter fills them from the model card.
NAMING = {"general.name", "general.basename", "general.finetune", "general.organization", "general.license"}
NAMING |= {"general.languages", "general.size_label", "general.file_type", "GGUF.kv_count"}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A run's layout with a LoRA on every linear layer whose B is small but not zero, and the merged model."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoTokenizer

    folder = tmp_path_factory.mktemp("gguf-run")
    base = load_model(resolve("embedded"), torch.float32, "none", torch.device("cpu"))
    torch.manual_seed(0)
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=targets, init_lora_weights=False))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.005)
    model.save_pretrained(folder / "adapter")
    cfg = TrainConfig(model="embedded")
    cfg.data.template = "compact"
    (folder / "config.yaml").write_text(dump_yaml(cfg))
    tokenizer = AutoTokenizer.from_pretrained(resolve("embedded").path)
    with model.disable_adapter():
        base_logits = logits(model.eval(), tokenizer)
    return folder, model.merge_and_unload(), base_logits, tokenizer


def export(run, quant):
    folder = run[0]
    out = folder / quant / "smollm2.gguf"
    if not out.exists():
        args = ["export", "--adapter", str(folder / "adapter"), "--format", "gguf", "--quant", quant, "--out", str(out)]
        assert main(args) == 0
    return out


@pytest.fixture(scope="module", autouse=True)
def fast_gguf_reads():
    """transformers' GGUF loader builds gguf's tensor name map once per tensor, and parses the whole file (every
    one of the tokenizer's 49k tokens and 48k merges, ~4 s) for the config, again for the tokenizer and again for
    the weights. The map depends only on its arguments and a reader only on its file, which nothing rewrites
    once exported, so caching both changes nothing that is read and saves most of the loads' time."""
    real_map, real_reader = gguf.get_tensor_name_map, gguf.GGUFReader
    gguf.get_tensor_name_map = functools.cache(real_map)

    @functools.cache
    def reader(path, mode="r", _stat=None):
        return real_reader(path, mode)

    def cached(path, mode="r"):
        stat = os.stat(path)
        return reader(str(path), mode, (stat.st_ino, stat.st_size, stat.st_mtime_ns))

    gguf.GGUFReader = cached
    yield
    gguf.get_tensor_name_map, gguf.GGUFReader = real_map, real_reader


def logits(model, tokenizer):
    with torch.no_grad():
        return [model(torch.tensor([tokenizer.encode(t)])).logits[0] for t in TEXTS]


def test_keys_and_tensor_names_match_the_llama_cpp_converted_gguf(run):
    ours, theirs = gguf.GGUFReader(export(run, "bf16")), gguf.GGUFReader(embedded_gguf())
    assert set(ours.fields) - NAMING == set(theirs.fields) - NAMING
    for key in set(theirs.fields) - NAMING - {"tokenizer.chat_template"}:
        assert ours.fields[key].contents() == theirs.fields[key].contents(), key
    assert {t.name: tuple(t.shape) for t in ours.tensors} == {t.name: tuple(t.shape) for t in theirs.tensors}
    assert ours.fields["general.file_type"].contents() == gguf.LlamaFileType.MOSTLY_BF16
    assert ours.fields["tokenizer.chat_template"].contents() == theirs.fields["tokenizer.chat_template"].contents()
    modelfile = (export(run, "bf16").parent / "Modelfile").read_text()
    assert "FROM ./smollm2.gguf" in modelfile and "{{ .Prompt }}\n### Response:" in modelfile


@pytest.mark.slow
def test_bf16_reads_back_as_the_merged_model_and_tokenizer(run):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = export(run, "bf16")
    _, merged, base_logits, reference = run
    back_tokenizer = AutoTokenizer.from_pretrained(out.parent, gguf_file=out.name)
    for text in TEXTS:
        assert back_tokenizer.encode(text) == reference.encode(text), text
    # bf16 rounds the matrices only (norms stay f32, as llama.cpp's converter writes them).
    rounded = copy.deepcopy(merged)
    with torch.no_grad():
        for p in rounded.parameters():
            if p.dim() == 2:
                p.copy_(p.bfloat16().float())
    back = AutoModelForCausalLM.from_pretrained(out.parent, gguf_file=out.name, dtype=torch.float32).eval()
    for want, got in zip(logits(rounded, reference), logits(back, reference)):
        assert (want - got).abs().max().item() <= 1e-2
    # ... and it is the merged model, not the base: the adapter moves the logits by more than that.
    moved = max((a - b).abs().max().item() for a, b in zip(base_logits, logits(merged, reference)))
    assert moved > 0.1


@pytest.mark.slow
def test_q8_0_gives_the_merged_models_greedy_token(run):
    from transformers import AutoModelForCausalLM

    out = export(run, "q8_0")
    _, merged, _, reference = run
    back = AutoModelForCausalLM.from_pretrained(out.parent, gguf_file=out.name, dtype=torch.float32).eval()
    for want, got in zip(logits(merged, reference), logits(back, reference)):
        assert want[-1].argmax() == got[-1].argmax()


def test_plans_header_reader_reads_what_gguf_reads_from_the_embedded_file():
    """plan/arch.gguf_header (arrays as their lengths) against gguf's own reader, on a file llama.cpp's converter
    wrote: strings, bools, floats, integers, arrays of strings and of integers."""
    fields, names = gguf_header(embedded_gguf())
    reader = gguf.GGUFReader(embedded_gguf())
    assert names == [t.name for t in reader.tensors]
    expected = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    assert fields == {k: len(v) if isinstance(v, list) else v for k, v in expected.items()}
    assert fields["tokenizer.ggml.tokens"] == 49152 and fields["tokenizer.ggml.add_bos_token"] is False
