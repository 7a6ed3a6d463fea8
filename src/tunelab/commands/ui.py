"""`tunelab ui [--runs DIR] [--port N] [--host H]`: plan, runs and the tuned model on one local web page.

Listens on 127.0.0.1 unless told otherwise; another host needs a token (--token, or one generated here and
printed in the URL), because the page starts processes and reads run files. Needs the `ui` extra.
"""

from __future__ import annotations

import argparse
import ipaddress
import secrets
import socket
from pathlib import Path

from ..errors import TunelabError

DEFAULT_PORT = 7860


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--runs", default="runs", help="the folder of run directories the page shows (default runs/)")
    p.add_argument("--configs", default="configs", help="the configs a run can start from (default configs/)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT})")
    p.add_argument("--token", help="the token every request must carry (generated when --host is not loopback)")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a host name: it may resolve to any interface
        return False


def access_token(host: str, given: str | None) -> str | None:
    """The token requests must carry: the one given; on a non-loopback host without one, a new random one."""
    if given is not None and not given.strip():
        raise TunelabError("--token is empty; give a token or leave --token out")
    if given is None and not is_loopback(host):
        return secrets.token_urlsafe(24)
    return given


def check_port(host: str, port: int) -> None:
    """Fail with one line, before the server starts, when the address is taken or not this machine's."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as s:
        try:
            s.bind((host.strip("[]"), port))
        except socket.gaierror as e:
            raise TunelabError(f"--host {host}: unknown host ({e})") from None
        except OSError as e:
            raise TunelabError(
                f"--host {host} --port {port}: cannot listen there ({e.strerror}); pick another --port"
            ) from None


def run(args: argparse.Namespace) -> int:
    try:
        import uvicorn

        from ..ui.server import build_app
    except ModuleNotFoundError as e:
        raise TunelabError(f"tunelab ui needs the ui extra ({e.name} is missing): pip install 'tunelab[ui]'") from None
    if not 0 < args.port < 65536:
        raise TunelabError(f"--port {args.port}: must be in 1..65535")
    runs = Path(args.runs)
    if runs.exists() and not runs.is_dir():
        raise TunelabError(f"--runs {runs}: not a folder")
    token = access_token(args.host, args.token)
    check_port(args.host, args.port)
    app = build_app(runs, Path(args.configs), token)
    shown = f"[{args.host}]" if ":" in args.host else args.host
    url = f"http://{shown}:{args.port}/" + (f"?token={token}" if token else "")
    print(f"tunelab ui: {url} (runs from {runs}/; Ctrl-C stops)", flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return 0
