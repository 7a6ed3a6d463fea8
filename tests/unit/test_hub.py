"""Hub models: the local cache first, a download of only the files tunelab loads otherwise, `plan` never fetching
weights, and one line for every way the hub can fail. No test reaches the network: snapshot_download is replaced
by a fake that fills the cache layout from the tiny model, or raises."""

from __future__ import annotations

import fnmatch
import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import REPO, hub_http_library, write_jsonl
from huggingface_hub import errors as hf

from tunelab import hub, sources
from tunelab.cli import main
from tunelab.errors import TunelabError

http = hub_http_library()

REPO_ID = "owner/tiny"
COMMIT = "c0ffee" + "0" * 34
# What the hub repository holds: the tiny model's files plus the duplicates a download must leave behind.
DUPLICATES = ("pytorch_model.bin", "model.onnx", "tiny.Q4_0.gguf", "consolidated.safetensors", "flax_model.msgpack")


@dataclass
class Listed:
    filename: str
    file_size: int
    will_download: bool


class FakeHub:
    """snapshot_download over a repository made of `files` (name -> source path): what it was asked, what it wrote."""

    def __init__(self, files: dict[str, Path]):
        self.files = files
        self.calls: list[dict] = []

    def __call__(self, repo_id, *, revision="main", cache_dir=None, allow_patterns=None, dry_run=False, **kw):
        self.calls.append(dict(repo_id=repo_id, revision=revision, allow_patterns=allow_patterns, dry_run=dry_run))
        folder = Path(cache_dir) / f"models--{repo_id.replace('/', '--')}"
        snapshot = folder / "snapshots" / COMMIT
        chosen = [n for n in self.files if any(fnmatch.fnmatch(n, p) for p in allow_patterns)]
        if dry_run:
            return [Listed(n, self.files[n].stat().st_size, not (snapshot / n).exists()) for n in chosen]
        snapshot.mkdir(parents=True, exist_ok=True)
        for name in chosen:
            shutil.copy(self.files[name], snapshot / name)
        (folder / "refs").mkdir(exist_ok=True)
        (folder / "refs" / revision).write_text(COMMIT)
        return str(snapshot)

    def fetched(self) -> list[set[str]]:
        """Per real (not dry-run) call, the repository files its patterns let through."""
        return [
            {n for n in self.files if any(fnmatch.fnmatch(n, p) for p in c["allow_patterns"])}
            for c in self.calls
            if not c["dry_run"]
        ]


@pytest.fixture
def fake_hub(tiny_model_dir, tmp_path, monkeypatch) -> FakeHub:
    files = {p.name: p for p in tiny_model_dir.iterdir() if p.is_file()}
    for name in DUPLICATES:
        (tmp_path / name).write_bytes(b"duplicate weights")
        files[name] = tmp_path / name
    fake = FakeHub(files)
    monkeypatch.setattr("huggingface_hub.snapshot_download", fake)
    return fake


def raising(error: BaseException):
    def fake(*args, **kwargs):
        raise error

    return fake


def response(status: int) -> http.Response:
    return http.Response(status, request=http.Request("GET", f"https://huggingface.co/api/models/{REPO_ID}"))


def cache_snapshot(cache: Path, source: Path, names: list[str]) -> Path:
    """A cached snapshot as huggingface_hub lays it out: refs/main naming snapshots/<commit>/ with `names`."""
    folder = cache / f"models--{REPO_ID.replace('/', '--')}"
    snapshot = folder / "snapshots" / COMMIT
    snapshot.mkdir(parents=True)
    for name in names:
        shutil.copy(source / name, snapshot / name)
    (folder / "refs").mkdir()
    (folder / "refs" / "main").write_text(COMMIT)
    return snapshot


CONFIG_FILES = ["config.json", "tokenizer.json", "tokenizer_config.json"]


def run_cli(argv: list[str], capsys) -> tuple[int, str, str]:
    try:
        rc = main(argv)
    except SystemExit as e:
        rc = e.code
    out = capsys.readouterr()
    return rc, out.out, out.err


def train_argv(tmp_path: Path, model: str = REPO_ID, *extra: str) -> list[str]:
    data = write_jsonl(tmp_path / "d.jsonl", [{"instruction": f"{i} + 1", "output": str(i + 1)} for i in range(8)])
    config = tmp_path / "c.yaml"
    config.write_text(
        f"model: {model}\ndata: {{path: {data}, template: compact}}\noutput_dir: {tmp_path / 'out'}\n"
        "seq_len: 64\nmicro_batch: 2\nmax_steps: 1\nprecision: fp32\n"
    )
    return ["train", "--config", str(config), "--quiet", *extra]


def test_a_cached_snapshot_is_used_without_asking_the_hub(hub_cache, tiny_model_dir, monkeypatch):
    snapshot = cache_snapshot(hub_cache, tiny_model_dir, [*CONFIG_FILES, "model.safetensors"])
    monkeypatch.setattr("huggingface_hub.snapshot_download", raising(AssertionError("the hub was asked")))
    assert sources.resolve(REPO_ID).path == snapshot
    assert sources.resolve(REPO_ID, weights=False).path == snapshot


def test_a_download_fetches_config_tokenizer_and_safetensors_only(hub_cache, fake_hub, capsys):
    path = sources.resolve(REPO_ID).path
    assert path == hub_cache / "models--owner--tiny" / "snapshots" / COMMIT
    assert sorted(p.name for p in path.iterdir()) == sorted(
        n for n in fake_hub.files if n not in DUPLICATES
    )  # no .bin, .onnx, .gguf, msgpack, or mistral's consolidated copy
    assert {"model.safetensors", "config.json", "tokenizer.json", "generation_config.json"} <= {
        p.name for p in path.iterdir()
    }
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"downloading {REPO_ID} from the Hugging Face hub (")
    assert f"({len(list(path.iterdir()))} files, " in err[0]
    calls = len(fake_hub.calls)
    assert sources.resolve(REPO_ID).path == path  # now cached: the hub is not asked again
    assert len(fake_hub.calls) == calls and capsys.readouterr().err == ""


def test_plan_resolves_config_and_tokenizer_only_then_train_fetches_the_weights(hub_cache, fake_hub, capsys):
    path = sources.resolve(REPO_ID, weights=False).path
    assert not any(p.suffix == ".safetensors" for p in path.iterdir())
    assert all(not any(fnmatch.fnmatch("model.safetensors", p) for p in c["allow_patterns"]) for c in fake_hub.calls)
    assert "config and tokenizer only" in capsys.readouterr().err
    assert sources.resolve(REPO_ID, weights=False).path == path  # cached: no second request
    assert len(fake_hub.calls) == 2  # the dry run and the download
    # The config-only snapshot is not taken for a complete one: the weights come now.
    assert sources.resolve(REPO_ID).path == path
    assert (path / "model.safetensors").is_file()
    assert fake_hub.fetched()[-1] >= {"model.safetensors", "config.json"}


def test_a_sharded_snapshot_is_complete_only_with_every_shard(hub_cache, tiny_model_dir, fake_hub):
    snapshot = cache_snapshot(hub_cache, tiny_model_dir, CONFIG_FILES)
    index = {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}
    (snapshot / "model.safetensors.index.json").write_text(json.dumps(index))
    (snapshot / "model-00001-of-00002.safetensors").write_bytes(b"x")
    assert not hub.has_weights(snapshot)
    (snapshot / "model-00002-of-00002.safetensors").write_bytes(b"x")
    assert hub.has_weights(snapshot)
    assert sources.resolve(REPO_ID).path == snapshot and fake_hub.calls == []


def test_remote_code_fetches_the_python_files(hub_cache, fake_hub, tmp_path, capsys):
    (tmp_path / "modeling_tiny.py").write_text("")
    fake_hub.files["modeling_tiny.py"] = tmp_path / "modeling_tiny.py"
    path = sources.resolve(REPO_ID, trust_remote_code=True).path
    assert (path / "modeling_tiny.py").is_file()
    fake_hub.calls.clear()
    sources.resolve(f"{REPO_ID}@v2")
    assert {c["revision"] for c in fake_hub.calls} == {"v2"}
    assert "*.py" not in fake_hub.calls[-1]["allow_patterns"]


def test_plan_of_the_goat_config_reads_config_and_tokenizer_only_then_works_offline(
    hub_cache, fake_hub, tmp_path, addition_rows, capsys, monkeypatch
):
    data = write_jsonl(tmp_path / "goat.jsonl", addition_rows)
    argv = ["plan", "--config", str(REPO / "configs" / "goat-7b.yaml"), f"data.path={data}", "--json"]
    rc, out, err = run_cli(argv, capsys)
    assert rc == 0, err
    assert json.loads(out.splitlines()[0])["examples"] == len(addition_rows)
    assert {c["repo_id"] for c in fake_hub.calls} == {"huggyllama/llama-7b"}
    assert fake_hub.fetched() == [set(fake_hub.files) - {"model.safetensors", *DUPLICATES}]
    assert "tokenizer.json" in fake_hub.fetched()[0]
    assert err.splitlines()[0].startswith("downloading huggyllama/llama-7b from the Hugging Face hub")
    # Offline, from what the first plan cached: no request at all.
    monkeypatch.setattr("huggingface_hub.snapshot_download", raising(AssertionError("the hub was asked")))
    rc, out2, err = run_cli([*argv, "--offline"], capsys)
    assert rc == 0, err
    assert out2 == out


OFFLINE = (
    f"tunelab train: error: model {REPO_ID}: the Hugging Face cache ({{cache}}) {{held}}, and downloads are off "
    "(HF_HUB_OFFLINE=1 or --offline); run once online to download it, or pass a local model directory"
)


@pytest.mark.parametrize("how", ["env", "flag"])
def test_offline_without_a_cached_copy_fails_in_one_line(how, hub_cache, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("huggingface_hub.snapshot_download", raising(AssertionError("the hub was asked")))
    argv = train_argv(tmp_path)
    if how == "env":
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    else:
        argv.append("--offline")
    rc, out, err = run_cli(argv, capsys)
    assert (rc, out) == (2, "")
    assert err.splitlines() == [OFFLINE.format(cache=hub_cache, held="does not hold it")]
    assert not (tmp_path / "out").exists()


def test_offline_with_only_plans_files_cached_says_the_weights_are_missing(
    hub_cache, tiny_model_dir, tmp_path, capsys, monkeypatch
):
    cache_snapshot(hub_cache, tiny_model_dir, CONFIG_FILES)
    rc, _, err = run_cli(train_argv(tmp_path, REPO_ID, "--offline"), capsys)
    assert rc == 2
    assert err.splitlines() == [OFFLINE.format(cache=hub_cache, held="holds its config but not its weights")]


PAGE = f"https://huggingface.co/{REPO_ID}"
LOGIN = "log in (`hf auth login`) or set HF_TOKEN"


@pytest.mark.parametrize(
    "error, message",
    [
        (
            hf.GatedRepoError("403 gated", response=response(403)),
            f"{REPO_ID} is gated; accept its license on {PAGE}, then {LOGIN}",
        ),
        (
            hf.RepositoryNotFoundError("404 not found", response=response(404)),
            f"no such local directory, and {REPO_ID} is not on the Hugging Face hub, or is private; "
            f"check the id ({PAGE}), and for a private model {LOGIN}",
        ),
        (
            hf.HfHubHTTPError("401 unauthorized", response=response(401)),
            f"no such local directory, and {REPO_ID} is not on the Hugging Face hub, or is private; "
            f"check the id ({PAGE}), and for a private model {LOGIN}",
        ),
        (
            hf.RevisionNotFoundError("404 revision", response=response(404)),
            f"revision 'main' not found in {REPO_ID}; check the branch, tag or commit",
        ),
        (
            hf.DryRunError("cannot be accessed"),
            "cannot reach the Hugging Face hub (connection refused); check the connection, or set "
            "HF_HUB_OFFLINE=1 to use a cached copy, or pass a local directory",
        ),
        (
            hf.HfHubHTTPError("503 Service Unavailable", response=response(503)),
            "cannot reach the Hugging Face hub (503 Service Unavailable); check the connection, or set "
            "HF_HUB_OFFLINE=1 to use a cached copy, or pass a local directory",
        ),
    ],
    ids=["gated", "not-found", "unauthorized", "revision", "network", "server-error"],
)
def test_each_hub_failure_is_one_line_naming_the_repo_and_what_to_do(
    error, message, hub_cache, tmp_path, capsys, monkeypatch
):
    if isinstance(error, hf.DryRunError):  # how snapshot_download reports a refused connection
        error.__cause__ = http.ConnectError("connection refused")
    monkeypatch.setattr("huggingface_hub.snapshot_download", raising(error))
    rc, out, err = run_cli(train_argv(tmp_path), capsys)
    assert (rc, out) == (2, "")
    assert err.splitlines() == [f"tunelab train: error: model {REPO_ID}: {message}"]
    assert not (tmp_path / "out").exists()


def test_a_repository_without_safetensors_is_refused_before_downloading(hub_cache, fake_hub, capsys):
    del fake_hub.files["model.safetensors"]
    with pytest.raises(TunelabError, match="has no model.safetensors") as e:
        sources.resolve(REPO_ID)
    assert "\n" not in str(e.value)
    assert all(c["dry_run"] for c in fake_hub.calls)  # nothing fetched


@pytest.mark.parametrize("ref", ["owner", "a/b/c", "owner/na me", "owner/name@"])
def test_a_string_that_is_no_path_and_no_hub_id_says_what_model_takes(ref, hub_cache):
    with pytest.raises(TunelabError, match="not a local directory, a .gguf file, or a hub id"):
        sources.resolve(ref)


def test_a_cached_revision_resolves_through_its_ref_or_as_a_commit(hub_cache, tiny_model_dir, monkeypatch):
    snapshot = cache_snapshot(hub_cache, tiny_model_dir, [*CONFIG_FILES, "model.safetensors"])
    (snapshot.parents[1] / "refs" / "v1").write_text(COMMIT)
    monkeypatch.setattr("huggingface_hub.snapshot_download", raising(AssertionError("the hub was asked")))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert sources.resolve(f"{REPO_ID}@v1").path == snapshot
    assert sources.resolve(f"{REPO_ID}@{COMMIT}").path == snapshot  # a commit needs no ref
    for ref in (f"{REPO_ID}@v2", f"{REPO_ID}@{'f' * 40}", "owner/other", "owner/na--me"):  # the hub refuses `--`
        with pytest.raises(TunelabError, match="does not hold it, and downloads are off"):
            sources.resolve(ref)


def test_a_cached_snapshot_without_config_json_is_not_taken(hub_cache, tiny_model_dir, fake_hub, monkeypatch):
    snapshot = cache_snapshot(
        hub_cache, tiny_model_dir, ["tokenizer.json", "tokenizer_config.json", "model.safetensors"]
    )
    assert hub.cached_snapshot(REPO_ID, "main", hub_cache) is None
    assert hub.cached_snapshot(REPO_ID, COMMIT, hub_cache) is None
    assert sources.resolve(REPO_ID).path == snapshot and (snapshot / "config.json").is_file()  # downloaded
    assert [c["dry_run"] for c in fake_hub.calls] == [True, False]
    assert hub.cached_snapshot(REPO_ID, "main", hub_cache) == snapshot
