"""The one exception type a user sees.

Anything raised as `TunelabError` is a problem with the user's input or environment: the CLI prints
its message on one line and exits non-zero, without a traceback. Everything else is a bug in tunelab
and keeps its traceback.
"""


class TunelabError(Exception):
    """A user-facing error whose message names the file, line or key and what to do."""


class OutOfMemory(TunelabError):
    """The device ran out of memory for a run's settings: a sweep records such a point and goes on."""
