"""One run per output_dir: an exclusive `flock` on `output_dir/.tunelab.lock`, held for the run's life.

The kernel drops an flock when its process dies, however it dies (kill -9, the OOM killer), so a dead run
never leaves a stale lock. The PID, host and start time in the file are only for the second run's message.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ..errors import TunelabError

LOCK = ".tunelab.lock"
# The prefix of the file a run writes and removes to learn that output_dir is writable (recipes/finetune.py).
PROBE_PREFIX = ".tmp-probe-"


@contextmanager
def lock_output_dir(path: Path) -> Iterator[None]:
    """Hold `path`'s lock (creating `path`) or fail at once naming the run that holds it.

    If `path` did not exist and the run wrote nothing else into it, it is removed again on the way out:
    a run that fails at startup leaves no output dir behind. A run that fails in an existing `path` removes
    the lock file if it was the one to create it.
    """
    created = [p for p in (path, *path.parents) if not p.exists()]
    new_lock = not (path / LOCK).exists()
    path.mkdir(parents=True, exist_ok=True)
    fd = _acquire(path / LOCK, path)
    failed = False
    try:
        yield
    except BaseException:
        failed = True
        raise
    finally:
        if fd is not None:
            os.ftruncate(fd, 0)
        if not created and failed and new_lock and fd is not None:
            (path / LOCK).unlink(missing_ok=True)  # unlinked while locked, as below
        elif created and path.is_dir() and [p.name for p in path.iterdir()] == [LOCK]:
            # Unlinked while still locked: a run that opened the old file re-checks its inode (_acquire).
            (path / LOCK).unlink()
            for p in created:  # deepest first
                try:
                    p.rmdir()
                except OSError:
                    break
        if fd is not None:
            os.close(fd)


@contextmanager
def removed_if_abandoned(path: Path) -> Iterator[None]:
    """For the process that launches a data-parallel run: `path`, and the parents this call finds missing, are
    removed afterwards if they hold nothing but what a run's start writes (its lock file, a write probe).

    The launched processes clean up after themselves when they fail (lock_output_dir), but not when the launcher
    kills them: torchrun ends every other process once one fails (SIGTERM, then SIGKILL), and the main process
    may be anywhere between creating `path` and removing it. The launching process outlives them all, so its
    check comes after the last of them has exited, whatever order they failed in."""
    created = [p for p in (path, *path.parents) if not p.exists()]
    try:
        yield
    finally:
        for folder in created:  # deepest first
            if not folder.is_dir():
                break
            left = list(folder.iterdir())
            startup_only = all(e.name == LOCK or e.name.startswith(PROBE_PREFIX) for e in left)
            if not (left == [] or (folder == path and startup_only)):
                break
            for entry in left:
                entry.unlink()
            folder.rmdir()


def held(path: Path) -> bool:
    """Whether a live run holds `path`'s lock (for readers such as `tunelab ui`), without taking it: a reader's
    own flock, however brief, would make a run starting that moment fail as "in use". Linux lists every flock
    in /proc/locks by device and inode; elsewhere a non-blocking shared lock is tried and dropped at once."""
    file = path / LOCK
    try:
        st = os.stat(file)
    except OSError:
        return False
    try:
        table = Path("/proc/locks").read_text()
    except OSError:
        return _try_shared(file)
    key = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    return any(f.split()[1:2] == ["FLOCK"] and key in f.split() for f in table.splitlines())


def _try_shared(file: Path) -> bool:
    fd = os.open(file, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        os.close(fd)  # closing drops the shared lock, if taken
    return False


def _acquire(file: Path, folder: Path) -> int | None:
    while True:
        fd = os.open(file, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 4096, 0)
            os.close(fd)
            raise TunelabError(
                f"output_dir {folder} is in use by {_describe(holder)}; wait for it or choose another output_dir"
            ) from None
        except OSError as e:
            # Some network filesystems refuse locks; training there is still better than not training.
            os.close(fd)
            print(
                f"output_dir {folder}: cannot lock {LOCK} ({e.strerror}); nothing stops a second run from writing here",
                file=sys.stderr,
                flush=True,
            )
            return None
        try:
            same = os.stat(file).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)  # locked a file another run unlinked on its way out: lock the one now at that path
    holder = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.strftime("%Y-%m-%d %H:%M:%S")}
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(holder).encode(), 0)
    return fd


def _describe(raw: bytes) -> str:
    try:
        holder = json.loads(raw)
        return f"PID {holder['pid']} on host {holder['host']} (started {holder['started']})"
    except (ValueError, KeyError, TypeError):
        return "another run (it has not recorded its PID yet)"
