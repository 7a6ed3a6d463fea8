"""data.mix: sources drawn by relative weight, the same mixture for the same seed, small sources repeated
evenly, a held-out split taken per source before the draw, and the config's checks."""

from __future__ import annotations

import json
from collections import Counter

import datasets
import numpy as np
import pytest
from conftest import write_jsonl

from tunelab.cli import main
from tunelab.config import load_config
from tunelab.data.pipeline import HeldOutSpec, prepare, prepare_split
from tunelab.errors import TunelabError

REAL_LOAD = datasets.load_dataset


def rows(tag: str, n: int) -> list[dict]:
    return [{"instruction": f"{tag} {i}", "output": f"{tag}{i}"} for i in range(n)]


def texts(tokenizer, data) -> list[str]:
    return [tokenizer.decode(data.ids[data.offsets[i] : data.offsets[i + 1]]) for i in range(len(data))]


def source_of(text: str) -> str:
    return text.split("### Instruction:\n")[1].split(" ")[0]


@pytest.fixture
def files(tmp_path):
    return write_jsonl(tmp_path / "a.jsonl", rows("alpha", 40)), write_jsonl(tmp_path / "b.jsonl", rows("beta", 5))


def mixed(a, b, *overrides, wa=2, wb=1):
    cfg = load_config(
        None,
        [
            f"data.mix=[{{path: '{a}', weight: {wa}}}, {{path: '{b}', weight: {wb}}}]",
            "data.template=compact",
            "seq_len=64",
            *overrides,
        ],
    )
    return cfg.data_specs()[0]


def test_each_source_gives_its_weights_share_of_the_total(files, tokenizer):
    data = prepare(mixed(*files, "data.max_examples=30"), tokenizer)
    assert Counter(source_of(t) for t in texts(tokenizer, data)) == {"alpha": 20, "beta": 10}
    # Without max_examples the total is every source's examples: 45 split 2:1.
    data = prepare(mixed(*files), tokenizer)
    assert Counter(source_of(t) for t in texts(tokenizer, data)) == {"alpha": 30, "beta": 15}
    assert data.stats.rows == 45 and data.stats.examples == 45


def test_a_large_source_is_drawn_without_replacement_a_small_one_repeated_evenly(files, tokenizer):
    data = prepare(mixed(*files, "data.max_examples=30"), tokenizer)
    found = Counter(texts(tokenizer, data))
    alpha = [c for t, c in found.items() if source_of(t) == "alpha"]
    beta = [c for t, c in found.items() if source_of(t) == "beta"]
    assert alpha == [1] * 20  # 20 distinct of its 40
    assert sorted(beta) == [2] * 5  # 10 from 5: each twice
    data = prepare(mixed(*files, "data.max_examples=36", wa=1, wb=1), tokenizer)
    beta = sorted(c for t, c in Counter(texts(tokenizer, data)).items() if source_of(t) == "beta")
    assert beta == [3, 3, 4, 4, 4]  # 18 from 5: 3 each, and 3 of them once more


def test_the_same_seed_gives_the_same_mixture_another_seed_another(files, tokenizer):
    first = prepare(mixed(*files, "data.max_examples=30"), tokenizer)
    again = prepare(mixed(*files, "data.max_examples=30"), tokenizer)
    other = prepare(mixed(*files, "data.max_examples=30", "seed=7"), tokenizer)
    assert np.array_equal(first.ids, again.ids) and np.array_equal(first.targets, again.targets)
    assert set(texts(tokenizer, first)) != set(texts(tokenizer, other))


def test_a_source_keeps_its_own_format(tmp_path, files, tokenizer):
    completions = write_jsonl(tmp_path / "c.jsonl", [{"prompt": f"gamma {i} ", "completion": "ok"} for i in range(4)])
    cfg = load_config(
        None,
        [
            f"data.mix=[{{path: '{files[0]}'}}, {{path: '{completions}', format: completion}}]",
            "data.max_examples=8",
            "data.template=compact",
        ],
    )
    found = texts(tokenizer, prepare(cfg.data_specs()[0], tokenizer))
    assert sum(t.startswith("### Instruction:\nalpha") for t in found) == 4
    assert sum(t.startswith("gamma") for t in found) == 4


def test_a_held_out_split_is_taken_per_source_before_the_draw(files, tokenizer):
    spec = mixed(*files, "data.max_examples=30")
    train, held = prepare_split(spec, HeldOutSpec(fraction=0.2, seed=spec.seed), tokenizer)
    held_texts = texts(tokenizer, held)
    assert Counter(source_of(t) for t in held_texts) == {"alpha": 8, "beta": 1}
    assert not set(held_texts) & set(texts(tokenizer, train))  # repeats of beta stay on the training side
    assert len(train) == 30


def test_a_mixture_of_a_file_and_a_hub_dataset_through_plan(files, tiny_model_dir, hub_cache, capsys, monkeypatch):
    def fake(path, name=None, split=None, **kwargs):
        if path == "owner/set":
            return datasets.Dataset.from_list(rows("delta", 10))
        return REAL_LOAD(path, name, split=split, **kwargs)

    monkeypatch.setattr(datasets, "load_dataset", fake)
    mix = f"data.mix=[{{path: '{files[0]}', weight: 3}}, {{path: 'hf://owner/set', weight: 1}}]"
    argv = ["plan", f"--model={tiny_model_dir}", mix, "data.max_examples=20", "data.template=compact", "seq_len=64"]
    argv.append("--json")
    assert main(argv) == 0
    out = capsys.readouterr()
    result = json.loads(out.out.splitlines()[0])
    assert result["examples"] == 20
    assert f"mix of {files[0]} (weight 3), hf://owner/set (weight 1)" in json.dumps(result)


def test_a_mixture_part_takes_template_alpaca_with_any_format_as_the_top_level_does():
    cfg = load_config(None, ["data.mix=[{path: a.jsonl, format: chat, template: alpaca}]"])
    assert load_config(None, ["data.format=chat", "data.template=alpaca", "data.path=a.jsonl"]).data.format == "chat"
    assert cfg.data.mix[0].template == "alpaca"


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            ["data.path=a.jsonl", "data.mix=[{path: b.jsonl}]"],
            "data.path and data.mix are exclusive; train on one source or list them all under data.mix",
        ),
        (["data.mix=[{weight: 2}]"], "data.mix[0].path is missing; each source needs a file or hf://owner/name"),
        (["data.mix=[{path: a.jsonl}, {path: b.jsonl, weight: 0}]"], "data.mix[1].weight must be positive, got 0"),
        (["data.mix=[{path: a.jsonl, pth: b}]"], "unknown key 'data.mix[0].pth'; did you mean 'data.mix[0].path'?"),
        (["data.mix=[{path: a.jsonl, format: chatt}]"], "data.mix[0].format must be one of"),
        (
            ["data.mix=[{path: a.jsonl, format: text, template: bare}]"],
            "data.mix[0].template applies to the alpaca format only; drop it for 'text'",
        ),
        (["data.mix=[{path: 'hf://owner'}]"], "data.mix[0].path 'hf://owner': expected hf://owner/name"),
        (["data.mix=a.jsonl"], "data.mix must be a list of mappings, got 'a.jsonl'"),
    ],
    ids=["both", "no-path", "zero-weight", "unknown-key", "format", "template", "hub-form", "not-a-list"],
)
def test_the_config_refuses_a_bad_mixture_in_one_line(overrides, message):
    with pytest.raises(TunelabError) as e:
        load_config(None, overrides)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_a_source_too_light_for_one_example_is_named(files, tokenizer):
    with pytest.raises(TunelabError, match=r"data.mix: .*b.jsonl gets 0 examples at weight 1 of 10; raise its weight"):
        prepare(mixed(*files, "data.max_examples=10", wa=100, wb=1), tokenizer)
