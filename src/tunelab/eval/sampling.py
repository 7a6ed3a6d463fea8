"""Batched decoding with a KV cache, our own loop over the model's forward: the sampled completions of GRPO
(temperature, top-p) and the greedy ones of `tunelab eval` (temperature 0), the same code on CPU and CUDA.

Prompts are left-padded so every row's next token sits in the last column; the prefill computes the logits of that
column only (`logits_to_keep=1`), then each step feeds one token per row through transformers' DynamicCache. A row
stops at its first stop id (kept: the model is trained to write it) or at `max_new_tokens`, where it counts as
clipped; the batch stops when every row has. Rows that share a prompt (GRPO's G completions of each) share its
prefill: the distinct prompts are prefilled once and their cache rows and last logits copied to every row that
repeats them, a G-th of the prefill's compute. On CPUs that compute in fp32 the weights are reordered once per call
for products with few rows (model/prepack.py). Not `model.generate`: its per-step processors and checks cost more
than the step on a small model, and GRPO needs the sampler's own random generator (checkpointed for resume).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers import DynamicCache

from ..model.prepack import prepacked


@dataclass(frozen=True)
class Samples:
    ids: list[list[int]]  # each completion's tokens, its stop token included when it stopped
    clipped: list[bool]  # the completion reached max_new_tokens without a stop


def pick(logits: torch.Tensor, temperature: float, top_p: float, generator: torch.Generator | None) -> torch.Tensor:
    """One token per row from fp32 `logits` (B, V): the argmax at temperature 0, else a draw from the
    temperature-scaled distribution cut to its top-p nucleus (Holtzman et al. 2020, §3.1)."""
    if temperature == 0:
        return logits.argmax(-1)
    probs = torch.softmax(logits / temperature, dim=-1)
    if top_p < 1.0:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        # Keep the smallest prefix whose mass reaches top_p: a token is dropped when the mass before it already does.
        drop = sorted_probs.cumsum(-1) - sorted_probs >= top_p
        sorted_probs = sorted_probs.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
    return draw(probs, generator)


def draw(weights: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One index per row of non-negative `weights` (B, V), with probability proportional to its weight: the first
    index whose running sum exceeds a uniform draw times the row's total (inverse-CDF sampling). One uniform per
    row, where torch.multinomial draws an exponential per vocabulary entry (15% of a CPU decode step on the
    embedded model; benchmarks/design-decisions_cpu_2026-11-28.md#prepacked-decode-weights). The running sum is
    fp64, so a zero weight is never drawn and the last entries keep their mass."""
    cdf = weights.double().cumsum(-1)
    u = torch.rand(weights.shape[0], 1, generator=generator, device=weights.device, dtype=torch.float64)
    index = torch.searchsorted(cdf, u * cdf[:, -1:], right=True)
    return index.squeeze(-1).clamp(max=weights.shape[-1] - 1)


@torch.no_grad()
def sample(
    model,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    stop_ids: Sequence[int],
    pad_id: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    generator: torch.Generator | None = None,
) -> Samples:
    """One completion per prompt in `prompts` (token ids), in order. `model` is a causal LM (a peft model samples
    with its adapter on); its training mode is restored after."""
    device = next(model.parameters()).device
    rows, width = len(prompts), max(len(p) for p in prompts)
    distinct, copies = (t.to(device) for t in _distinct(prompts))
    input_ids = torch.full((rows, width), pad_id, dtype=torch.long)
    attention = torch.zeros((rows, width), dtype=torch.long)
    for r, ids in enumerate(prompts):
        input_ids[r, width - len(ids) :] = torch.as_tensor(list(ids), dtype=torch.long)
        attention[r, width - len(ids) :] = 1
    input_ids, attention = input_ids.to(device), attention.to(device)
    positions = (attention.cumsum(-1) - 1).clamp(min=0)
    stops = torch.as_tensor(list(stop_ids), dtype=torch.long, device=device)
    was_training = model.training
    model.eval()
    try:
        with prepacked(model, rows):  # CPU fp32: the weights laid out once for the few-row products
            cache = DynamicCache(config=model.config)  # filled in place by each forward
            with_cache = {cache_keyword(): cache, "use_cache": True}
            out = model(
                input_ids=input_ids[distinct],
                attention_mask=attention[distinct],
                position_ids=positions[distinct],
                **with_cache,
                logits_to_keep=1,
            )
            logits = out.logits[:, -1].float()
            if len(distinct) < rows:
                cache.reorder_cache(copies)  # each row's copy of its prompt's cache
                logits = logits[copies]
            position = positions[:, -1:]
            done = torch.zeros(rows, dtype=torch.bool, device=device)
            tokens = []
            for step in range(max_new_tokens):
                token = pick(logits, temperature, top_p, generator).masked_fill(done, pad_id)
                tokens.append(token)
                done = done | torch.isin(token, stops)
                if step == max_new_tokens - 1 or bool(done.all()):
                    break
                attention = torch.cat([attention, attention.new_ones(rows, 1)], dim=1)
                position = position + 1
                out = model(
                    input_ids=token[:, None],
                    attention_mask=attention,
                    position_ids=position,
                    **with_cache,
                )
                logits = out.logits[:, -1].float()
    finally:
        model.train(was_training)
    table = torch.stack(tokens, dim=1).tolist() if tokens else [[] for _ in range(rows)]
    stop_set = set(int(s) for s in stop_ids)
    ids, clipped = [], []
    for row in table:
        end = next((k for k, t in enumerate(row) if t in stop_set), None)
        ids.append(row if end is None else row[: end + 1])
        clipped.append(end is None)
    return Samples(ids, clipped)


@functools.cache
def cache_keyword() -> str:
    """The keyword decoder forwards take their KV cache under: `cache` where transformers renamed it, else
    `past_key_values` (transformers 5.17, which GPU hosts have, swallows an unknown `cache` into its kwargs and
    decodes every step without the earlier tokens)."""
    from transformers import LlamaModel

    return "cache" if "cache" in inspect.signature(LlamaModel.forward).parameters else "past_key_values"


def _distinct(prompts: Sequence[Sequence[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """(the rows of the distinct prompts, in first-seen order; for every row, its prompt's index among them)."""
    first: dict[tuple[int, ...], int] = {}
    distinct, copies = [], []
    for r, ids in enumerate(prompts):
        key = tuple(ids)
        if key not in first:
            first[key] = len(distinct)
            distinct.append(r)
        copies.append(first[key])
    return torch.as_tensor(distinct, dtype=torch.long), torch.as_tensor(copies, dtype=torch.long)
