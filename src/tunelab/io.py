"""Writing output files and directories so that a reader, or a crash, never sees a half-written one."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

GIB = 2**30


def gib(n: float) -> str:
    """Bytes as tunelab prints them everywhere: GiB with two decimals."""
    return f"{n / GIB:.2f} GiB"


def duration(seconds: float) -> str:
    """Seconds as tunelab prints them: `42 s`, `12.5 min`, `3.25 h`."""
    if seconds < 60:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.2f} h"


def write_atomic(path: Path, lines: Iterable[str]) -> None:
    """Write via a temp file and rename: a reader (or a crash) never sees a half-written file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        # mkstemp creates 0600; an output file gets the mode a plain open() would give it.
        os.fchmod(fd, _plain_mode(0o666))
        with os.fdopen(fd, "w") as f:
            f.writelines(lines)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


@contextmanager
def atomic_dir(path: Path) -> Iterator[Path]:
    """Yield a temp dir next to `path` to fill; on success it replaces `path`, on any failure it is removed.

    A reader (or a crash) sees the old directory or the complete new one, never a partial one.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".tmp-{path.name}-"))
    try:
        os.chmod(tmp, _plain_mode(0o777))  # mkdtemp creates 0700; mkdir would honour the umask
        yield tmp
        if path.exists():
            # A directory cannot be renamed over a non-empty one: move the old aside first, drop it after.
            old = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".tmp-old-{path.name}-"))
            os.replace(path, old / path.name)
            os.replace(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def link_tree(src: Path, dst: Path) -> None:
    """`dst` as a copy of the directory `src` made of hard links (no bytes copied; a later replacement of
    `src` leaves `dst` intact), copying the files that cannot be linked (another filesystem)."""
    dst.mkdir(parents=True, exist_ok=True)
    for item in src.iterdir():
        if item.is_dir():
            link_tree(item, dst / item.name)
            continue
        try:
            os.link(item, dst / item.name)
        except OSError:
            shutil.copy2(item, dst / item.name)


def _plain_mode(mode: int) -> int:
    umask = os.umask(0)
    os.umask(umask)
    return mode & ~umask
