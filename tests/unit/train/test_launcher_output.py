"""`tunelab train --nproc N` relays the processes' own output and leaves out what the launcher adds when they fail."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import REPO

from tunelab.train.launch import LauncherOutput

# What `accelerate launch` wrote to stderr when both processes of a run stopped at a missing data file.
FAILED_LAUNCH = """\
tunelab train: error: runs/q/data/train.jsonl: data file not found (set data.path)
tunelab train: error: runs/q/data/train.jsonl: data file not found (set data.path)
W1124 18:56:36.592000 24326 .venv/lib/python3.11/site-packages/torch/distributed/elastic/multiprocessing/api.py:1028] Sending process 24329 closing signal SIGTERM
E1124 18:56:36.624000 24326 .venv/lib/python3.11/site-packages/torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: 2) local_rank: 1 (pid: 24330) of binary: /x/python
Traceback (most recent call last):
  File "<frozen runpy>", line 198, in _run_module_as_main
  File "/x/accelerate/commands/launch.py", line 1029, in multi_gpu_launcher
    distrib_run.run(args)
torch.distributed.elastic.multiprocessing.errors.ChildFailedError: 
============================================================
tunelab.cli FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-11-24_18:56:36
  rank      : 0 (local_rank: 0)
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  rank      : 1 (local_rank: 1)
============================================================
"""

# A process's own crash (a bug in tunelab): relayed whole, so that it can be reported.
CRASH = """\
[rank1]: Traceback (most recent call last):
[rank1]:   File "/x/tunelab/train/loop.py", line 3, in run
[rank1]:     boom()
[rank1]: RuntimeError: boom
"""


def _relay(text: str) -> tuple[str, LauncherOutput]:
    out: list[str] = []
    relay = LauncherOutput(out.append)
    for line in text.splitlines(keepends=True):
        relay.feed(line)
    relay.close()
    return "".join(out), relay


def test_a_failed_launch_says_its_one_line_once():
    text, relay = _relay("step 1/4 | loss 4.6\n" + FAILED_LAUNCH)
    assert (
        text
        == "step 1/4 | loss 4.6\ntunelab train: error: runs/q/data/train.jsonl: data file not found (set data.path)\n"
    )
    assert len(relay.errors) == 1


def test_a_process_killed_by_a_signal_keeps_the_launchers_report():
    """Without a line of the processes' own, the launcher's report is all that names the signal."""
    killed = FAILED_LAUNCH.replace(
        "tunelab train: error: runs/q/data/train.jsonl: data file not found (set data.path)\n", ""
    )
    killed = killed.replace(
        "  rank      : 1 (local_rank: 1)\n", "  rank      : 1 (local_rank: 1)\n  error: Signal 9 (SIGKILL)\n"
    )
    text, relay = _relay("step 1/4 | loss 4.6\n" + killed)
    assert not relay.errors and text.startswith("step 1/4 | loss 4.6\n") and "Signal 9 (SIGKILL)" in text


def test_a_process_traceback_is_relayed_whole():
    plain = CRASH.replace("[rank1]: ", "")
    text, relay = _relay(plain + "after\n")
    assert text == plain + "after\n" and not relay.errors
    text, _ = _relay(CRASH)  # prefixed lines are not the launcher's: kept
    assert "RuntimeError: boom" in text


@pytest.mark.slow
def test_nproc_with_a_missing_data_file_is_one_line(tmp_path):
    env = {"PYTHONPATH": str(REPO / "src"), "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"}
    cmd = [sys.executable, "-m", "tunelab.cli", "train", "--config", str(REPO / "configs" / "quickstart.yaml")]
    cmd += ["--nproc", "2", "--quiet", f"output_dir={tmp_path / 'out'}", f"data.path={tmp_path / 'nope.jsonl'}"]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert done.returncode == 2
    assert done.stderr == f"tunelab train: error: {tmp_path / 'nope.jsonl'}: data file not found (set data.path)\n"
    assert not (tmp_path / "out").exists()


def _run_fake_command(tmp_path) -> subprocess.CompletedProcess:
    """`tunelab fake` in a fresh process, the command being tmp_path/fakecmd.py."""
    code = "from tunelab import cli; cli.COMMANDS['fake'] = ('fakecmd', 'x'); raise SystemExit(cli.main(['fake']))"
    env = {"PYTHONPATH": f"{REPO / 'src'}:{tmp_path}", "PATH": "/usr/bin:/bin", "TUNELAB_ALLOCATOR": "system"}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)


def test_a_sigterm_while_reporting_an_error_adds_no_traceback(tmp_path):
    """torchrun SIGTERMs the other processes when one fails, often while they report the same error: the signal
    must not turn into a second traceback inside the error handler (once seen under load, above)."""
    (tmp_path / "fakecmd.py").write_text(
        "import os, signal, sys\n"
        "from tunelab.errors import TunelabError\n"
        "from tunelab.train.distributed import end_on_sigterm\n"
        "def add_arguments(p): pass\n"
        "class Err:\n"
        "    def __init__(self, real): self.real, self.sent = real, False\n"
        "    def write(self, text):\n"
        "        if not self.sent:\n"
        "            self.sent = True\n"
        "            os.kill(os.getpid(), signal.SIGTERM)  # arrives as the handler reports\n"
        "        return self.real.write(text)\n"
        "    def flush(self): self.real.flush()\n"
        "def run(args):\n"
        "    end_on_sigterm()\n"
        "    sys.stderr = Err(sys.stderr)\n"
        "    raise TunelabError('data.path: no such file')\n"
    )
    done = _run_fake_command(tmp_path)
    assert done.stderr == "tunelab fake: error: data.path: no such file\n" and done.returncode == 2


def test_a_sigterm_wrapped_by_python_ends_the_process_quietly(tmp_path):
    """A launcher's SIGTERM that lands inside a class's __set_name__ (`datasets` defining its features as the
    process imports it) reaches main as Python 3.11's RuntimeError, not as errors.Terminated: it must still end
    the process without a traceback (seen under load in test_nproc_with_a_missing_data_file_is_one_line)."""
    (tmp_path / "fakecmd.py").write_text(
        "import os, signal\n"
        "from tunelab.train.distributed import end_on_sigterm\n"
        "def add_arguments(p): pass\n"
        "class Field:\n"
        "    def __set_name__(self, owner, name):\n"
        "        os.kill(os.getpid(), signal.SIGTERM)  # arrives while the class is being made\n"
        "def run(args):\n"
        "    end_on_sigterm()\n"
        "    class Array2D:\n"
        "        x = Field()\n"
    )
    done = _run_fake_command(tmp_path)
    assert done.stderr == "" and done.returncode == 143


def test_a_bug_raised_while_handling_something_else_keeps_its_traceback():
    from tunelab import cli
    from tunelab.errors import Terminated

    try:
        try:
            raise Terminated("ended by signal 15")
        except Terminated as t:
            raise RuntimeError("wrapped") from t
    except RuntimeError as e:
        assert cli._terminated(e)
    assert not cli._terminated(RuntimeError("a bug"))
