"""The fine-tuning methods, one row each: what trains, the base's quantization, what is saved, the extra trainable
tensors, and the memory terms plan reads. Config validation, plan, the recipe, the adapters and export ask this
registry instead of comparing method names, so a new method is one new row here plus the code that is its own.
Torch-free and import-free: config and plan read it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Method:
    name: str
    # Every weight trains (fp32 master weights, so the residual stream is fp32 too); otherwise a LoRA-style
    # adapter trains over a frozen base.
    trains_base: bool = False
    # The base quantization the method implies whatever `base_quant` says (qlora: nf4); None: `base_quant` as given.
    base_quant: str | None = None
    # `base_quant` values the method cannot train with, and the one-line reason (without the file prefix).
    refused_base_quants: tuple[str, ...] = ()
    refusal: str = ""
    # DoRA: a trained fp32 magnitude per output feature of each adapted matrix, and peft's layer keeps the base
    # and adapter products (two d_out-wide tensors per adapted matrix and token) for its gradient.
    magnitude: bool = False
    # The method that trains the same adapter over a quantized base: what to try when this one does not fit.
    quantized: str | None = None
    # The name a run of this method over a quantized base is measured and calibrated under (base_quant -> key);
    # over an unquantized base, or one not listed, the method's own name.
    quant_keys: tuple[tuple[str, str], ...] = ()

    @property
    def saves(self) -> str:
        """The output folder of the final save: `model/` (HF format) or `adapter/` (PEFT format)."""
        return "model" if self.trains_base else "adapter"

    def key(self, base_quant: str) -> str:
        """The name plan's calibration records and fitted constants file a run under: the method and the base it
        trains over. LoRA over an nf4 base is QLoRA whatever the config calls it; DoRA over a quantized base
        pays for the quantization as LoRA does (`dora-nf4`)."""
        return dict(self.quant_keys).get(base_quant, self.name)

    @property
    def adapter(self) -> bool:
        return not self.trains_base

    @property
    def reference(self) -> str:
        """The reference model under this method (DPO's, GRPO's KL term; objectives.Objective.frozen_copy): an
        adapter's is its base with the adapter disabled (no second copy of the weights); full fine-tuning keeps a
        frozen copy of the starting weights (train/loss.CausalLMLoss.keep_reference)."""
        return "frozen-copy" if self.trains_base else "adapter-disabled"


REGISTRY: dict[str, Method] = {
    m.name: m
    for m in (
        Method("lora", quantized="qlora", quant_keys=(("nf4", "qlora"), ("int8", "lora-int8"))),
        Method("dora", magnitude=True, quantized="qlora", quant_keys=(("nf4", "dora-nf4"), ("int8", "dora-int8"))),
        Method(
            "qlora",
            base_quant="nf4",
            refused_base_quants=("int8",),
            refusal="method qlora quantizes the base to nf4; drop base_quant: int8 or use method lora",
        ),
        Method(
            "full",
            trains_base=True,
            refused_base_quants=("int8", "nf4"),
            refusal="full fine-tuning trains every weight; a quantized base (base_quant) cannot be trained",
        ),
    )
}
NAMES = tuple(REGISTRY)


def get(name: str) -> Method:
    return REGISTRY[name]


def effective_base_quant(method: str, base_quant: str) -> str:
    """The base's quantization a run uses: the method's own (qlora: nf4), else `base_quant` as given."""
    return get(method).base_quant or base_quant
