"""Writing output files and directories so that a reader, or a crash, never sees a half-written one."""

from __future__ import annotations

import errno
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from .errors import TunelabError


def tunelab_cache() -> Path:
    """Where tunelab keeps what it derives once (the embedded model's HF directory, calibration records)."""
    return Path(os.environ.get("TUNELAB_CACHE", Path.home() / ".cache" / "tunelab"))


GIB = 2**30
# A full disk, a quota, or a failing device: the user can act on these, so they end a run with one line.
DISK_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EIO)


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


# What a file name tunelab writes may hold: some file transfers (a GPU host's among them) refuse anything else.
SAFE_NAME = re.compile(r"[A-Za-z0-9._-]+")


def safe_name(text: str) -> str:
    """`text` as a file name of letters, digits, `.`, `_` and `-` only: each run of anything else becomes `_`."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text)


def read_text(path: Path) -> str:
    """A text file's content; a byte that is not UTF-8 fails naming its line and column."""
    data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        column = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
        raise TunelabError(
            f"{path}:{line}: not UTF-8 (byte 0x{data[e.start]:02x} at column {column}); save the file as UTF-8"
        ) from None


def check_output_file(path: Path, flag: str) -> None:
    """Fail before any work when `path` cannot become a file: a folder is there, or a file is where a folder above
    it goes. Checked up front, so a long run does not end in a traceback, or with one of two outputs written."""
    if path.is_dir():
        raise TunelabError(f"{flag} {path}: is a directory; name a file")
    _check_parents(path, flag)


def check_output_dir(path: Path, flag: str) -> None:
    """As check_output_file, for an output folder."""
    if path.exists() and not path.is_dir():
        raise TunelabError(f"{flag} {path}: is a file; name a folder")
    _check_parents(path, flag)


def _check_parents(path: Path, flag: str) -> None:
    for parent in path.parents:  # the nearest one that exists decides
        if parent.exists():
            if not parent.is_dir():
                raise TunelabError(f"{flag} {path}: {parent} is a file, not a folder; choose another path")
            return


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
def atomic_file(path: Path) -> Iterator[Path]:
    """Yield a temp file path next to `path` for a writer that opens files by name; on success it is renamed to
    `path`, on any failure (an interrupt included) it is removed: `path` is never seen half-written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        os.chmod(tmp, _plain_mode(0o666))
        yield Path(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
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


@contextmanager
def first_complete_dir(path: Path, complete: Callable[[Path], bool]) -> Iterator[Path]:
    """Yield a temp dir beside `path` to fill; it then becomes `path` by one rename. For a cache that processes
    may fill at once: when the fill or the rename fails and `complete(path)` says another process made `path`
    meanwhile, that copy stands (never replaced under its readers) and the failure is dropped."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=".tmp-"))
    try:
        yield tmp
        os.replace(tmp, path)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if not complete(path):
            raise


def move_files(src: Path, dst: Path, names: Iterable[str]) -> list[Path]:
    """Rename each of `names` from folder `src` into folder `dst`, in the order given (each rename is atomic, so
    a reader of `dst` sees each file whole; the last one named can mark the set complete)."""
    moved = []
    for name in names:
        os.replace(src / name, dst / name)
        moved.append(dst / name)
    return moved


def remove_stale_temps(folder: Path) -> None:
    """Delete the temp files and dirs that a killed writer above left in `folder`.

    Only for a folder whose writer is known to be gone (a run holding output_dir's lock, train/lock.py):
    a live writer's temp entry looks the same.
    """
    if not folder.is_dir():
        return
    for p in folder.iterdir():
        if p.name.startswith(".tmp-") or (p.name.startswith(".") and p.name.endswith(".tmp")):
            if p.is_dir():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)


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


def disk_error(e: BaseException) -> str | None:
    """The OS's words for a full disk or an I/O error behind `e`, or None for any other failure.

    safetensors writes from Rust and raises its own error type, whose message carries the OS error number.
    """
    if isinstance(e, OSError):
        return e.strerror if e.errno in DISK_ERRNOS else None
    found = re.search(r"os error (\d+)", str(e))
    if found and int(found.group(1)) in DISK_ERRNOS:
        return os.strerror(int(found.group(1)))
    return None


def free_bytes(folder: Path) -> str:
    try:
        return f"{shutil.disk_usage(folder).free:,} bytes"
    except OSError:
        return "unknown bytes"


@contextmanager
def disk_errors(what: str, folder: Path, needed: int, then: str) -> Iterator[None]:
    """A full disk or I/O error while writing `what` becomes one line: the bytes needed and free, then `then`."""
    try:
        yield
    except Exception as e:
        reason = disk_error(e)
        if reason is None:
            raise
        raise TunelabError(
            f"{what}: {reason} while writing it; it needs {needed:,} bytes, {free_bytes(folder)} free there; {then}"
        ) from None
