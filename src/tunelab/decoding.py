"""The ways the decode loop (eval/sampling.py) runs, one row each; config validation, the GRPO recipe, `tunelab eval`
and bench read this registry and never compare mode names. Torch-free.

A decode step feeds one token per row through the model. Eager with a growing cache it pays, per step, every op's
dispatch and launch and a copy of the cache; on a GPU at small batch those launches, not the weights' bytes, bound
the step. A static cache (preallocated to the batch's longest prompt plus the completion cap) gives every step
the same shapes, which is what a compiled step needs; compiled with CUDA graphs the step is one graph replay.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Decode:
    name: str
    static_cache: bool  # transformers' StaticCache, preallocated, written in place; else a DynamicCache that grows
    compiled: bool  # the decode step under torch.compile (mode reduce-overhead, CUDA graphs, on CUDA)
    help: str


MODES = {
    d.name: d
    for d in (
        Decode("dynamic", False, False, "eager steps over a growing cache; prompts that repeat share one prefill"),
        Decode("static", True, False, "eager steps over a preallocated cache of fixed shapes"),
        Decode("compiled", True, True, "static, the step compiled (CUDA graphs on CUDA)"),
    )
}
AUTO = "auto"
NAMES = (AUTO, *MODES)


def resolve(name: str, device_type: str) -> Decode:
    """The mode `name` runs: `auto` is compiled on CUDA, where launches bound a decode step, and dynamic elsewhere,
    where a step's ops cost more than their launch and a compile would not pay for itself."""
    if name == AUTO:
        return MODES["compiled" if device_type == "cuda" else "dynamic"]
    return MODES[name]
