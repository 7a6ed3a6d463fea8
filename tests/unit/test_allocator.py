"""The CLI's allocator choice (tunelab/allocator.py): re-execute under jemalloc once, never loop, allow opt-out."""

import sys

import pytest

from tunelab import allocator


@pytest.fixture
def execs(monkeypatch):
    calls = []
    monkeypatch.setattr(allocator.os, "execve", lambda path, args, env: calls.append((path, args, env)))
    monkeypatch.setattr(allocator, "find_jemalloc", lambda: "/usr/lib/libjemalloc.so.2")
    monkeypatch.setattr(sys, "orig_argv", ["python", "-m", "tunelab.demo", "configs/quickstart.yaml"])
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    monkeypatch.delenv("MALLOC_CONF", raising=False)
    monkeypatch.delenv("TUNELAB_ALLOCATOR", raising=False)
    return calls


def test_reexecutes_the_same_command_with_jemalloc_preloaded(execs):
    allocator.reexec_with_jemalloc()
    ((path, args, env),) = execs
    assert path == sys.executable and args == [sys.executable, "-m", "tunelab.demo", "configs/quickstart.yaml"]
    assert env["LD_PRELOAD"] == "/usr/lib/libjemalloc.so.2" and env["MALLOC_CONF"] == allocator.MALLOC_CONF


def test_keeps_an_existing_preload(execs, monkeypatch):
    monkeypatch.setenv("LD_PRELOAD", "/opt/other.so")
    allocator.reexec_with_jemalloc()
    assert execs[0][2]["LD_PRELOAD"] == "/usr/lib/libjemalloc.so.2 /opt/other.so"


@pytest.mark.parametrize("env", [{"LD_PRELOAD": "/usr/lib/libjemalloc.so.2"}, {"TUNELAB_ALLOCATOR": "system"}])
def test_no_reexec_when_already_on_jemalloc_or_opted_out(execs, monkeypatch, env):
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    allocator.reexec_with_jemalloc()
    assert execs == []


def test_no_reexec_without_jemalloc(execs, monkeypatch):
    monkeypatch.setattr(allocator, "find_jemalloc", lambda: None)
    allocator.reexec_with_jemalloc()
    assert execs == []


def run_on_jemalloc(code: str) -> None:
    """Run `code` in a fresh Python on jemalloc with tunelab's MALLOC_CONF; its assertions fail the test."""
    import os
    import subprocess

    env = {**os.environ, "LD_PRELOAD": allocator.find_jemalloc(), "MALLOC_CONF": allocator.MALLOC_CONF}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


@pytest.mark.skipif(allocator.find_jemalloc() is None, reason="needs libjemalloc2")
def test_decay_freed_pages_sets_every_arenas_decay_under_jemalloc():
    """In a process on jemalloc the decay reads back from an arena in use and from arenas made later."""
    code = (
        "import ctypes; from tunelab import allocator\n"
        "assert allocator.decay_freed_pages(1000)\n"
        "ctl = ctypes.CDLL(None).mallctl\n"
        "ctl.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t), ctypes.c_void_p, "
        "ctypes.c_size_t]\n"
        "for name, want in ((b'arena.0.dirty_decay_ms', 1000), (b'arenas.dirty_decay_ms', 1000),\n"
        "                   (b'arena.0.muzzy_decay_ms', allocator.RETURN_MS), (b'arenas.muzzy_decay_ms', allocator.RETURN_MS)):\n"
        "    v, n = ctypes.c_ssize_t(), ctypes.c_size_t(8)\n"
        "    assert ctl(name, ctypes.byref(v), ctypes.byref(n), None, 0) == 0 and v.value == want, (name, v.value)\n"
    )
    run_on_jemalloc(code)


@pytest.mark.skipif(allocator.find_jemalloc() is None, reason="needs libjemalloc2")
def test_decayed_pages_leave_the_rss_not_only_jemalloc():
    """A freed block's pages leave the process's RSS, not only jemalloc's count: with muzzy decay off (-1), as
    before, they stayed in it."""
    code = (
        "from tunelab import allocator\n"
        "def kib(field):\n"
        "    return sum(int(l.split()[1]) for l in open('/proc/self/smaps') if l.startswith(field + ':'))\n"
        "import time\n"
        "assert allocator.decay_freed_pages(10, 10)\n"
        "block = bytearray(b'x' * (256 << 20))\n"
        "before = kib('Rss')\n"
        "del block\n"
        "time.sleep(0.2)\n"
        "for _ in range(5000):\n"  # jemalloc decays as allocations tick by
        "    bytearray(8192)\n"
        "after, lazy = kib('Rss'), kib('LazyFree')\n"
        "assert before - after > 200 << 10 and lazy < 50 << 10, (before, after, lazy)\n"
    )
    run_on_jemalloc(code)


def test_decay_freed_pages_is_a_no_op_on_the_system_allocator():
    if "jemalloc" in __import__("os").environ.get("LD_PRELOAD", ""):
        pytest.skip("this process runs on jemalloc")
    assert allocator.decay_freed_pages(1000) is False


@pytest.mark.parametrize("method,returned", [("full", True), ("lora", False)])
def test_a_cpu_full_fine_tune_returns_freed_pages(
    tiny_model_dir, addition_rows, tmp_path, monkeypatch, method, returned
):
    """Only a method that trains the base weights asks jemalloc to return freed pages (its RSS grew every step)."""
    from conftest import tiny_train_config, write_jsonl

    from tunelab.recipes.finetune import finetune

    calls = []
    monkeypatch.setattr(allocator, "decay_freed_pages", lambda ms: calls.append(ms) or True)
    data = write_jsonl(tmp_path / "add.jsonl", addition_rows)
    finetune(tiny_train_config(tiny_model_dir, data, tmp_path / "run", f"method={method}", "max_steps=1"), False)
    assert calls == ([allocator.DECAY_MS] if returned else [])


@pytest.mark.skipif(allocator.find_jemalloc() is None, reason="needs libjemalloc2")
def test_return_freed_pages_empties_the_rss_of_freed_pages_at_once():
    """With decay off (tunelab's MALLOC_CONF), a freed block's pages stay in the RSS until returned; returning them
    takes them out at once, lazily freed ones included."""
    code = (
        "from tunelab import allocator\n"
        "def kib(field):\n"
        "    return sum(int(l.split()[1]) for l in open('/proc/self/smaps') if l.startswith(field + ':'))\n"
        "block = bytearray(b'x' * (256 << 20))\n"
        "before = kib('Rss')\n"
        "del block\n"
        "held = kib('Rss')\n"
        "assert before - held < 50 << 10, (before, held)\n"
        "assert allocator.return_freed_pages()\n"
        "after, lazy = kib('Rss'), kib('LazyFree')\n"
        "assert held - after > 200 << 10 and lazy < 50 << 10, (held, after, lazy)\n"
    )
    run_on_jemalloc(code)


def test_return_freed_pages_is_a_no_op_on_the_system_allocator():
    if "jemalloc" in __import__("os").environ.get("LD_PRELOAD", ""):
        pytest.skip("this process runs on jemalloc")
    assert allocator.return_freed_pages() is False


@pytest.mark.parametrize(
    "overrides,returns",
    [
        (("method=full", "optimizer=adafactor"), True),  # a step with scratch: its pages are returned before it
        (("method=full",), False),  # fused AdamW allocates no scratch
        (
            ("method=full", "optimizer=adafactor", "optimizer_in_backward=true", "grad_accum=1", "max_grad_norm=0"),
            False,
        ),  # in backward
        (("method=lora", "optimizer=adafactor"), False),  # LoRA keeps freed pages (decay off)
    ],
)
def test_freed_pages_are_returned_before_each_step_with_scratch(
    tiny_model_dir, addition_rows, tmp_path, monkeypatch, overrides, returns
):
    """Each optimizer step of a CPU full fine-tune whose optimizer allocates scratch (Optimizer.step_scratch) is
    preceded by returning the freed pages; no other run returns them."""
    from conftest import tiny_train_config, write_jsonl

    from tunelab.recipes.finetune import finetune

    calls = []
    monkeypatch.setattr(allocator, "return_freed_pages", lambda: calls.append(1) or True)
    data = write_jsonl(tmp_path / "add.jsonl", addition_rows)
    finetune(tiny_train_config(tiny_model_dir, data, tmp_path / "run", *overrides, "max_steps=2"), False)
    assert len(calls) == (2 if returns else 0)
