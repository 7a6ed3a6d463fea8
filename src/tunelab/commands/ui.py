"""`tunelab ui [--runs DIR] [--port N] [--host H]`: plan, runs and the tuned model on one local web page.

Listens on 127.0.0.1 unless told otherwise; another host needs a token (--token, or one generated here and
printed in the URL), because the page starts processes and reads run files. Needs the `ui` extra.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ..access import access_token, check_port, shown_host
from ..errors import TunelabError

DEFAULT_PORT = 7860


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--runs", default="runs", help="the folder of run directories the page shows (default runs/)")
    p.add_argument("--configs", default="configs", help="the configs a run can start from (default configs/)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT})")
    p.add_argument("--token", help="the token every request must carry (generated when --host is not loopback)")


def run(args: argparse.Namespace) -> int:
    try:
        import uvicorn

        from ..ui.server import build_app
    except ModuleNotFoundError as e:
        raise TunelabError(f"tunelab ui needs the ui extra ({e.name} is missing): pip install 'tunelab[ui]'") from None
    runs = Path(args.runs)
    if runs.exists() and not runs.is_dir():
        raise TunelabError(f"--runs {runs}: not a folder")
    token = access_token(args.host, args.token)
    check_port(args.host, args.port)
    app = build_app(runs, Path(args.configs), token)
    url = f"http://{shown_host(args.host)}:{args.port}/" + (f"?token={token}" if token else "")
    print(f"tunelab ui: {url} (runs from {runs}/; Ctrl-C stops)", flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return 0
