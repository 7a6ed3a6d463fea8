"""The Hugging Face hub: models (`owner/name`) and datasets (`hf://owner/name:split`), from the local cache or
downloaded, and every hub failure turned into one line that says what to do.

Torch-free, so that `tunelab plan` can fetch a model's config and tokenizer without the training stack.

A cached snapshot that holds what the caller needs is used as it is, without asking the hub whether `main`
moved: a run reads the files it read last time, and needs no network once they are there (pin a commit with
`owner/name@<commit>`, or delete the snapshot to take a newer one). Downloads are off when HF_HUB_OFFLINE (or
TRANSFORMERS_OFFLINE) is set, or for one run under `--offline`.
"""

from __future__ import annotations

import ast
import contextlib
import json
import os
import re
import socket
import sys
from dataclasses import dataclass
from pathlib import Path

from .errors import TunelabError

# One part of a hub id (owner, name): the hub's own character set.
_ID_PART = r"[A-Za-z0-9][A-Za-z0-9._-]*"
MODEL_REF = re.compile(rf"(?P<repo>{_ID_PART}/{_ID_PART})(?:@(?P<revision>[^\s@]+))?")
DATA_PREFIX = "hf://"
DATA_FORMS = (
    "hf://owner/name, hf://owner/name:split or hf://owner/name/subset:split, "
    "with owner/name@revision to pin a branch, tag or commit"
)
# A dataset revision: a branch, tag or commit, ending at the subset's `/` or the split's `:`.
_DATA_REVISION = r"[^\s@/:]+"
DEFAULT_SPLIT = "train"

# The files a model needs besides its weights. Tokenizers come as tokenizer.json / tokenizer_config.json,
# sentencepiece `*.model`, BPE vocab + merges or tiktoken files, and the chat template may sit beside them.
CONFIG_PATTERNS = (
    "config.json",
    "generation_config.json",
    "tokenizer*",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.*",
    "merges.txt",
    "*.model",
    "*.tiktoken",
    "chat_template*",
)
# Weights: safetensors only. Repositories often hold the same weights again as pytorch .bin, .pth, ONNX, GGUF,
# Flax or TF files, several times the download; safetensors is what transformers loads first, maps from disk,
# and cannot run code as a pickled .bin can. `consolidated*.safetensors` (mistral-inference's copy) is left out
# by naming transformers' own file names.
WEIGHT_PATTERNS = ("model.safetensors", "model-*.safetensors", "model.safetensors.index.json")
# A snapshot holds a tokenizer when one of these is there.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "spiece.model")
_TRUE = {"1", "ON", "YES", "TRUE"}


def offline() -> bool:
    """Whether downloads are off, read now (not when huggingface_hub was imported)."""
    value = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return value.upper() in _TRUE


def go_offline() -> None:
    """`--offline`: no download for the rest of this process, in tunelab and in the libraries it calls."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    _sync_libraries()


def _sync_libraries() -> None:
    """huggingface_hub and datasets read HF_HUB_OFFLINE once, on import; tell those already imported."""
    for name in ("huggingface_hub.constants", "datasets.config"):
        module = sys.modules.get(name)
        if module is not None:
            module.HF_HUB_OFFLINE = True


def cache_dir() -> Path:
    """The hub cache huggingface_hub would use, from the environment as it is now."""
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(var):
            return Path(os.path.expandvars(os.environ[var])).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.path.expandvars(os.environ["HF_HOME"])).expanduser() / "hub"
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def parse_model(ref: str) -> tuple[str, str]:
    """`owner/name` or `owner/name@revision` -> (repo id, revision)."""
    m = MODEL_REF.fullmatch(ref)
    if m is None:
        raise TunelabError(
            f"model {ref!r}: not a local directory, a .gguf file, or a hub id (owner/name or owner/name@revision); "
            "use `embedded` for the built-in SmolLM2-135M-Instruct"
        )
    return m["repo"], m["revision"] or "main"


def allow_patterns(weights: bool, code: bool = False) -> list[str]:
    """What a download fetches: config and tokenizer, the weights when asked, Python files for remote code."""
    return [*CONFIG_PATTERNS, *(WEIGHT_PATTERNS if weights else ()), *(("*.py",) if code else ())]


def cached_snapshot(repo: str, revision: str, cache: Path) -> Path | None:
    """The snapshot folder the cache holds for `revision` (a branch, tag or commit), if it has a config.json."""
    from huggingface_hub import try_to_load_from_cache
    from huggingface_hub.errors import HFValidationError

    try:
        config = try_to_load_from_cache(repo, "config.json", cache_dir=cache, revision=revision)
    except HFValidationError:  # an id the hub refuses (`a--b`) is in no cache; not cached, as before any request
        return None
    return Path(config).parent if isinstance(config, str) else None


def has_weights(snapshot: Path) -> bool:
    """Every safetensors file the model needs is there (each shard its index names)."""
    index = snapshot / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = set(json.loads(index.read_text())["weight_map"].values())
        except (ValueError, KeyError, TypeError, AttributeError):
            return False
        return bool(shards) and all((snapshot / s).is_file() for s in shards)
    return (snapshot / "model.safetensors").is_file()


def has_tokenizer(snapshot: Path) -> bool:
    return any((snapshot / name).is_file() for name in TOKENIZER_FILES)


def model_dir(ref: str, weights: bool = True, code: bool = False) -> Path:
    """A hub model's snapshot folder: cached, else downloaded; with its weights only when `weights`."""
    repo, revision = parse_model(ref)
    cache = cache_dir()
    snapshot = cached_snapshot(repo, revision, cache)
    if snapshot is not None and has_tokenizer(snapshot) and (not weights or has_weights(snapshot)):
        return snapshot
    if offline():
        if snapshot is not None and (not weights or has_weights(snapshot)):
            return snapshot  # whatever tokenizer it has; loading it says what is missing
        held = "holds its config but not its weights" if snapshot is not None else "does not hold it"
        raise TunelabError(
            f"model {ref}: the Hugging Face cache ({cache}) {held}, and downloads are off (HF_HUB_OFFLINE=1 or "
            "--offline); run once online to download it, or pass a local model directory"
        )
    return _download(ref, repo, revision, cache, weights, code)


def _download(ref: str, repo: str, revision: str, cache: Path, weights: bool, code: bool) -> Path:
    from huggingface_hub import snapshot_download

    kwargs = dict(revision=revision, cache_dir=cache, allow_patterns=allow_patterns(weights, code))
    try:
        listing = snapshot_download(repo, dry_run=True, **kwargs)
        names = [f.filename for f in listing]
        if "config.json" not in names:
            raise TunelabError(f"model {ref}: the repository has no config.json; it is not a transformers model")
        if weights and not any(n.endswith(".safetensors") for n in names):
            raise TunelabError(f"model {ref}: {NO_SAFETENSORS}")
        todo = [f for f in listing if f.will_download]
        if todo:
            size = sum(f.file_size or 0 for f in todo)
            what = "" if weights else ", config and tokenizer only"
            print(
                f"downloading {repo} from the Hugging Face hub ({len(todo)} files, {size / 1e9:.2f} GB{what}) "
                f"into {cache}",
                file=sys.stderr,
                flush=True,
            )
        with _progress_bars():
            path = Path(snapshot_download(repo, **kwargs))
    except TunelabError:
        raise
    except Exception as e:
        message = explain(f"model {ref}", repo, e, revision=revision, nowhere="no such local directory, and ")
        if message is None:
            raise
        raise TunelabError(message) from None
    if weights and not has_weights(path):
        raise TunelabError(f"model {ref}: {NO_SAFETENSORS}")
    return path


NO_SAFETENSORS = (
    "the repository has no model.safetensors (or its index and shards), the only weights tunelab downloads; "
    "download its weights yourself and pass the model directory (or a .gguf file)"
)


@contextlib.contextmanager
def _progress_bars():
    """huggingface_hub's download bars on a terminal, for the download only: the CLI keeps library bars off."""
    from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars

    restore = sys.stderr.isatty() and are_progress_bars_disabled()
    if restore:
        enable_progress_bars()
    try:
        yield
    finally:
        if restore:
            disable_progress_bars()


def _chain(e: BaseException) -> list[BaseException]:
    seen = []
    while e is not None and e not in seen:
        seen.append(e)
        e = e.__cause__ or e.__context__
    return seen


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0].rstrip(".")


def explain(
    what: str, repo: str, e: BaseException, kind: str = "model", revision: str | None = None, nowhere: str = ""
) -> str | None:
    """One line for a failed hub request (`what` names the config value), or None for an error that is no hub
    failure (a bug keeps its traceback). `nowhere` prefixes the not-found line (a model id may be a mistyped path)."""
    from huggingface_hub import errors as hf

    chain = _chain(e)
    page = f"https://huggingface.co/{'datasets/' if kind == 'dataset' else ''}{repo}"
    login = "log in (`hf auth login`) or set HF_TOKEN"

    def status(x) -> int | None:
        response = getattr(x, "response", None)
        return getattr(response, "status_code", None)

    if any(isinstance(x, hf.GatedRepoError) or re.search(r"\bgated\b", str(x)) for x in chain):
        return f"{what}: {repo} is gated; accept its license on {page}, then {login}"
    if any(isinstance(x, hf.RevisionNotFoundError) for x in chain):
        return f"{what}: revision {revision!r} not found in {repo}; check the branch, tag or commit"
    if any(isinstance(x, hf.RepositoryNotFoundError) or status(x) == 401 for x in chain):
        return (
            f"{what}: {nowhere}{repo} is not on the Hugging Face hub, or is private; check the id ({page}), "
            f"and for a private {kind} {login}"
        )
    if any(isinstance(x, hf.DisabledRepoError) for x in chain):
        return f"{what}: {repo} is disabled on the Hugging Face hub; use another {kind}"
    network = any(
        isinstance(x, (OSError, ConnectionError, TimeoutError)) or type(x).__module__.startswith("httpx") for x in chain
    )
    # The deepest connection error says what failed (a name lookup, a refusal); datasets chains a cache miss
    # below it ("not cached in None") that would hide it.
    cause = next(
        (
            x
            for x in reversed(chain)
            if isinstance(x, (ConnectionError, TimeoutError, socket.gaierror)) or type(x).__module__.startswith("httpx")
        ),
        chain[-1],
    )
    if any(isinstance(x, hf.OfflineModeIsEnabled) for x in chain) or (network and offline()):
        return (
            f"{what}: not in the local cache, and downloads are off (HF_HUB_OFFLINE=1 or --offline); "
            "run once online to download it"
        )
    if network:
        return (
            f"{what}: cannot reach the Hugging Face hub ({_first_line(cause)}); check the connection, or set "
            f"HF_HUB_OFFLINE=1 to use a cached copy, or pass a local {'file' if kind == 'dataset' else 'directory'}"
        )
    return None


@dataclass(frozen=True)
class HubData:
    """A hub dataset reference: `hf://owner/name[@revision][/subset][:split]`; the revision is a branch, tag or
    commit (default: the dataset's main branch), the split may slice, as in `train[:1000]`."""

    repo: str
    subset: str | None
    split: str
    revision: str | None = None

    @property
    def pinned(self) -> str:
        """`hf://owner/name[@revision]`: the dataset repository as the reference pins it."""
        return f"{DATA_PREFIX}{self.repo}" + (f"@{self.revision}" if self.revision else "")

    @property
    def uri(self) -> str:
        subset = f"/{self.subset}" if self.subset else ""
        return f"{self.pinned}{subset}:{self.split}"


def is_hub_data(path: str | None) -> bool:
    return isinstance(path, str) and path.startswith(DATA_PREFIX)


def parse_data(path: str, key: str = "data.path") -> HubData:
    rest, sep, split = path[len(DATA_PREFIX) :].partition(":")
    parts = rest.split("/")
    name, at, revision = parts[1].partition("@") if len(parts) > 1 else ("", "", "")
    ok = (
        len(parts) in (2, 3)
        and all(re.fullmatch(_ID_PART, p) for p in (parts[0], name))
        and (not at or re.fullmatch(_DATA_REVISION, revision))
        and all(parts)
        and (len(parts) == 2 or "@" not in parts[2])  # the revision pins the repository, so it follows its name
        and (not sep or split.strip())
    )
    if not ok:
        raise TunelabError(f"{key} {path!r}: expected {DATA_FORMS}")
    subset = parts[2] if len(parts) == 3 else None
    return HubData(f"{parts[0]}/{name}", subset, split or DEFAULT_SPLIT, revision or None)


def load_data(ref: HubData):
    """The split as a `datasets.Dataset`, from the datasets cache or downloaded."""
    import datasets

    if offline():
        _sync_libraries()
    else:
        print(
            f"loading {ref.uri} from the Hugging Face hub (downloaded once, then read from the datasets cache)",
            file=sys.stderr,
            flush=True,
        )
    try:
        ds = datasets.load_dataset(ref.repo, ref.subset, split=ref.split, revision=ref.revision)
    except Exception as e:
        message = _explain_data(ref, e)
        if message is None:
            raise
        raise TunelabError(message) from None
    datasets.disable_progress_bars()  # the download's bars stay; tokenizing is tunelab's to report
    if not isinstance(ds, datasets.Dataset):
        raise TunelabError(f"{ref.uri}: is not a single split; name one, as in {DATA_FORMS}")
    return ds


def _listed(message: str, after: str) -> list[str] | None:
    """The Python list literal that follows `after` in a datasets error message."""
    m = re.search(re.escape(after) + r"\s*(\[.*?\])", message)
    if m is None:
        return None
    try:
        return [str(x) for x in ast.literal_eval(m.group(1))]
    except (ValueError, SyntaxError):
        return None


def _explain_data(ref: HubData, e: BaseException) -> str | None:
    uri, text = ref.uri, str(e)
    base = ref.pinned
    splits = _listed(text, "Should be one of")
    if splits is not None and "Unknown split" in text:
        subset = f"/{ref.subset}" if ref.subset else ""
        return f"{uri}: no split {ref.split!r}; it has {', '.join(splits)} (write {base}{subset}:{splits[0]})"
    subsets = _listed(text, "available configs:")
    if subsets is not None:
        return f"{uri}: the dataset has subsets {', '.join(subsets)}; name one, as in {base}/{subsets[0]}:{ref.split}"
    subsets = _listed(text, "Available:")
    if subsets is not None and "not found" in text:
        return f"{uri}: no subset {ref.subset!r}; it has {', '.join(subsets)}"
    if isinstance(e, ConnectionError) and offline():
        return (
            f"{uri}: not in the local datasets cache, and downloads are off (HF_HUB_OFFLINE=1 or --offline); "
            "run once online to download it, or pass a local file"
        )
    message = explain(uri, ref.repo, e, kind="dataset", revision=ref.revision or "main")
    if message is not None:
        return message
    import datasets

    if isinstance(e, (datasets.exceptions.DatasetsError, ValueError)):
        return f"{uri}: cannot be loaded: {_first_line(e)}"
    return None
