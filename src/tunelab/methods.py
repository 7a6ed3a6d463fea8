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

    @property
    def saves(self) -> str:
        """The output folder of the final save: `model/` (HF format) or `adapter/` (PEFT format)."""
        return "model" if self.trains_base else "adapter"

    @property
    def adapter(self) -> bool:
        return not self.trains_base


REGISTRY: dict[str, Method] = {
    m.name: m
    for m in (
        Method("lora", quantized="qlora"),
        Method("dora", magnitude=True, quantized="qlora"),
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
