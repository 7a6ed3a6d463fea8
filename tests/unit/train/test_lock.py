"""One run per output_dir: a second fails at once naming the first; a killed run leaves no stale lock."""

import os
import signal
import socket
import subprocess
import sys

import pytest

from tunelab.cli import main
from tunelab.errors import TunelabError
from tunelab.train.lock import LOCK, lock_output_dir


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
