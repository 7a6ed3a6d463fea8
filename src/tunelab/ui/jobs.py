"""The Start a run tab: `tunelab train` on a shipped config with overrides, as a child process whose exact
command the page shows, and its stop: SIGINT, as Ctrl-C in a terminal, so the run ends between steps with its
checkpoints whole (train/checkpoint.py writes them atomically) and `resume=true` continues it."""

from __future__ import annotations

import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from .. import config as cfgmod
from ..errors import TunelabError
from .runs import inside

# The last lines of a run's output the page shows.
TAIL_BYTES = 4000


@dataclass
class LaunchedJob:
    id: int
    command: list[str]  # as shown: `tunelab train --config ... key=value`
    run: str  # the run's output_dir, relative to --runs
    process: subprocess.Popen
    log: Path
    started: float = field(default_factory=time.time)

    def view(self) -> dict:
        code = self.process.poll()
        try:
            with self.log.open("rb") as f:
                f.seek(max(0, self.log.stat().st_size - TAIL_BYTES))
                tail = f.read().decode(errors="replace")
        except OSError:
            tail = ""
        return {
            "id": self.id,
            "command": shlex.join(self.command),
            "run": self.run,
            "running": code is None,
            "exit_status": code,
            "output": tail,
        }


# `python -m tunelab ARGS`, except that SIGINT (the page's Stop) raises KeyboardInterrupt in the child even where
# this server was started with SIGINT ignored (a background job of a non-interactive shell, a test runner's worker):
# an ignored signal stays ignored across fork and exec, and Python then installs no handler for it.
CHILD = (
    "import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
    "from tunelab.cli import main; sys.exit(main())"
)


class Jobs:
    """Runs this server started. `runs`: the --runs folder, where every run's output_dir must lie so that the
    page can show it; `configs`: the folder of shipped configs the page offers."""

    def __init__(self, runs: Path, configs: Path) -> None:
        self.runs, self.configs = runs, configs
        self._jobs: dict[int, LaunchedJob] = {}
        self._lock = threading.Lock()
        self._logs = Path(tempfile.mkdtemp(prefix="tunelab-ui-"))

    def config_names(self) -> list[str]:
        return sorted(p.name for p in self.configs.glob("*.yaml")) if self.configs.is_dir() else []

    def start(self, config: str, overrides: list[str]) -> dict:
        if config not in self.config_names():
            raise TunelabError(f"{config!r}: not one of the configs in {self.configs}")
        path = self.configs / config
        overrides = [o.strip() for o in overrides if o.strip()]
        if not any(o.startswith("output_dir=") for o in overrides):
            overrides.append(f"output_dir={self.runs / (Path(config).stem + time.strftime('-%Y%m%d-%H%M%S'))}")
        cfg = cfgmod.load_config(path, overrides)  # a bad override fails here, as one line, before any process
        out = Path(cfg.run.output_dir)
        try:
            run = out.resolve().relative_to(self.runs.resolve()).as_posix()
            inside(self.runs, run)
        except (ValueError, TunelabError):
            raise TunelabError(f"output_dir={out}: not under {self.runs}, where this page shows runs") from None
        argv = ["train", "--config", str(path), *overrides]
        with self._lock:
            number = len(self._jobs) + 1
            log = self._logs / f"job-{number}.log"
            with log.open("wb") as sink:
                process = subprocess.Popen([sys.executable, "-c", CHILD, *argv], stdout=sink, stderr=subprocess.STDOUT)
            job = self._jobs[number] = LaunchedJob(number, ["tunelab", *argv], run, process, log)
        return job.view()

    def stop(self, number: int) -> dict:
        job = self._jobs.get(number)
        if job is None:
            raise TunelabError(f"job {number}: this server started no such run")
        if job.process.poll() is None:
            job.process.send_signal(signal.SIGINT)
        return job.view()

    def views(self) -> list[dict]:
        return [j.view() for j in self._jobs.values()]

    def exit_status(self, run: str) -> int | None:
        """The exit status of the last process this server ran in `run`'s output_dir, when it has ended."""
        for job in reversed(list(self._jobs.values())):
            if job.run == run:
                return job.process.poll()
        return None

    def close(self) -> None:
        """Ctrl-C for every run still going when the server stops: none outlives it unwatched."""
        for job in self._jobs.values():
            if job.process.poll() is None:
                job.process.send_signal(signal.SIGINT)
        for job in self._jobs.values():
            try:
                job.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                job.process.kill()
