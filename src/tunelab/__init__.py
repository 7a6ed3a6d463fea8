"""tunelab: fast LLM fine-tuning that predicts and measures its own time, memory and cost.

The Python API (docs/api.md): `tunelab.load_config`, `tunelab.estimate` (plan), `tunelab.finetune` (train),
`tunelab.export`, imported on first use so that `import tunelab` stays light.
"""

from .libraries import isolate_compile_cache

isolate_compile_cache()  # before torch compiles anything, whichever entry (CLI, API, demo) imported tunelab

__version__ = "0.1.0"
__all__ = ["load_config", "estimate", "finetune", "export"]


def __getattr__(name: str):
    if name in __all__:
        from . import api

        return getattr(api, name)
    raise AttributeError(f"module 'tunelab' has no attribute {name!r}")
