"""`tunelab serve`'s throughput on this machine: requests/s and completion tokens/s at 1, 4 and 16 concurrent
clients, each sending chat completions one after another through the official `openai` client (greedy, a fixed
max_tokens, varied questions), against one server on the embedded SmolLM2-135M started in this process.

    flock /tmp/tunelab-cpu.lock python benchmarks/scripts/serve_bench.py --out /tmp/serve.json

Per level: a warm-up round (one request per client), then every client sends `--requests` requests; the window is
from the first send to the last answer. Prints one JSON object (also written to --out).
"""

from __future__ import annotations

import argparse
import json
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor


def serve(batch_size: int, decode: str):
    import uvicorn

    from tunelab.device import pick_device, pick_precision
    from tunelab.serve.app import build_app
    from tunelab.serve.pool import ModelPool

    device = pick_device("auto")
    precision = pick_precision("auto", device)
    pool = ModelPool("embedded", {}, device, precision)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(build_app(pool, None, batch_size, 256, decode), host="127.0.0.1", port=port, log_level="warning")
    )
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.02)
    return f"http://127.0.0.1:{port}/v1", precision.name


def level(url: str, clients: int, requests: int, max_tokens: int) -> dict:
    import openai

    def one(k: int) -> int:
        client = openai.OpenAI(base_url=url, api_key="none", max_retries=0)
        reply = client.chat.completions.create(
            model="embedded",
            messages=[{"role": "user", "content": f"Write one sentence about the number {k}."}],
            temperature=0,
            max_tokens=max_tokens,
        )
        return reply.usage.completion_tokens

    def client_loop(c: int) -> list[int]:
        return [one(c * 1000 + i) for i in range(requests)]

    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(one, range(clients)))  # warm-up
        started = time.perf_counter()
        tokens = [t for batch in pool.map(client_loop, range(clients)) for t in batch]
        seconds = time.perf_counter() - started
    return {
        "clients": clients,
        "requests": len(tokens),
        "seconds": round(seconds, 2),
        "requests_per_s": round(len(tokens) / seconds, 3),
        "completion_tokens": sum(tokens),
        "completion_tokens_per_s": round(sum(tokens) / seconds, 1),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clients", default="1,4,16")
    p.add_argument("--requests", type=int, default=4, help="requests per client per level")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--decode", default="dynamic")
    p.add_argument("--out")
    args = p.parse_args()
    url, precision = serve(args.batch_size, args.decode)
    rows = [level(url, int(c), args.requests, args.max_tokens) for c in args.clients.split(",")]
    out = {
        "model": "embedded",
        "precision": precision,
        "max_tokens": args.max_tokens,
        "batch_size": args.batch_size,
        "decode": args.decode,
        "levels": rows,
    }
    print(json.dumps(out, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
