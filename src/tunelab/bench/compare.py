"""Tunelab's throughput and memory over its peers', from records of interleaved runs (torch-free: `tunelab
report` reads stored records without the training stack)."""

from __future__ import annotations

import statistics
from typing import Any

from ..errors import TunelabError


def _mean(values: list[float]) -> float:
    return statistics.fmean(values) if values else float("nan")


def compare(records: list[dict]) -> list[dict]:
    """Per peer kind: tunelab's throughput and memory over the peer's, from interleaved runs.

    `records` holds tunelab's runs (`kind` == "tunelab", or no kind: a train summary) and the peers' runs.
    Each side's figure is the mean over its runs, so interleaving (tunelab, A, B, tunelab, ...) spreads the
    drift of a shared machine over both. Ratios are tunelab / peer: a throughput ratio above 1 means tunelab
    is faster, a memory ratio below 1 means tunelab needs less. `tokens_nonpad_ratio` is the headline (real
    tokens per second, which padding cannot inflate); the padded and loss-token ratios are kept because peers
    are often quoted by one of those. Returns one dict per peer kind, in order of first appearance.
    """
    ours = [r for r in records if r.get("kind", "tunelab") == "tunelab"]
    if not ours:
        raise TunelabError("compare: no tunelab run among the records; run tunelab alongside its peers")
    kinds = list(dict.fromkeys(r["kind"] for r in records if r.get("kind", "tunelab") != "tunelab"))
    metrics = ("tokens_nonpad_per_s", "tokens_padded_per_s", "tokens_loss_per_s", "peak_memory_bytes")
    base = {m: _mean([r[m] for r in ours]) for m in metrics}
    rows = []
    for kind in kinds:
        theirs = [r for r in records if r.get("kind") == kind]
        peer = {m: _mean([r[m] for r in theirs]) for m in metrics}
        row: dict[str, Any] = {
            "kind": kind,
            "runs": len(theirs),
            "tunelab_runs": len(ours),
            "tunelab_tokens_nonpad_per_s_runs": [r["tokens_nonpad_per_s"] for r in ours],
        }
        for m in metrics:
            row[f"tunelab_{m}"] = base[m]
            row[m] = peer[m]
        for m, key in (
            ("tokens_nonpad_per_s", "tokens_nonpad_ratio"),
            ("tokens_padded_per_s", "tokens_padded_ratio"),
            ("tokens_loss_per_s", "tokens_loss_ratio"),
            ("peak_memory_bytes", "peak_memory_ratio"),
        ):
            row[key] = base[m] / peer[m] if peer[m] else float("nan")
        rows.append(row)
    return rows
