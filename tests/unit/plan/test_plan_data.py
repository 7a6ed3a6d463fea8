"""`plan` on a real dataset and a local model directory (config.json only, no weights)."""

import json

import pytest

from tunelab import sources
from tunelab.cli import main
from tunelab.sources import resolve_arch


@pytest.fixture(scope="module")
def local_model(tmp_path_factory):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, PreTrainedTokenizerFast

    root = tmp_path_factory.mktemp("plan-model")
    vocab = {"<pad>": 0, "</s>": 1, **{c: i + 2 for i, c in enumerate("0123456789+= ")}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="</s>", pad_token="<pad>").save_pretrained(root / "model")
    LlamaConfig(
        hidden_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=256,
        vocab_size=512,
        max_position_embeddings=256,
    ).save_pretrained(root / "model")
    with open(root / "data.jsonl", "w") as f:
        for a in range(100):
            f.write(json.dumps({"prompt": f"{a * 37} + {a} = ", "completion": str(a * 38)}) + "\n")
    return root


def test_arch_from_config_dir(local_model):
    a = resolve_arch(str(local_model / "model"))
    assert (a.hidden, a.layers, a.kv_heads, a.max_positions) == (128, 2, 2, 256)
    assert a.source.endswith("config.json")


def test_plan_uses_real_token_lengths(local_model, capsys):
    from tunelab.data.pipeline import DataSpec, prepare

    model = str(local_model / "model")
    data = str(local_model / "data.jsonl")
    tok = sources.load_tokenizer(sources.resolve(model))
    real = prepare(DataSpec(data, "completion", "alpaca", False, 64), tok)
    argv = [
        "plan",
        f"model={model}",
        f"data.path={data}",
        "data.format=completion",
        "seq_len=64",
        "micro_batch=4",
        "packing=false",
        "--gpu",
        "l4",
        "--json",
    ]
    assert main(argv) == 0
    rec = json.loads(capsys.readouterr().out)
    assert rec["examples"] == real.stats.examples == 100
    assert rec["tokens_total_nonpad"] == real.stats.tokens_nonpad
    assert rec["tokens_total_loss"] == real.stats.tokens_loss
    # length-grouped padding: more than the real tokens, far less than examples x seq_len
    assert real.stats.tokens_nonpad <= rec["tokens_total_padded"] < rec["tokens_upper_bound"] == 100 * 64
    assert any(a.startswith("workload: dataset") for a in rec["assumptions"])


def test_dataset_and_examples_conflict(local_model, capsys):
    assert (
        main(["plan", f"model={local_model / 'model'}", f"data.path={local_model / 'data.jsonl'}", "--examples", "5"])
        == 2
    )
    assert "data.path is set" in capsys.readouterr().err


def test_assumed_examples_longer_than_seq_len_lose_their_response_first(capsys):
    """Truncation keeps an example's first seq_len tokens, prompt first: 600 tokens of which 300 carry the loss
    keep 212 of them at seq_len 512; a 2,000-token prompt keeps none, which train refuses, so plan does too."""
    assert main(["plan", "--model", "smollm2-135m", "--examples", "10", "--mean-tokens", "600", "--json"]) == 0
    rec = json.loads(capsys.readouterr().out)
    assert rec["tokens_total_loss"] == 10 * 212 and rec["tokens_total_nonpad"] == 10 * 512
    assert main(["plan", "--model", "smollm2-135m", "--examples", "10", "--mean-tokens", "4000"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "truncation leaves no example a token to learn from" in err[0]


def test_the_default_assumed_example_fits_a_short_seq_len(capsys):
    """Without --mean-tokens the assumed 256 tokens shrink to seq_len 128, half of them with the loss."""
    assert main(["plan", "--model", "smollm2-135m", "--examples", "10", "--seq-len", "128", "--json"]) == 0
    rec = json.loads(capsys.readouterr().out)
    assert (rec["tokens_total_nonpad"], rec["tokens_total_loss"]) == (10 * 128, 10 * 64)
