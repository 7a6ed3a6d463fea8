"""write_atomic: whole file or nothing, with the mode a plain open() would give."""

import os
import stat

import pytest

from tunelab.io import write_atomic


def test_mode_follows_the_umask(tmp_path):
    old = os.umask(0o022)
    try:
        write_atomic(tmp_path / "out.json", ["{}\n"])
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "out.json").stat().st_mode) == 0o644
    assert (tmp_path / "out.json").read_text() == "{}\n"


def test_failure_leaves_nothing(tmp_path):
    def lines():
        yield "half"
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        write_atomic(tmp_path / "out.json", lines())
    assert list(tmp_path.iterdir()) == []
