"""Which model families tunelab trains correctly, decided from the Hugging Face config alone, before any weights
load. Torch-free: `plan` asks too, so it never estimates a model that `train` would refuse.

tunelab runs its own attention (model/attention.py) and its own fused head and loss (train/loss.py) instead of
the model's forward, so every feature a family adds there must be honoured by tunelab or refused here. Honoured:
grouped-query attention, q/k norms and biases (inside the modules), sliding windows (`sliding_window`, per layer
through `layer_types`), Gemma-2's attention logit soft-capping and final logit soft-capping, Gemma's embedding
scaling (inside the decoder). Refused: the rest below, each in one line naming the config key.
"""

from __future__ import annotations

from .errors import TunelabError

# Config keys that count a Mixture-of-Experts block's experts, by family: Mixtral, Qwen2-MoE / Qwen3-MoE /
# OLMoE, DeepSeek, DBRX-style configs.
EXPERT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")
# Families whose LM head carries a bias (Phi-2, GPT-J), which the fused head+loss does not add.
HEAD_BIAS_TYPES = {"phi": "Phi-2", "gptj": "GPT-J"}
# Config keys that scale the logits after the LM head (Cohere multiplies, Granite divides).
LOGIT_SCALES = ("logit_scale", "logits_scaling")
# Attention implementations whose kernels have no logit soft-capping.
NO_SOFTCAP = ("sdpa",)


def experts(config) -> tuple[str, int] | None:
    """(config key, expert count) of a Mixture-of-Experts config, else None."""
    for key in EXPERT_KEYS:
        value = getattr(config, key, None)
        if isinstance(value, int) and value > 1:
            return key, value
    return None


def check(config, ref: str, attention: str | None = None) -> None:
    """Raise a one-line TunelabError naming the first feature of `config` that tunelab would get wrong."""
    model_type = getattr(config, "model_type", "?")
    moe = experts(config)
    if moe is not None:
        key, count = moe
        raise TunelabError(
            f"model {ref}: {model_type} is a Mixture-of-Experts model ({key}={count} in config.json); "
            "MoE is not supported (tunelab trains and plans dense decoders only); pick a dense model"
        )
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
