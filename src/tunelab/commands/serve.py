"""`tunelab serve [--model M] [--adapter [NAME=]PATH ...] [--host H] [--port N] [--api-key K]`: an OpenAI-compatible
server (`/v1/models`, `/v1/chat/completions`, `/v1/completions`) over one base model and its adapters, each a model
name. Listens on 127.0.0.1 unless told otherwise; another host needs an API key (--api-key, or one generated here and
printed), which clients send as `Authorization: Bearer KEY`. Needs the `ui` extra (Starlette and uvicorn).
"""

from __future__ import annotations

import argparse

from .. import decoding
from ..access import access_token, check_port, shown_host
from ..errors import TunelabError

DEFAULT_PORT = 8000


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model",
        help="the base model: embedded, an HF directory (a merged model too), a .gguf file or a cached hub id "
        "(default: the first adapter's run's base, else embedded)",
    )
    p.add_argument(
        "--adapter",
        action="append",
        default=[],
        metavar="[NAME=]PATH",
        help="a trained adapter served as model NAME (default: its run's folder name); repeat for more",
    )
    p.add_argument("--name", help="the name the base model is served under (default: its own name)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT})")
    p.add_argument("--api-key", help="the key every request must carry (generated when --host is not loopback)")
    p.add_argument("--batch-size", type=int, default=16, help="most completions generated together (default 16)")
    p.add_argument(
        "--max-tokens", type=int, default=256, help="a completion's cap when a request sets none (default 256)"
    )
    p.add_argument("--decode", choices=decoding.NAMES, default="dynamic", help="the decode loop (see tunelab eval)")
    p.add_argument("--device", default="auto")
    p.add_argument("--precision", default="auto", choices=["auto", "bf16", "fp16", "fp32"])


def run(args: argparse.Namespace) -> int:
    try:
        import uvicorn

        from ..serve.app import build_app
    except ModuleNotFoundError as e:
        raise TunelabError(
            f"tunelab serve needs the ui extra ({e.name} is missing): pip install 'tunelab[ui]'"
        ) from None
    for name in ("batch_size", "max_tokens"):
        if getattr(args, name) < 1:
            raise TunelabError(f"--{name.replace('_', '-')} {getattr(args, name)}: must be at least 1")
    key = access_token(args.host, args.api_key, "--api-key")
    check_port(args.host, args.port)  # before the model loads: a taken port is one line at once

    from ..device import pick_device, pick_precision
    from ..eval.setup import resolve_setup
    from ..serve.pool import ModelPool, parse_adapters

    adapters = parse_adapters(args.adapter)
    base = args.model or (resolve_setup(next(iter(adapters.values())), None, None, None).model if adapters else None)
    device = pick_device(args.device)
    pool = ModelPool(base or "embedded", adapters, device, pick_precision(args.precision, device), args.name)
    app = build_app(pool, key, args.batch_size, args.max_tokens, args.decode)
    url = f"http://{shown_host(args.host)}:{args.port}/v1"
    print(f"tunelab serve: {url} models {', '.join(pool.names())} (Ctrl-C stops)", flush=True)
    if key and not args.api_key:
        print(f"API key: {key} (send Authorization: Bearer KEY)", flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return 0
