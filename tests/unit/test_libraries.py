"""libraries.isolate_compile_cache: inductor's cache apart per instruction-set cap."""

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
