"""One run per output_dir: a second fails at once naming the first; a killed run leaves no stale lock."""

import os
import signal
import socket
import subprocess
import sys

import pytest

from tunelab.cli import main
from tunelab.errors import Terminated, TunelabError
from tunelab.train.distributed import end_on_sigterm
from tunelab.train.lock import LOCK, PROBE_PREFIX, lock_output_dir, removed_if_abandoned


def test_a_second_holder_fails_naming_the_first(tmp_path):
    out = tmp_path / "run"
    # flock locks belong to an open file description: a second open in this process contends like a second run.
    with lock_output_dir(out):
        with pytest.raises(TunelabError) as second:
            with lock_output_dir(out):
                pass
    message = str(second.value)
    assert message.startswith(
        f"output_dir {out} is in use by PID {os.getpid()} on host {socket.gethostname()} (started "
    )
    assert message.endswith("); wait for it or choose another output_dir") and "\n" not in message
    with lock_output_dir(out):  # released on exit
        pass


def test_a_run_that_created_output_dir_and_wrote_nothing_removes_it(tmp_path):
    out = tmp_path / "new" / "run"
    with pytest.raises(RuntimeError):
        with lock_output_dir(out):
            assert (out / LOCK).is_file()
            raise RuntimeError("startup failed")
    assert not (tmp_path / "new").exists()


def test_train_on_a_dir_locked_by_another_process_fails_at_once_and_kill_9_frees_it(tmp_path, capsys):
    out = tmp_path / "run"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, pathlib; from tunelab.train.lock import lock_output_dir\n"
            f"with lock_output_dir(pathlib.Path({str(out)!r})):\n"
            "    print('locked', flush=True); sys.stdin.read()",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline() == "locked\n"
        config = tmp_path / "c.yaml"
        config.write_text(f"output_dir: {out}\n")
        code = main(["train", "--config", str(config), "--quiet"])
        err = capsys.readouterr().err
        assert code == 2 and len(err.splitlines()) == 1
        assert f"output_dir {out} is in use by PID {holder.pid} on host {socket.gethostname()}" in err
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    with lock_output_dir(out):  # the kernel dropped the dead process's lock
        pass


def test_a_launcher_removes_what_a_killed_run_left_at_its_start(tmp_path):
    """torchrun ends the other processes once one fails; a main process killed between creating output_dir and
    removing it leaves the folder with its lock (and perhaps a write probe): the launching process removes it."""
    out = tmp_path / "new" / "out"
    with removed_if_abandoned(out):
        out.mkdir(parents=True)
        (out / LOCK).write_text('{"pid": 1}')
        (out / f"{PROBE_PREFIX}abc").write_text("")
    assert not (tmp_path / "new").exists()

    kept = tmp_path / "kept"
    with removed_if_abandoned(kept):
        kept.mkdir()
        (kept / LOCK).write_text("")
        (kept / "metrics.jsonl").write_text("{}\n")  # the run got going: its output stays
    assert sorted(p.name for p in kept.iterdir()) == [LOCK, "metrics.jsonl"]

    existing = tmp_path / "existing"
    existing.mkdir()
    with removed_if_abandoned(existing):
        (existing / LOCK).write_text("")
    assert existing.is_dir()  # the user's folder, not the run's to remove


def test_sigterm_in_a_launched_process_releases_a_new_output_dir(tmp_path):
    """What torchrun sends a process when another one failed ends it where it is, through its cleanup."""
    previous = signal.getsignal(signal.SIGTERM)
    out = tmp_path / "out"
    try:
        end_on_sigterm()
        with pytest.raises(Terminated), lock_output_dir(out):
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(1000):  # the handler runs between bytecodes, at the latest in this loop
                pass
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert not out.exists()
