"""bench.points: each point trains in a process of its own, started without the parent's state."""

import os
import sys

import pytest
import torch

from tunelab.bench import points

pytestmark = pytest.mark.slow  # starts processes


def _child() -> dict:
    return {"pid": os.getpid(), "preloaded": points.PRELOAD[0] in sys.modules, "env": os.environ.get("POINT_ENV")}


def test_a_cpu_host_starts_points_from_a_preloaded_fork_server(monkeypatch):
    """Without CUDA a point's process forks from a server that imported the training stack once per command:
    the child finds it imported (no ~5 s of imports per point), is still a process of its own, and sees the
    environment of the moment it was asked for, not the server's."""
    if torch.cuda.is_available():
        pytest.skip("a CUDA host spawns its points")
    assert points.start_method() == "forkserver"
    monkeypatch.setenv("POINT_ENV", "first")
    first = points.in_fresh_process(_child)
    monkeypatch.setenv("POINT_ENV", "second")
    second = points.in_fresh_process(_child)
    assert first["preloaded"] and second["preloaded"]
    assert len({os.getpid(), first["pid"], second["pid"]}) == 3
    assert (first["env"], second["env"]) == ("first", "second")


def test_a_spawned_point_imports_for_itself():
    """The CUDA hosts' way (a forked process cannot use CUDA that its parent initialized): a fresh interpreter
    that imports only what the point's function needs."""
    child = points.in_fresh_process(_child, method="spawn")
    assert child["pid"] != os.getpid() and not child["preloaded"]
