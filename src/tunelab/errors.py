"""The one exception type a user sees.

Anything raised as `TunelabError` is a problem with the user's input or environment: the CLI prints
its message on one line and exits non-zero, without a traceback. Everything else is a bug in tunelab
and keeps its traceback.
"""


class TunelabError(Exception):
    """A user-facing error whose message names the file, line or key and what to do."""


class OutOfMemory(TunelabError):
    """The device ran out of memory for a run's settings: a sweep records such a point and goes on."""


class Terminated(BaseException):
    """The launcher ended this process (SIGTERM, as torchrun ends the others when one process fails): raised where
    the process is, so that what it holds (the output directory it created, its lock) is released on the way out.
    A BaseException, like KeyboardInterrupt, so that no `except Exception` swallows it."""
