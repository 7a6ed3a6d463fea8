"""Model architecture without weights: from the registry (catalog/models.yaml), `random:<id>` (a registry row
by its short id), a config.json directory, a .gguf file's metadata, or a hub id's config.json (cached or fetched).

Only the shapes matter to `plan`: the decoder blocks' linear layers (q/k/v/o attention projections and a
gated gate/up/down MLP, the Llama/Mistral/Qwen2/Gemma/SmolLM shape), the embedding and the LM head. A
Mixture-of-Experts model (families.Moe) replaces the MLP of its sparse layers with a router and `experts` gated
MLPs of `expert_width`, `top_k` of them per token, plus an always-on shared expert where the family has one:
its total parameters (memory) and active parameters (FLOPs) differ.
"""

from __future__ import annotations

import difflib
import struct
from dataclasses import dataclass
from pathlib import Path

from ..errors import TunelabError
from ..families import MOE_FAMILIES, Moe, moe_shape
from ..modelref import RANDOM
from . import catalog

# The embedded SmolLM2 tokenizer's size; a random model's embedding must hold every id it produces.
# A unit test compares it with the tokenizer itself, so plan can check it without loading one.
TOKENIZER_VOCAB = 49152
# The Hugging Face architecture a `random:` model of each catalog owner's rows is built as (the longest key
# prefix wins). Mistral builds as Llama: the same modules, and the sliding window the catalog does not record
# only matters past 4,096 tokens. Gemma-2/3 and Phi-3 are left out: their soft-capping, extra norms, window
# patterns and fused projections are not in the catalog.
FAMILIES = {
    "Qwen/Qwen3": "qwen3",
    "meta-llama": "llama",
    "huggyllama": "llama",
    "decapoda-research": "llama",
    "TinyLlama": "llama",
    "HuggingFaceTB": "llama",
    "mistralai": "llama",
    "Qwen": "qwen2",
}


@dataclass(frozen=True)
class Linear:
    """One kind of linear layer of the decoder blocks: its shape, how many the model holds (memory) and what share
    of a micro-batch's tokens each one multiplies (FLOPs): 1 for a dense module, top_k / experts for a routed
    expert under uniform routing."""

    name: str  # as lora.targets names it
    d_in: int
    d_out: int
    count: int  # instances in the model: layers x copies per layer
    share: float = 1.0  # fraction of the tokens each instance sees
    group: str = "attn"  # attn | mlp | expert | shared | router: which preset takes it

    @property
    def params(self) -> int:
        return self.count * self.d_in * self.d_out

    @property
    def active(self) -> float:
        """Instances a token goes through, over all layers: what one token's FLOPs count."""
        return self.count * self.share


@dataclass(frozen=True)
class Arch:
    name: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    max_positions: int
    tied: bool
    source: str
    # Final-logit soft-capping (Gemma-2's final_logit_softcapping): the loss keeps more per-chunk buffers.
    logit_softcap: float = 0.0
    # The Mixture-of-Experts shape; None for a dense model. `intermediate` is then the width of the dense layers'
    # MLP (Qwen-MoE's mlp_only_layers), unused where every layer is sparse.
    moe: Moe | None = None

    @property
    def sparse_layers(self) -> int:
        """How many decoder layers hold an MoE block instead of a dense MLP."""
        return len(self.moe.sparse_layers) if self.moe else 0

    def modules(self) -> tuple[Linear, ...]:
        """Every kind of linear layer in the decoder blocks. Dense: q/k/v/o and gate/up/down in every layer. An MoE
        model's sparse layers replace gate/up/down with the routed experts (transformers' stacked `gate_up_proj`
        and `down_proj`, each expert its own slice), the shared expert (Qwen2-MoE) and its gate, and the router."""
        h, q, kv, i = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim, self.intermediate
        n = self.layers
        out = [
            Linear("q_proj", h, q, n),
            Linear("k_proj", h, kv, n),
            Linear("v_proj", h, kv, n),
            Linear("o_proj", q, h, n),
        ]
        dense = n - self.sparse_layers
        if dense:
            out += [
                Linear("gate_proj", h, i, dense, group="mlp"),
                Linear("up_proj", h, i, dense, group="mlp"),
                Linear("down_proj", i, h, dense, group="mlp"),
            ]
        m, sparse = self.moe, self.sparse_layers
        if m is None or not sparse:
            return tuple(out)
        share, w = m.top_k / m.experts, m.expert_width
        out += [
            Linear("experts.gate_up_proj", h, 2 * w, sparse * m.experts, share, "expert"),
            Linear("experts.down_proj", w, h, sparse * m.experts, share, "expert"),
        ]
        if m.shared_width:
            s = m.shared_width
            out += [
                Linear("shared_expert.gate_proj", h, s, sparse, group="shared"),
                Linear("shared_expert.up_proj", h, s, sparse, group="shared"),
                Linear("shared_expert.down_proj", s, h, sparse, group="shared"),
            ]
        if m.shared_gate:
            out.append(Linear("shared_expert_gate", h, 1, sparse, group="router"))
        out.append(Linear("router", h, m.experts, sparse, group="router"))
        return tuple(out)

    def module(self, name: str) -> Linear:
        return next(m for m in self.modules() if m.name == name)

    def linears(self) -> dict[str, tuple[int, int]]:
        """(d_in, d_out) of each kind of linear layer, by the module names lora.targets takes."""
        return {m.name: (m.d_in, m.d_out) for m in self.modules()}

    @property
    def block_linear_params(self) -> int:
        """Every linear weight of the decoder blocks (all experts of an MoE model): what memory holds."""
        return sum(m.params for m in self.modules())

    @property
    def active_block_params(self) -> float:
        """The block weights one token's matmuls go through: an MoE block's top_k experts, shared expert and router."""
        return sum(m.active * m.d_in * m.d_out for m in self.modules())

    @property
    def matmul_params(self) -> float:
        """N of docs/formulas.md: every weight that takes part in a token's matmuls (an MoE model's active ones),
        the LM head included (the embedding lookup is a gather, not a matmul)."""
        return self.active_block_params + self.vocab * self.hidden

    @property
    def mlp_width(self) -> float:
        """The gated-MLP width one token passes through per layer, averaged over the layers: a dense model's
        intermediate size; an MoE layer's top_k expert widths plus its shared expert's."""
        m = self.moe
        sparse = m.top_k * m.expert_width + m.shared_width if m else 0
        return ((self.layers - self.sparse_layers) * self.intermediate + self.sparse_layers * sparse) / self.layers

    @property
    def embedding_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def norm_params(self) -> int:
        return (2 * self.layers + 1) * self.hidden  # two RMSNorms per block and the final one

    @property
    def moe_bias_params(self) -> int:
        """Router and expert biases (gpt-oss): vectors, counted in the total but never quantized."""
        if self.moe is None or not self.moe.biases:
            return 0
        m = self.moe
        return self.sparse_layers * (m.experts + m.experts * (2 * m.expert_width + self.hidden))

    @property
    def total_params(self) -> int:
        head = 0 if self.tied else self.vocab * self.hidden
        return self.block_linear_params + self.embedding_params + head + self.norm_params + self.moe_bias_params

    @property
    def active_params(self) -> float:
        """The parameters one token uses: total_params with an MoE block's unrouted experts (and their biases)
        left out."""
        unrouted = self.block_linear_params - self.active_block_params
        routed = self.moe.top_k / self.moe.experts if self.moe else 1.0
        return self.total_params - unrouted - self.moe_bias_params * (1 - routed)


# Which module groups (Linear.group) each preset adapts: an MoE model's MLP is its experts and shared expert; the
# router trains only when named.
PRESETS = {"attn": ("attn",), "mlp": ("mlp", "expert", "shared"), "all-linear": ("attn", "mlp", "expert", "shared")}


def adapter_targets(arch: Arch, targets: str | list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """Module names an adapter sits on; the presets and names mean what `tunelab.model.adapters` makes them mean: a
    listed name takes every module of that (leaf) name, `experts` every expert projection (`gate_up_proj` and
    `down_proj` also the experts' own); the routers and the shared-expert gate are never adapted (lora.router
    trains the routers whole)."""
    adaptable = [m for m in arch.modules() if m.group != "router"]
    if isinstance(targets, str):
        return tuple(m.name for m in adaptable if m.group in PRESETS[targets])

    def takes(m: Linear, t: str) -> bool:
        return t in (m.name, m.name.rsplit(".", 1)[-1]) or (t == "experts" and m.group == "expert")

    bad = [t for t in targets if not any(takes(m, t) for m in adaptable)]
    if bad:
        known = dict.fromkeys(m.name.rsplit(".", 1)[-1] for m in adaptable)
        experts = " (or experts for all the experts')" if arch.moe else ""
        raise TunelabError(
            f"lora.targets: {', '.join(bad)} not found in the model; "
            f"its linear layers are {', '.join(known)}{experts} (or use attn, mlp, all-linear)"
        )
    return tuple(m.name for m in adaptable if any(takes(m, t) for t in targets))


def registry_names() -> list[str]:
    data = catalog.read("models.yaml")
    return sorted(data["models"]) + sorted(data["aliases"])


def from_registry(ref: str) -> Arch | None:
    """A catalog model by its key, an alias, or (plan needs no weights, so no hub id is needed) its short id
    as `random:` takes it, e.g. llama-3.1-8b, unless a local path has that name; the Arch is named by the
    full key."""
    data = catalog.read("models.yaml")
    name = ref
    if "/" not in ref and ref not in data["aliases"] and not Path(ref).expanduser().exists():  # a local dir wins
        name = next((n for n in [*data["models"], *data["aliases"]] if short_id(n) == ref.lower()), ref)
    key = data["aliases"].get(name, name)
    row = data["models"].get(key)
    if row is None:
        return None
    return Arch(
        name=name,
        hidden=row["hidden"],
        layers=row["layers"],
        heads=row["heads"],
        kv_heads=row["kv_heads"],
        head_dim=row.get("head_dim", row["hidden"] // row["heads"]),
        intermediate=row["intermediate"],
        vocab=row["vocab"],
        max_positions=row["max_positions"],
        tied=row["tied"],
        source=f"registry: {row['source']}",
        logit_softcap=float(row.get("logit_softcap", 0.0)),
        moe=registry_moe(row, key),
    )


def registry_moe(row: dict, key: str) -> Moe | None:
    """A catalog row's `moe:` mapping as a Moe (its family's row says what the family adds): every layer sparse
    except its `dense_layers`."""
    m = row.get("moe")
    if m is None:
        return None
    family = MOE_FAMILIES.get(m["family"])
    if family is None:
        raise TunelabError(f"models.yaml: {key}: moe.family {m['family']!r} is none of {', '.join(MOE_FAMILIES)}")
    if not 1 <= m["top_k"] <= m["experts"]:
        raise TunelabError(
            f"models.yaml: {key}: moe.top_k={m['top_k']} must be between 1 and moe.experts={m['experts']}"
        )
    dense = set(m.get("dense_layers", ()))
    return Moe(
        family=family.name,
        experts=m["experts"],
        top_k=m["top_k"],
        expert_width=m["expert_width"],
        sparse_layers=tuple(i for i in range(row["layers"]) if i not in dense),
        shared_width=m.get("shared_width", 0),
        shared_gate=family.shared_gate,
        biases=family.biases,
        aux_coef=float(m.get("aux_coef", 0.0)),
    )


def short_id(key: str) -> str:
    """A catalog key's id after `random:`: its last path component, lowercased (meta-llama/Llama-3.1-8B -> llama-3.1-8b)."""
    return key.rsplit("/", 1)[-1].lower()


def random_key(ref: str) -> str:
    """The catalog key (or alias) that `random:<id>` names; the full key works too, in any case."""
    wanted = ref.removeprefix(RANDOM).lower()
    data = catalog.read("models.yaml")
    names = [*data["models"], *data["aliases"]]
    for name in names:
        if wanted in (short_id(name), name.lower()):
            return name
    close = difflib.get_close_matches(wanted, sorted(short_id(n) for n in names), n=3)
    hint = (
        f"did you mean {', '.join(RANDOM + c for c in close)}?"
        if close
        else f"known: {', '.join(RANDOM + short_id(n) for n in names)}"
    )
    raise TunelabError(f"model {ref!r}: no catalog model has that id; {hint}")


def random_family(ref: str, key: str) -> str:
    """The FAMILIES entry of catalog key `key`, or an error naming the family random weights cannot build."""
    data = catalog.read("models.yaml")
    moe = data["models"][data["aliases"].get(key, key)].get("moe")
    if moe is not None:  # an MoE row names its family's model_type (families.MOE_FAMILIES)
        return moe["family"]
    prefixes = [p for p in FAMILIES if key.startswith(p if "/" in p else p + "/")]
    family = FAMILIES[max(prefixes, key=len)] if prefixes else None
    if family is None:
        raise TunelabError(
            f"model {ref}: {key}'s family cannot be built faithfully from the catalog's fields; "
            f"pick a Llama, Qwen2, Qwen3, SmolLM2 or Mixture-of-Experts row"
        )
    return family


def random_arch(ref: str) -> Arch:
    """The catalog shape behind `random:<id>`, named by its catalog key so plan reads it as the real model."""
    key = random_key(ref)
    random_family(ref, key)
    arch = from_registry(key)
    if arch.vocab < TOKENIZER_VOCAB:
        raise TunelabError(
            f"model {ref}: its vocabulary ({arch.vocab:,}) is smaller than the embedded SmolLM2 tokenizer's "
            f"({TOKENIZER_VOCAB:,}), whose ids would fall outside the embedding; pick a catalog model with a larger vocabulary"
        )
    return arch


def from_hf_config(name: str, cfg, source: str, written: set[str] | None = None) -> Arch:
    """From a transformers PretrainedConfig (read from config.json or GGUF metadata). `written`: the keys the
    config.json file itself holds, where there is one: a config class fills a key the file omits with its own
    default (LlamaConfig's are a 7B's), which would describe some other model."""
    need = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size")
    aliases = getattr(cfg, "attribute_map", {}) or {}

    def given(key: str) -> bool:
        if written is None:
            return getattr(cfg, key, None) is not None
        return key in written or any(alias in written for alias, canonical in aliases.items() if canonical == key)

    missing = [k for k in need if not given(k)]
    if missing:
        raise TunelabError(
            f"model {name}: its config lacks {', '.join(missing)}; plan supports Llama-shaped decoders (Llama, Mistral, Qwen2, Gemma, SmolLM)"
        )
    heads = cfg.num_attention_heads
    return Arch(
        name=name,
        hidden=cfg.hidden_size,
        layers=cfg.num_hidden_layers,
        heads=heads,
        kv_heads=getattr(cfg, "num_key_value_heads", None) or heads,
        head_dim=getattr(cfg, "head_dim", None) or cfg.hidden_size // heads,
        intermediate=cfg.intermediate_size,
        vocab=cfg.vocab_size,
        max_positions=getattr(cfg, "max_position_embeddings", None) or 0,
        tied=bool(getattr(cfg, "tie_word_embeddings", False)),
        source=source,
        logit_softcap=float(getattr(cfg, "final_logit_softcapping", None) or 0.0),
        moe=moe_shape(cfg, name),
    )


# GGUF's value types (gguf-py's GGUFValueType) with a fixed size, as struct formats; 8 is a string, 9 an array.
GGUF_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}


class _Cursor:
    """Reads GGUF values (little-endian) from a buffer, front to back."""

    def __init__(self, buf):
        self.buf, self.pos = buf, 0

    def read(self, fmt: str):
        if self.pos + struct.calcsize(fmt) > len(self.buf):
            raise ValueError("the file ends inside its header; it is truncated")
        (v,) = struct.unpack_from("<" + fmt, self.buf, self.pos)
        self.pos += struct.calcsize(fmt)
        return v

    def string(self) -> str:
        n = self.read("Q")
        if self.pos + n > len(self.buf):
            raise ValueError("a string runs past the end of the file; it is truncated")
        self.pos += n
        return self.buf[self.pos - n : self.pos].decode("utf-8", errors="replace")

    def value(self, kind: int):
        """A value of type `kind`; an array as its length (its elements skipped)."""
        if kind in GGUF_SCALARS:
            return self.read(GGUF_SCALARS[kind])
        if kind == 8:
            return self.string()
        if kind != 9:
            raise ValueError(f"unknown value type {kind}")
        item, count = self.read("I"), self.read("Q")
        if item in GGUF_SCALARS:
            self.pos += count * struct.calcsize(GGUF_SCALARS[item])
        else:
            for _ in range(count):
                self.value(item)
        return count


def gguf_header(path: Path) -> tuple[dict, list[str]]:
    """A GGUF file's key-values and tensor names, read from its header (little-endian, version 2 or 3); an array
    is given as its length. gguf's GGUFReader builds every element of every array first: the embedded model's
    tokenizer (49k tokens, 48k merges) made that ~4 s, where plan needs a few numbers and a count."""
    import mmap

    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        at = _Cursor(buf)
        if at.read("4s") != b"GGUF" or at.read("I") not in (2, 3):
            raise ValueError("not GGUF version 2 or 3 (little-endian)")
        n_tensors, n_fields = at.read("Q"), at.read("Q")
        fields = {}
        for _ in range(n_fields):
            key = at.string()
            if key in fields:
                raise ValueError(f"the key {key} appears twice")
            fields[key] = at.value(at.read("I"))
        names, offsets = [], [0]
        for _ in range(n_tensors):
            names.append(at.string())
            dims = at.read("I")  # (read before the += below: it moves pos)
            at.pos += 8 * dims + 4  # its dimensions and type
            offsets.append(at.read("Q"))
        # The tensor data starts at the next multiple of the alignment; a file cut inside it (a partial download)
        # ends before the last tensor's offset.
        alignment = fields.get("general.alignment", 32)
        if -(-at.pos // alignment) * alignment + max(offsets) > len(buf):
            raise ValueError("the file ends before its tensor data does; it is truncated")
    return fields, names


def from_gguf(name: str, path: Path) -> Arch:
    """From GGUF metadata (llama.cpp key names), read from the header: tensors are never read."""
    try:
        fields, tensors = gguf_header(path)
    except Exception as e:
        raise TunelabError(
            f"model {name}: {path} is not a readable GGUF file: {e}; download it again, or name a model directory"
        ) from None

    def value(key: str, default=None):
        return fields.get(key, default)

    arch = value("general.architecture")
    experts = value(f"{arch}.expert_count")
    if experts and experts > 1:
        raise TunelabError(
            f"model {name}: {arch} is a Mixture-of-Experts model ({arch}.expert_count={experts} in the GGUF "
            "metadata); plan reads an MoE model's shape from its config.json or the model catalog, not from GGUF; "
            "name its directory, hub id or catalog id"
        )
    if value(f"{arch}.block_count") is None or value(f"{arch}.feed_forward_length") is None:
        raise TunelabError(f"model {name}: GGUF architecture {arch!r} is not a Llama-shaped decoder plan can describe")
    hidden, heads = value(f"{arch}.embedding_length"), value(f"{arch}.attention.head_count")
    vocab = value(f"{arch}.vocab_size") or value("tokenizer.ggml.tokens")  # an array: its length
    return Arch(
        name=name,
        hidden=hidden,
        layers=value(f"{arch}.block_count"),
        heads=heads,
        kv_heads=value(f"{arch}.attention.head_count_kv", heads),
        head_dim=value(f"{arch}.attention.key_length", hidden // heads),
        intermediate=value(f"{arch}.feed_forward_length"),
        vocab=vocab,
        max_positions=value(f"{arch}.context_length", 0),
        # llama.cpp stores no separate `output.weight` when the LM head shares the embedding.
        tied="output.weight" not in tensors,
        source=f"{path} (GGUF metadata)",
        logit_softcap=float(value(f"{arch}.final_logit_softcapping", 0.0) or 0.0),
    )
