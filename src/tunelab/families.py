"""Which model families tunelab trains correctly, decided from the Hugging Face config alone, before any weights
load. Torch-free: `plan` asks too, so it never estimates a model that `train` would refuse.

tunelab runs its own attention (model/attention.py) and its own fused head and loss (train/loss.py) instead of
the model's forward, so every feature a family adds there must be honoured by tunelab or refused here. Honoured:
grouped-query attention, q/k norms and biases (inside the modules), sliding windows (`sliding_window`, per layer
through `layer_types`), Gemma-2's attention logit soft-capping and final logit soft-capping, Gemma's embedding
scaling (inside the decoder). Refused: the rest below, each in one line naming the config key.

Mixture-of-Experts families are rows of MOE_FAMILIES (data: which config keys hold the experts, top-k, the
expert and shared-expert widths, which layers are sparse), read by `moe_shape` into a `Moe` that plan's Arch
and the training side share. A row's `trains` says whether tunelab's training path honours it yet; MoE families
tunelab does not train are REFUSED_MOE rows, each refused in one line saying why.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import TunelabError

# Config keys that count a Mixture-of-Experts block's experts, by family: Mixtral / gpt-oss, Qwen2-MoE /
# Qwen3-MoE / OLMoE, DeepSeek, DBRX-style configs.
EXPERT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")
# Families whose LM head carries a bias (Phi-2, GPT-J), which the fused head+loss does not add.
HEAD_BIAS_TYPES = {"phi": "Phi-2", "gptj": "GPT-J"}
# Config keys that scale the logits after the LM head (Cohere multiplies, Granite divides).
LOGIT_SCALES = ("logit_scale", "logits_scaling")
# Attention implementations whose kernels have no logit soft-capping.
NO_SOFTCAP = ("sdpa",)
# Attention implementations that drop gpt-oss's attention sinks (transformers' SDPA ignores its s_aux).
NO_SINKS = ("sdpa",)


@dataclass(frozen=True)
class MoeFamily:
    """Where a family's config.json (transformers 5.25's configuration_<family>.py) keeps its MoE shape."""

    model_type: str
    name: str
    experts_key: str  # how many routed experts each sparse block holds
    expert_width_key: str  # each routed expert's FFN width (intermediate_size where experts replace the MLP)
    shared_width_key: str | None = None  # the always-on shared expert's FFN width (Qwen2-MoE)
    sparse_step_key: str | None = None  # every n-th layer is sparse (Qwen2/3-MoE's decoder_sparse_step)
    dense_layers_key: str | None = None  # layers kept dense (Qwen2/3-MoE's mlp_only_layers, intermediate_size wide)
    top_k_key: str = "num_experts_per_tok"
    aux_coef_key: str = "router_aux_loss_coef"  # the load-balancing loss's weight in the training loss
    shared_gate: bool = False  # a sigmoid(hidden -> 1) gate scales the shared expert (Qwen2-MoE)
    biases: bool = False  # the router and each expert's projections carry biases (gpt-oss)
    sinks: bool = False  # a learned per-head attention sink logit (gpt-oss)
    trains: bool = False  # tunelab's training path honours every feature of the family


MOE_FAMILIES = {
    row.model_type: row
    for row in (
        MoeFamily(
            "qwen3_moe",
            "Qwen3-MoE",
            "num_experts",
            "moe_intermediate_size",
            sparse_step_key="decoder_sparse_step",
            dense_layers_key="mlp_only_layers",
            trains=True,
        ),
        MoeFamily(
            "qwen2_moe",
            "Qwen2-MoE",
            "num_experts",
            "moe_intermediate_size",
            shared_width_key="shared_expert_intermediate_size",
            sparse_step_key="decoder_sparse_step",
            dense_layers_key="mlp_only_layers",
            shared_gate=True,
            trains=True,
        ),
        MoeFamily("mixtral", "Mixtral", "num_local_experts", "intermediate_size", trains=True),
        MoeFamily("olmoe", "OLMoE", "num_experts", "intermediate_size", trains=True),
        MoeFamily("gpt_oss", "gpt-oss", "num_local_experts", "intermediate_size", biases=True, sinks=True, trains=True),
    )
}
# MoE families tunelab neither trains nor plans, by model_type: what each adds that tunelab does not implement.
REFUSED_MOE = {
    "deepseek_v2": "DeepSeek-V2's multi-head latent attention (kv_lora_rank)",
    "deepseek_v3": "DeepSeek-V3's multi-head latent attention (kv_lora_rank) and grouped sigmoid routing",
    "deepseek_v32": "DeepSeek-V3.2's multi-head latent attention and sparse attention indexer",
    "glm4_moe": "GLM-4-MoE's grouped sigmoid routing with a score-correction bias (n_group, topk_group)",
    "dbrx": "DBRX's fused Wqkv projection and clip_qkv",
    "jamba": "Jamba's Mamba layers",
    "llama4": "Llama 4's vision tower and chunked attention",
    "llama4_text": "Llama 4's chunked attention and interleaved shared-expert blocks",
    "qwen3_next": "Qwen3-Next's gated DeltaNet linear attention",
    "qwen3_5_moe": "Qwen3.5-MoE's vision tower and linear-attention layers",
    "qwen3_5_moe_text": "Qwen3.5-MoE's gated DeltaNet linear-attention layers",
    "minimax": "MiniMax's lightning (linear) attention layers",
    "granitemoe": "Granite-MoE's embedding, residual, attention and logit multipliers",
    "granitemoeshared": "Granite-MoE's embedding, residual, attention and logit multipliers",
    "granitemoehybrid": "Granite-MoE-Hybrid's Mamba layers",
    "phimoe": "PhiMoE's sparsemixer routing",
    "jetmoe": "JetMoE's mixture of attention heads",
}


# Whether plan's FLOPs, memory and step time count experts (active vs total parameters) yet.
PLAN_COUNTS_EXPERTS = True


@dataclass(frozen=True)
class Moe:
    """A Mixture-of-Experts model's block shape, resolved from its config (or a catalog row)."""

    family: str  # MoeFamily.name
    experts: int  # routed experts per sparse layer
    top_k: int  # routed experts each token goes through
    expert_width: int  # each routed expert's gated-MLP width
    sparse_layers: tuple[int, ...]  # the decoder layers whose MLP is the MoE block (the others are dense)
    shared_width: int = 0  # the shared expert's gated-MLP width, 0 without one
    shared_gate: bool = False  # the shared expert's sigmoid gate (a hidden -> 1 projection)
    biases: bool = False  # router and expert biases (gpt-oss)
    aux_coef: float = 0.0  # router_aux_loss_coef


def experts(config) -> tuple[str, int] | None:
    """(config key, expert count) of a Mixture-of-Experts config, else None."""
    for key in EXPERT_KEYS:
        value = getattr(config, key, None)
        if isinstance(value, int) and value > 1:
            return key, value
    return None


def has_sinks(config) -> bool:
    """Whether `config`'s attention has per-head sink logits (gpt-oss), which the attention path must apply."""
    row = MOE_FAMILIES.get(getattr(config, "model_type", None))
    return row is not None and row.sinks


def eager_only(config) -> bool:
    """Whether transformers' SDPA cannot run `config`'s attention (soft-capping raises there, sinks are dropped),
    so that generation over padded prompts takes its eager implementation."""
    return has_sinks(config) or getattr(config, "attn_logit_softcapping", None) is not None


def moe_shape(config, ref: str) -> Moe | None:
    """The MoE shape of a config of a family in MOE_FAMILIES (None for a dense model); one line for a config
    whose top-k cannot be routed."""
    row = MOE_FAMILIES.get(getattr(config, "model_type", None))
    if row is None or experts(config) is None:
        return None
    count = int(getattr(config, row.experts_key))
    top_k = getattr(config, row.top_k_key, None)
    if not isinstance(top_k, int) or not 1 <= top_k <= count:
        raise TunelabError(
            f"model {ref}: {row.top_k_key}={top_k} in config.json, but a token is routed to between 1 and "
            f"{row.experts_key}={count} experts; fix the config"
        )
    layers = int(config.num_hidden_layers)
    step = int(getattr(config, row.sparse_step_key, 1) or 1) if row.sparse_step_key else 1
    dense = set(getattr(config, row.dense_layers_key, None) or ()) if row.dense_layers_key else set()
    # Qwen2MoeDecoderLayer's own test: sparse unless listed in mlp_only_layers, and every step-th layer.
    sparse = tuple(i for i in range(layers) if i not in dense and (i + 1) % step == 0)
    return Moe(
        family=row.name,
        experts=count,
        top_k=top_k,
        expert_width=int(getattr(config, row.expert_width_key)),
        sparse_layers=sparse,
        shared_width=int(getattr(config, row.shared_width_key, 0) or 0) if row.shared_width_key else 0,
        shared_gate=row.shared_gate,
        biases=row.biases,
        aux_coef=float(getattr(config, row.aux_coef_key, 0.0) or 0.0),
    )


def check_moe(config, ref: str, planning: bool) -> None:
    """Refuse, in one line, an MoE config of a family tunelab does not know, or (when training) does not train yet."""
    found = experts(config)
    if found is None:
        return
    key, count = found
    model_type = getattr(config, "model_type", "?")
    known = ", ".join(row.name for row in MOE_FAMILIES.values())
    if model_type in REFUSED_MOE:
        raise TunelabError(
            f"model {ref}: {model_type} is a Mixture-of-Experts model ({key}={count} in config.json) with "
            f"{REFUSED_MOE[model_type]}, which tunelab does not implement; the MoE families it knows: {known}"
        )
    row = MOE_FAMILIES.get(model_type)
    if row is None:
        raise TunelabError(
            f"model {ref}: {model_type} is a Mixture-of-Experts model ({key}={count} in config.json) of a family "
            f"tunelab does not know; the MoE families it knows: {known}"
        )
    moe_shape(config, ref)  # a top-k the experts cannot serve is refused by both
    if (planning and not PLAN_COUNTS_EXPERTS) or (not planning and not row.trains):
        raise TunelabError(
            f"model {ref}: {row.name} ({model_type}) is a Mixture-of-Experts model ({key}={count} in config.json); "
            f"tunelab reads its shape but does not {'plan' if planning else 'train'} it yet (issue 67); "
            "pick a dense model"
        )


def check(config, ref: str, attention: str | None = None, planning: bool = False) -> None:
    """Raise a one-line TunelabError naming the first feature of `config` that tunelab would get wrong (for
    `planning`, that plan would: an MoE family plan counts but train does not yet take passes)."""
    model_type = getattr(config, "model_type", "?")
    check_moe(config, ref, planning)
    if getattr(config, "vision_config", None) is not None:
        raise TunelabError(
            f"model {ref}: {model_type} is a vision-language model (config.json has vision_config); only text "
            "decoders are supported (for Gemma-3, a text-only Gemma3ForCausalLM checkpoint such as gemma-3-1b)"
        )
    if model_type in HEAD_BIAS_TYPES:
        raise TunelabError(
            f"model {ref}: {HEAD_BIAS_TYPES[model_type]} ({model_type}) has a bias on its LM head, which tunelab's "
            "fused loss does not add; this family is not supported"
        )
    for key in LOGIT_SCALES:
        value = getattr(config, key, None)
        if value is not None and value != 1:
            raise TunelabError(
                f"model {ref}: {model_type} scales its logits ({key}={value} in config.json), which tunelab's "
                "fused loss does not apply; this family is not supported"
            )
    if getattr(config, "use_bidirectional_attention", False):
        raise TunelabError(
            f"model {ref}: use_bidirectional_attention is set in config.json (an embedding model); "
            "tunelab trains causal language models only"
        )
    if has_sinks(config) and attention in NO_SINKS:
        raise TunelabError(
            f"model {ref}: attention={attention} drops {model_type}'s attention sinks (transformers' SDPA has "
            "none); use attention=auto, slots or flex"
        )
    softcap = getattr(config, "attn_logit_softcapping", None)
    if softcap is not None and attention in NO_SOFTCAP:
        raise TunelabError(
            f"model {ref}: attention={attention} has no attention logit soft-capping "
            f"(attn_logit_softcapping={softcap} in config.json); use attention=auto, slots or flex"
        )


def sliding_windows(config) -> set[int]:
    """The sliding-window widths some layer of `config` attends with (empty when none is set)."""
    window = getattr(config, "sliding_window", None)
    if not window:
        return set()
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None and "sliding_attention" not in layer_types:
        return set()
    return {int(window)}
