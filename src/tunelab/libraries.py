"""The third-party libraries' own output, quieted: tunelab prints its own progress. Torch-free, so the CLI calls
it before any command's imports."""

from __future__ import annotations


def quiet_libraries() -> None:
    """tunelab prints its own progress; library progress bars and deprecation chatter would bury it."""
    import logging
    import warnings

    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=UserWarning, module=r"(torch|transformers|peft|accelerate)\.")
    logging.getLogger("bitsandbytes").setLevel(logging.ERROR)
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
        from huggingface_hub.utils import logging as hub_logging

        hub_logging.set_verbosity_error()  # its retry warnings, two lines per attempt, before one failure line
    except ImportError:
        pass
