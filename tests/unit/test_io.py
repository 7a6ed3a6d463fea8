"""write_atomic and atomic_dir: whole file or directory or nothing, with the mode a plain open() or mkdir gives."""

import os
import stat

import pytest

from tunelab.io import atomic_dir, write_atomic


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


def test_a_directory_replaces_the_old_one_whole(tmp_path):
    target = tmp_path / "adapter"
    target.mkdir()
    (target / "old.bin").write_text("old")
    old = os.umask(0o022)
    try:
        with atomic_dir(target) as tmp:
            (tmp / "new.bin").write_text("new")
            assert [p.name for p in target.iterdir()] == ["old.bin"]  # unchanged until the block ends
    finally:
        os.umask(old)
    assert [p.name for p in tmp_path.iterdir()] == ["adapter"]
    assert [p.name for p in target.iterdir()] == ["new.bin"]
    assert stat.S_IMODE(target.stat().st_mode) == 0o755


def test_a_failed_directory_leaves_the_old_one(tmp_path):
    target = tmp_path / "adapter"
    target.mkdir()
    (target / "old.bin").write_text("old")
    with pytest.raises(OSError):
        with atomic_dir(target) as tmp:
            (tmp / "new.bin").write_text("half")
            raise OSError(28, "No space left on device")
    assert [p.name for p in tmp_path.iterdir()] == ["adapter"]
    assert (target / "old.bin").read_text() == "old" and [p.name for p in target.iterdir()] == ["old.bin"]


def test_atomic_file_renames_when_done_and_leaves_nothing_when_interrupted(tmp_path):
    from tunelab.io import atomic_file

    target = tmp_path / "m.gguf"
    with pytest.raises(KeyboardInterrupt):
        with atomic_file(target) as tmp:
            tmp.write_bytes(b"half")
            raise KeyboardInterrupt
    assert list(tmp_path.iterdir()) == []
    with atomic_file(target) as tmp:
        tmp.write_bytes(b"whole")
        assert not target.exists()
    assert target.read_bytes() == b"whole" and list(tmp_path.iterdir()) == [target]
