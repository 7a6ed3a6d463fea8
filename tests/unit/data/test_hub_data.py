"""Hub datasets (`hf://owner/name[/subset][:split]`): loaded with `datasets.load_dataset`, through the same formats
and tokenization cache as files, and one line for every way loading can fail. `load_dataset` is replaced: no
test reaches the network."""

from __future__ import annotations

import datasets
import numpy as np
import pytest
from conftest import hub_http_library, write_jsonl
from datasets.exceptions import DatasetNotFoundError
from huggingface_hub import errors as hf

from tunelab import hub
from tunelab.cli import main
from tunelab.config import load_config
from tunelab.data import read, tokenize
from tunelab.data.pipeline import DataSpec, prepare
from tunelab.errors import TunelabError

http = hub_http_library()

ROWS = [{"instruction": f"{i} + 1", "output": str(i + 1)} for i in range(12)]
REAL_LOAD = datasets.load_dataset


class FakeLoad:
    """datasets.load_dataset over in-memory splits: records each call's (path, name, split)."""

    def __init__(self, splits: dict[str, list[dict]]):
        self.splits = splits
        self.calls = []
        self.revisions = []

    def __call__(self, path, name=None, split=None, **kwargs):
        if path in read.READERS.values():  # a local file
            return REAL_LOAD(path, name, split=split, **kwargs)
        self.calls.append((path, name, split))
        self.revisions.append(kwargs.get("revision"))
        if split not in self.splits:
            raise ValueError(f'Unknown split "{split}". Should be one of {list(self.splits)}.')
        return datasets.Dataset.from_list(self.splits[split])


@pytest.fixture
def fake_load(hub_cache, monkeypatch) -> FakeLoad:
    fake = FakeLoad({"train": ROWS, "test": ROWS[:4]})
    monkeypatch.setattr(datasets, "load_dataset", fake)
    return fake


def spec(path: str, **kw) -> DataSpec:
    return DataSpec(path, kw.pop("format", "alpaca"), "compact", False, 64, **kw)


def read_source(s: DataSpec) -> read.Source:
    return read.read_source(s.path, s.format, s.max_examples, s.seq_len, s.key)


def test_a_hub_split_flows_through_the_formats_like_a_file(fake_load, tmp_path, tokenizer, capsys):
    from_hub = prepare(spec("hf://owner/set"), tokenizer)
    from_file = prepare(spec(str(write_jsonl(tmp_path / "d.jsonl", ROWS))), tokenizer)
    assert fake_load.calls == [("owner/set", None, "train")]
    assert np.array_equal(from_hub.ids, from_file.ids) and np.array_equal(from_hub.targets, from_file.targets)
    assert capsys.readouterr().err.splitlines() == [
        "loading hf://owner/set:train from the Hugging Face hub (downloaded once, then read from the datasets cache)"
    ]


def test_subset_split_and_max_examples_reach_load_dataset(fake_load, tokenizer):
    data = prepare(spec("hf://owner/set/sub:test", max_examples=3), tokenizer)
    assert fake_load.calls == [("owner/set", "sub", "test")]
    assert data.stats.rows == 3


def test_the_cache_key_holds_repo_subset_split_and_the_datasets_fingerprint(fake_load, tokenizer):
    rows, label, identity = read_source(spec("hf://owner/set/sub:test"))
    assert label == "hf://owner/set/sub:test"
    assert identity == ["hf", "owner/set", "sub", "test", rows._fingerprint]
    keys = {
        tokenize.fingerprint(read_source(spec(p))[2], spec(p), tokenizer)
        for p in ("hf://owner/set:train", "hf://owner/set:test", "hf://owner/other:train", "hf://owner/set/x:train")
    }
    assert len(keys) == 4
    before = read_source(spec("hf://owner/set"))[2]
    fake_load.splits["train"] = ROWS[::-1]  # a new revision: other content, another datasets fingerprint
    after = read_source(spec("hf://owner/set"))[2]
    assert before[:4] == after[:4] and before[4] != after[4]


def test_a_cached_hub_split_is_tokenized_once(hub_cache, tmp_path, tokenizer, monkeypatch):
    """A split datasets keeps on disk (as a downloaded one is): the tokenized copy is cached beside it."""
    data_file = write_jsonl(tmp_path / "d.jsonl", ROWS)
    on_disk = REAL_LOAD("json", data_files=str(data_file), split="train", cache_dir=str(tmp_path / "ds"))
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: on_disk)
    first = prepare(spec("hf://owner/set"), tokenizer)
    files = sorted(p.name for p in (tmp_path / "ds").rglob("cache-*.arrow"))
    second = prepare(spec("hf://owner/set"), tokenizer)
    assert np.array_equal(first.ids, second.ids)
    assert len(files) == 1 and sorted(p.name for p in (tmp_path / "ds").rglob("cache-*.arrow")) == files


def test_columns_that_do_not_fit_the_format_fail_before_any_row(fake_load, tokenizer):
    fake_load.splits["train"] = [{"question": "q", "answer": "a"}]
    with pytest.raises(TunelabError) as e:
        prepare(spec("hf://owner/set"), tokenizer)
    assert str(e.value) == (
        "hf://owner/set:train: no column 'instruction', 'output' for format 'alpaca' (it needs instruction, output; "
        "the dataset has question, answer); set data.format to match, or rename the columns in a local copy"
    )


@pytest.mark.parametrize(
    "path",
    [
        "hf://owner",
        "hf://owner/",
        "hf://a/b/c/d",
        "hf://owner/set:",
        "hf:///set",
        "hf://own er/set",
        "hf://owner/set@",
        "hf://owner/set@:test",
        "hf://owner/set@v1@v2",
        "hf://owner/set@v 1",
        "hf://owner@v1/set",
        "hf://owner/set/sub@v1:test",
        "hf://owner/set@v1/",
        "hf://owner/set@refs/convert/parquet",
    ],
)
def test_a_malformed_hub_path_fails_in_the_config(path):
    with pytest.raises(TunelabError) as e:
        load_config(None, [f"data.path='{path}'"])
    assert str(e.value) == (
        f"override data.path='{path}': data.path {path!r}: expected hf://owner/name, hf://owner/name:split or "
        "hf://owner/name/subset:split, with owner/name@revision to pin a branch, tag or commit"
    )


def test_parse_data_forms():
    assert hub.parse_data("hf://o/n") == hub.HubData("o/n", None, "train")
    assert hub.parse_data("hf://o/n:test") == hub.HubData("o/n", None, "test")
    assert hub.parse_data("hf://o/n/sub:validation") == hub.HubData("o/n", "sub", "validation")
    assert hub.parse_data("hf://o/n:train[:100]").split == "train[:100]"
    assert hub.parse_data("hf://o/n").revision is None


COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.mark.parametrize(
    "path, parsed",
    [
        ("hf://o/n@v1.0", hub.HubData("o/n", None, "train", "v1.0")),
        ("hf://o/n@dev:test", hub.HubData("o/n", None, "test", "dev")),
        (f"hf://o/n@{COMMIT}/sub:validation[:10]", hub.HubData("o/n", "sub", "validation[:10]", COMMIT)),
        ("hf://o/n@my-branch_2/sub", hub.HubData("o/n", "sub", "train", "my-branch_2")),
    ],
)
def test_a_revision_pins_the_dataset_and_shows_in_its_name(path, parsed):
    assert hub.parse_data(path) == parsed
    assert hub.parse_data(parsed.uri) == parsed  # the name errors give reads back as the same reference
    assert f"@{parsed.revision}" in parsed.uri


def test_the_revision_reaches_load_dataset(fake_load, tokenizer, capsys):
    prepare(spec("hf://owner/set@v2/sub:test"), tokenizer)
    prepare(spec("hf://owner/set:test"), tokenizer)
    assert fake_load.calls == [("owner/set", "sub", "test"), ("owner/set", None, "test")]
    assert fake_load.revisions == ["v2", None]  # unpinned: datasets' own default, the main branch
    assert "loading hf://owner/set@v2/sub:test from the Hugging Face hub" in capsys.readouterr().err
    with pytest.raises(TunelabError) as e:
        hub.load_data(hub.parse_data("hf://owner/set@v2:tset"))
    assert str(e.value) == "hf://owner/set@v2:tset: no split 'tset'; it has train, test (write hf://owner/set@v2:train)"


def test_an_unknown_revision_is_one_line_naming_it(hub_cache, monkeypatch):
    cause = hf.RevisionNotFoundError("404", response=http.Response(404, request=http.Request("GET", "https://hf.co")))
    error = DatasetNotFoundError("Revision 'v9' doesn't exist for dataset 'owner/set' on the Hub.")
    error.__cause__ = cause

    def raising(*args, **kwargs):
        raise error

    monkeypatch.setattr(datasets, "load_dataset", raising)
    with pytest.raises(TunelabError) as e:
        hub.load_data(hub.parse_data("hf://owner/set@v9:test"))
    assert str(e.value) == (
        "hf://owner/set@v9:test: revision 'v9' not found in owner/set; check the branch, tag or commit"
    )


def gated() -> Exception:
    cause = hf.GatedRepoError("403", response=http.Response(403, request=http.Request("GET", "https://hf.co")))
    error = DatasetNotFoundError("Dataset 'owner/set' is a gated dataset on the Hub.")
    error.__cause__ = cause
    return error


def not_found() -> Exception:
    cause = hf.RepositoryNotFoundError("404", response=http.Response(404, request=http.Request("GET", "https://hf.co")))
    error = DatasetNotFoundError("Dataset 'owner/set' doesn't exist on the Hub or cannot be accessed.")
    error.__cause__ = cause
    return error


PAGE = "https://huggingface.co/datasets/owner/set"


@pytest.mark.parametrize(
    "path, error, offline, message",
    [
        (
            "hf://owner/set",
            gated(),
            False,
            f"owner/set is gated; accept its license on {PAGE}, then log in (`hf auth login`) or set HF_TOKEN",
        ),
        (
            "hf://owner/set",
            not_found(),
            False,
            f"owner/set is not on the Hugging Face hub, or is private; check the id ({PAGE}), and for a private "
            "dataset log in (`hf auth login`) or set HF_TOKEN",
        ),
        (
            "hf://owner/set",
            ConnectionError("Couldn't reach 'owner/set' on the Hub (LocalEntryNotFoundError)"),
            True,
            "not in the local datasets cache, and downloads are off (HF_HUB_OFFLINE=1 or --offline); run once "
            "online to download it, or pass a local file",
        ),
        (
            "hf://owner/set",
            ConnectionError("Couldn't reach 'owner/set' on the Hub (ConnectError)"),
            False,
            "cannot reach the Hugging Face hub (Couldn't reach 'owner/set' on the Hub (ConnectError)); check the "
            "connection, or set HF_HUB_OFFLINE=1 to use a cached copy, or pass a local file",
        ),
        (
            "hf://owner/set:tset",
            ValueError("Unknown split \"tset\". Should be one of ['train', 'test']."),
            False,
            "no split 'tset'; it has train, test (write hf://owner/set:train)",
        ),
        (
            "hf://owner/set",
            ValueError(
                "Config name is missing.\nPlease pick one among the available configs: ['en', 'de']\n"
                "Example of usage:\n\t`load_dataset('owner/set', 'en')`"
            ),
            False,
            "the dataset has subsets en, de; name one, as in hf://owner/set/en:train",
        ),
        (
            "hf://owner/set/fr",
            ValueError("BuilderConfig 'fr' not found. Available: ['en', 'de']"),
            False,
            "no subset 'fr'; it has en, de",
        ),
    ],
    ids=["gated", "not-found", "offline", "network", "unknown-split", "subset-missing", "unknown-subset"],
)
def test_each_loading_failure_is_one_line_through_the_cli(
    path, error, offline, message, hub_cache, tiny_model_dir, tmp_path, capsys, monkeypatch
):
    def raising(*args, **kwargs):
        raise error

    monkeypatch.setattr(datasets, "load_dataset", raising)
    config = tmp_path / "c.yaml"
    config.write_text(
        f"model: {tiny_model_dir}\ndata: {{path: '{path}', template: compact}}\noutput_dir: {tmp_path / 'out'}\n"
        "seq_len: 64\nmicro_batch: 2\nprecision: fp32\n"
    )
    argv = ["train", "--config", str(config), "--quiet", *(["--offline"] if offline else [])]
    rc = main(argv)
    out = capsys.readouterr()
    uri = hub.parse_data(path).uri
    assert (rc, out.out) == (2, "")
    assert out.err.splitlines()[-1:] == [f"tunelab train: error: {uri}: {message}"]
    assert len(out.err.splitlines()) == (1 if offline else 2)  # online, the loading line comes first
    assert not (tmp_path / "out").exists()


def test_an_unreachable_hub_is_one_line_without_the_retry_chatter(
    hub_cache, tiny_model_dir, tmp_path, capfd, caplog, monkeypatch
):
    """As datasets fails with no network: huggingface_hub logs each retry (its handler writes to whatever stderr
    was when it was imported, so the records are counted with caplog), then datasets raises a ConnectionError
    whose context is its cache miss ("not cached in None")."""
    from huggingface_hub.utils import logging as hub_logging

    def unreachable(*args, **kwargs):
        log = hub_logging.get_logger("huggingface_hub.utils._http")
        log.warning("'[Errno -2] Name or service not known' thrown while requesting HEAD https://huggingface.co/x")
        log.warning("Retrying in 1s [Retry 1/5].")
        error = ConnectionError("Couldn't reach 'owner/set' on the Hub (LocalEntryNotFoundError)")
        error.__context__ = FileNotFoundError("Dataset owner/set is not cached in None")
        raise error

    monkeypatch.setattr(datasets, "load_dataset", unreachable)
    config = tmp_path / "c.yaml"
    config.write_text(
        f"model: {tiny_model_dir}\ndata: {{path: 'hf://owner/set'}}\noutput_dir: {tmp_path / 'out'}\nseq_len: 64\n"
    )
    rc = main(["train", "--config", str(config), "--quiet"])
    out, err = capfd.readouterr()
    assert (rc, out) == (2, "")
    assert [r.getMessage() for r in caplog.records if r.name.startswith("huggingface_hub")] == []
    assert err.splitlines() == [
        "loading hf://owner/set:train from the Hugging Face hub (downloaded once, then read from the datasets cache)",
        "tunelab train: error: hf://owner/set:train: cannot reach the Hugging Face hub (Couldn't reach 'owner/set' "
        "on the Hub (LocalEntryNotFoundError)); check the connection, or set HF_HUB_OFFLINE=1 to use a cached copy, "
        "or pass a local file",
    ]


def test_a_tools_config_naming_a_hub_dataset_is_counted_as_tunelabs_own(fake_load, tmp_path, capsys):
    """`plan --from` a TRL config (JSON) whose dataset_name is a hub id: read as hf://owner/set, loaded through the
    same path, and counted as a tunelab config naming that dataset counts it."""
    import json

    (tmp_path / "trl.json").write_text(
        json.dumps({"model_name_or_path": "Qwen/Qwen2.5-0.5B", "dataset_name": "owner/set"})
    )
    common = ["model=random:smollm2-135m", "--tokenizer", "embedded", "--gpu", "l4", "--json"]
    assert main(["plan", "--from", str(tmp_path / "trl.json"), *common]) == 0
    read_from = json.loads(capsys.readouterr().out.splitlines()[0])
    own = ["plan", "data.path=hf://owner/set", "seq_len=1024", "epochs=3", "packing=false", *common]
    assert main(own) == 0
    mine = json.loads(capsys.readouterr().out.splitlines()[0])
    assert fake_load.calls == [("owner/set", None, "train")] * 2
    assert read_from["tokens_total_nonpad"] == mine["tokens_total_nonpad"] > 0
