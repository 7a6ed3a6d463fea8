"""The third-party libraries' own output, quieted: tunelab prints its own progress; and torch's compile cache kept
apart per CPU instruction-set cap. Torch-free, so the CLI calls it before any command's imports."""

from __future__ import annotations

import getpass
import os
import sys
import tempfile

# The environment variables that cap the instruction set torch's kernels and inductor's generated code use.
ISA_CAPS = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA")


def quiet_libraries() -> None:
    """tunelab prints its own progress; library progress bars and deprecation chatter would bury it."""
    import logging
    import warnings

    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=UserWarning, module=r"(torch|transformers|peft|accelerate)\.")
    logging.getLogger("bitsandbytes").setLevel(logging.ERROR)
    # transformers is not imported here (0.9 s, which `tunelab plan` and the `--nproc` launcher need not pay): it
    # reads its verbosity from the environment and its progress bars' state from huggingface_hub's when imported.
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    try:
        from huggingface_hub.utils import disable_progress_bars
        from huggingface_hub.utils import logging as hub_logging

        disable_progress_bars()  # hub.py turns its download bars back on for a download on a terminal
        hub_logging.set_verbosity_error()  # its retry warnings, two lines per attempt, before one failure line
    except ImportError:
        pass
    if "transformers" in sys.modules:  # imported already (a caller in Python): set it directly
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()


def isolate_compile_cache(environ: os._Environ | dict = os.environ) -> str | None:
    """Under an instruction-set cap, point inductor at a cache of that cap's own; the folder set, or None.

    Why: torch 2.13's compile caches key an entry without the cap, so code compiled under
    `ATEN_CPU_CAPABILITY=avx2` is loaded by a later uncapped run, whose backward then segfaults in the garbage
    collector (benchmarks/faults/inductor-cache-caps_epyc-avx512bf16-2c_2026-12-07.md). A cache the user names
    (TORCHINDUCTOR_CACHE_DIR) is theirs and kept; uncapped runs keep torch's default.
    """
    caps = [f"{name.lower()}-{environ[name].lower()}" for name in ISA_CAPS if environ.get(name)]
    if not caps or environ.get("TORCHINDUCTOR_CACHE_DIR"):
        return None
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = f"uid_{os.getuid()}"
    folder = os.path.join(tempfile.gettempdir(), f"torchinductor_{user}", "caps", "_".join(caps))
    environ["TORCHINDUCTOR_CACHE_DIR"] = folder
    return folder
