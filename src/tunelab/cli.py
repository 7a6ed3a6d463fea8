"""`tunelab` command line: one subcommand per module, each with `add_arguments(parser)` and `run(args) -> int`.

User errors (`TunelabError`) print one line and exit 2; nothing else is caught, so bugs keep their traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from .errors import Terminated, TunelabError
from .libraries import quiet_libraries

# subcommand -> (module, one-line help). Modules are imported only when their command runs: `tunelab plan`
# must not pay for importing the training stack.
COMMANDS = {
    "train": ("tunelab.commands.train", "fine-tune a model from a YAML config"),
    "plan": ("tunelab.commands.plan", "predict time, memory and cost of a fine-tune on any GPU"),
    "bench": ("tunelab.commands.bench", "measure throughput, MFU and memory on this device"),
    "eval": ("tunelab.commands.eval", "exact-match accuracy of a model (and adapter) on a dataset"),
    "data": ("tunelab.commands.data", "generate datasets (arithmetic, synthetic)"),
    "export": ("tunelab.commands.export", "merge an adapter into its base and save a plain HF model"),
    "report": ("tunelab.commands.report", "turn stored runs into performance.md with plots"),
    "serve": ("tunelab.commands.serve", "an OpenAI-compatible server over a model and its adapters"),
    "ui": ("tunelab.commands.ui", "a local web page: plan, runs, the tuned model, starting and stopping runs"),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="tunelab", description="Fast LLM fine-tuning that predicts and measures its own time, memory and cost."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    if argv is None:  # a real process (not a call from Python): pick the allocator before any work
        from .allocator import reexec_with_jemalloc

        reexec_with_jemalloc()
    argv = sys.argv[1:] if argv is None else argv
    quiet_libraries()  # before a command's imports: bitsandbytes warns about optional kernels as it is imported
    chosen = next((a for a in argv if not a.startswith("-")), None)
    for name, (module_name, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if name == chosen:
            module = _import(module_name, name)
            module.add_arguments(p)
            p.set_defaults(handler=module.run)
    # Overrides (key=value) may come before or after flags: `train --config c.yaml lr=1e-4 --quiet seed=3`.
    args, extra = parser.parse_known_args(argv)
    if extra:
        if not hasattr(args, "overrides") or any(a.startswith("-") or "=" not in a for a in extra):
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        args.overrides = [*args.overrides, *extra]
    try:
        return int(args.handler(args) or 0)
    except TunelabError as e:
        # Already on the way out: a launcher's SIGTERM (sent when another process failed, often of the same
        # error) must not raise errors.Terminated inside this handler, where no clause catches it and Python
        # prints both tracebacks (seen under load in test_launcher_output).
        _ignore_sigterm()
        # One write, newline included: unbuffered (PYTHONUNBUFFERED=1 or -u, as in many containers and CI runners),
        # print's two writes let the lines of launched processes sharing one stderr interleave; the relay reads lines.
        sys.stderr.write(f"tunelab {args.command}: error: {e}\n")
        return _exit_status(2)
    except KeyboardInterrupt:
        print(f"tunelab {args.command}: interrupted", file=sys.stderr)
        return 130
    except Terminated:
        # The launcher ended this process because another one failed: that one has said why.
        return _exit_status(143)
    except Exception as e:
        # The same, wrapped on its way up: Python 3.11 turns an exception raised in a class's __set_name__ into a
        # RuntimeError (a SIGTERM that lands while `datasets` defines its features, seen under load), and a
        # library may re-raise its own error from it. Anything else is a bug and keeps its traceback.
        if not _terminated(e):
            raise
        return _exit_status(143)


def _terminated(e: BaseException) -> bool:
    """Whether `e` is, or was raised from or while handling, errors.Terminated."""
    seen = set()
    while e is not None and id(e) not in seen:
        if isinstance(e, Terminated):
            return True
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return False


def _ignore_sigterm() -> None:
    """Only a Python handler (train/distributed.end_on_sigterm's, which raises) is replaced: a caller whose
    SIGTERM still ends the process on the spot keeps it."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return
    if callable(signal.getsignal(signal.SIGTERM)):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)


def _exit_status(status: int) -> int:
    """`status`, or, in one process of a launched data-parallel run, an exit with it that leaves the process
    group first (train/distributed.exit_launched says why); only a process that imported torch.distributed
    can be one."""
    if "torch.distributed" not in sys.modules:
        return status
    from .train.distributed import exit_launched

    return exit_launched(status)


def _import(module_name: str, name: str):
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name == module_name:
            print(f"tunelab {name}: this command is not available in this build", file=sys.stderr)
            sys.exit(2)
        raise


if __name__ == "__main__":
    sys.exit(main())
