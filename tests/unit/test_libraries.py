"""libraries: the libraries' output quieted without importing them; inductor's cache apart per instruction-set cap."""

import os
import subprocess
import sys

from tunelab.libraries import isolate_compile_cache


def test_capped_runs_get_a_cache_of_their_cap():
    env = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
    folder = isolate_compile_cache(env)
    assert env["TORCHINDUCTOR_CACHE_DIR"] == folder
    assert folder.endswith("caps/aten_cpu_capability-avx2_onednn_max_cpu_isa-avx2")
    other = isolate_compile_cache({"ATEN_CPU_CAPABILITY": "avx512"})
    assert other != folder  # another cap, another cache


def test_uncapped_runs_and_a_users_own_cache_are_left_alone():
    env: dict = {}
    assert isolate_compile_cache(env) is None and env == {}
    env = {"ATEN_CPU_CAPABILITY": "avx2", "TORCHINDUCTOR_CACHE_DIR": "/mine"}
    assert isolate_compile_cache(env) is None and env["TORCHINDUCTOR_CACHE_DIR"] == "/mine"


def test_quieting_the_libraries_does_not_import_transformers_and_still_quiets_it():
    """The CLI quiets the libraries before every command; importing transformers for it cost every command 0.9 s
    (`tunelab plan`, the `--nproc` launcher). transformers, imported afterwards, logs errors only and shows no
    progress bars; a verbosity the user set is kept."""
    probe = (
        "import sys; from tunelab.libraries import quiet_libraries; quiet_libraries(); "
        "print('transformers' in sys.modules); from transformers.utils import logging as l; "
        "print(l.is_progress_bar_enabled(), l.get_verbosity())"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRANSFORMERS_VERBOSITY"}
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False", "40"]  # logging.ERROR
    env["TRANSFORMERS_VERBOSITY"] = "info"
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False", "20"]  # logging.INFO
