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
