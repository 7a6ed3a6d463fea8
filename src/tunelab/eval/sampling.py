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

import contextlib
import functools
import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from transformers import DynamicCache

from .. import decoding
from ..model.prepack import prepacked


@dataclass(frozen=True)
class Samples:
    ids: list[list[int]]  # each completion's tokens, its stop token included when it stopped
    clipped: list[bool]  # the completion reached max_new_tokens without a stop
    # With `logprobs`: each token's log-probability under the distribution it was drawn from (the logits at the
    # sampling temperature; at temperature 0 the model's own), as TRL's GRPOTrainer scores completions.
    logps: list[list[float]] | None = None


def pick(
    logits: torch.Tensor,
    temperature: float,
    top_p: float,
    generator: torch.Generator | None,
    rows: tuple[int, int] | None = None,
) -> torch.Tensor:
    """One token per row from fp32 `logits` (B, V): the argmax at temperature 0, else a draw from the
    temperature-scaled distribution cut to its top-p nucleus (Holtzman et al. 2020, §3.1). `rows` (draw's)."""
    if temperature == 0:
        return logits.argmax(-1)
    probs = torch.softmax(logits / temperature, dim=-1)
    if top_p < 1.0:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        # Keep the smallest prefix whose mass reaches top_p: a token is dropped when the mass before it already does.
        drop = sorted_probs.cumsum(-1) - sorted_probs >= top_p
        sorted_probs = sorted_probs.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
    return draw(probs, generator, rows)


def draw(weights: torch.Tensor, generator: torch.Generator | None, rows: tuple[int, int] | None = None) -> torch.Tensor:
    """One index per row of non-negative `weights` (B, V), with probability proportional to its weight: the first
    index whose running sum exceeds a uniform draw times the row's total (inverse-CDF sampling). One uniform per
    row, where torch.multinomial draws an exponential per vocabulary entry (15% of a CPU decode step on the
    embedded model; benchmarks/design-decisions_cpu_2026-11-28.md#prepacked-decode-weights). The running sum is
    fp64, so a zero weight is never drawn and the last entries keep their mass.

    `rows` (first, total): these B rows are rows first.. of a batch of `total` that other processes share; the
    uniforms of the whole batch are drawn and these rows take theirs, so each row draws what it would in one
    process sampling the whole batch."""
    cdf = weights.double().cumsum(-1)
    first, total = rows if rows is not None else (0, weights.shape[0])
    u = torch.rand(total, 1, generator=generator, device=weights.device, dtype=torch.float64)
    u = u[first : first + weights.shape[0]]
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
    decode: str = decoding.AUTO,
    share: tuple[int, int] | None = None,
    all_done: Callable[[bool], bool] | None = None,
    logprobs: bool = False,
    on_step: Callable[[torch.Tensor], torch.Tensor | None] | None = None,
) -> Samples:
    """One completion per prompt in `prompts` (token ids), in order: the one generation step of eval, GRPO, the
    page's Try it and `tunelab serve`. `model` is a causal LM (a peft model samples with its adapter on); its
    training mode is restored after. `decode`: decoding.py's mode. It runs without autograd (so activation
    checkpointing is inert), in eval mode, over prepacked weights (model/prepack.py; a compiled policy's too; not the
    compiled mode's), and with the policy's compiled blocks eager (`policy_eager`): their graphs are the update's;
    only the compiled mode's own step is compiled. Several processes sampling shares of one batch: `share` (first,
    total) places this share in it (draw's `rows`), and `all_done(done)` says whether every process's rows are done,
    so all take the same decode steps (and random draws) as one process sampling the whole batch. `logprobs`: each
    token's log-prob too. `on_step`, when given, sees each step's tokens (rows,; a finished row's is `pad_id`) as
    they are drawn, and may return a bool tensor of rows to end there (`tunelab serve`: a stop string written, a
    client gone); such a row's later tokens are pads."""
    device = next(model.parameters()).device
    mode = decoding.resolve(decode, device.type)
    rows, width = len(prompts), max(len(p) for p in prompts)
    input_ids = torch.full((rows, width), pad_id, dtype=torch.long)
    attention = torch.zeros((rows, width), dtype=torch.long)
    for r, ids in enumerate(prompts):
        input_ids[r, width - len(ids) :] = torch.as_tensor(list(ids), dtype=torch.long)
        attention[r, width - len(ids) :] = 1
    batch = _Batch(input_ids.to(device), attention.to(device), *(t.to(device) for t in _distinct(prompts)))
    stops = torch.as_tensor(list(stop_ids), dtype=torch.long, device=device)
    was_training = model.training
    model.eval()
    try:
        # CPU: the weights laid out once for the few-row products (a compiled policy's LoRA layers packed too); the
        # compiled mode's step is inductor's own products over the plain weights.
        packing = contextlib.nullcontext() if mode.compiled else prepacked(model, rows)
        with packing, policy_eager(), no_router_loss(model):
            if mode.static_cache:
                logits, step = _static_steps(model, batch, max_new_tokens, mode.compiled)
            else:
                logits, step = _dynamic_steps(model, batch)
            done = torch.zeros(rows, dtype=torch.bool, device=device)
            tokens, scores = [], []
            for k in range(max_new_tokens):
                token = pick(logits, temperature, top_p, generator, share).masked_fill(done, pad_id)
                tokens.append(token)
                if logprobs:
                    scaled = logits if temperature == 0 else logits / temperature
                    scores.append(torch.log_softmax(scaled, dim=-1).gather(-1, token[:, None]).squeeze(-1))
                done = done | torch.isin(token, stops)
                if on_step is not None:
                    ended = on_step(token)
                    if ended is not None:
                        done = done | ended.to(device)
                finished = bool(done.all())
                if all_done is not None:
                    finished = all_done(finished)
                if k == max_new_tokens - 1 or finished:
                    break
                logits = step(token)
    finally:
        model.train(was_training)
    table = torch.stack(tokens, dim=1).tolist() if tokens else [[] for _ in range(rows)]
    score_table = torch.stack(scores, dim=1).tolist() if scores else None
    stop_set = set(int(s) for s in stop_ids)
    ids, clipped, logps = [], [], []
    for r, row in enumerate(table):
        end = next((k for k, t in enumerate(row) if t in stop_set), None)
        ids.append(row if end is None else row[: end + 1])
        clipped.append(end is None)
        if score_table is not None:
            logps.append(score_table[r][: len(ids[-1])])
    return Samples(ids, clipped, logps if logprobs else None)


def policy_eager():
    """The policy's compiled blocks (recipes' compile_blocks) run eager: a decode step (one token a row over a
    growing cache) and a prefill are shapes of their own that would compile the blocks again at each new one. The
    compiled mode's step (`_compiled_decode_step`) sets its own stance and traces through the blocks as plain
    modules."""
    return torch.compiler.set_stance("force_eager")


@dataclass(frozen=True)
class _Batch:
    input_ids: torch.Tensor  # (rows, width), left-padded
    attention: torch.Tensor  # (rows, width), 1 on prompt tokens
    distinct: torch.Tensor  # the rows of the distinct prompts
    copies: torch.Tensor  # for every row, its prompt's index among them

    @property
    def positions(self) -> torch.Tensor:
        return (self.attention.cumsum(-1) - 1).clamp(min=0)


def _dynamic_steps(model, batch: _Batch):
    """(the prefill's last logits, a step function token -> next logits) over a DynamicCache that grows by one
    position a step; the distinct prompts are prefilled once and their cache rows copied to the rows repeating them."""
    cache = DynamicCache(config=model.config)  # filled in place by each forward
    with_cache = {cache_keyword(): cache, "use_cache": True}
    d = batch.distinct
    out = model(
        input_ids=batch.input_ids[d],
        attention_mask=batch.attention[d],
        position_ids=batch.positions[d],
        **with_cache,
        logits_to_keep=1,
    )
    logits = out.logits[:, -1].float()
    if len(d) < batch.input_ids.shape[0]:
        cache.reorder_cache(batch.copies)  # each row's copy of its prompt's cache
        logits = logits[batch.copies]
    state = {"attention": batch.attention, "position": batch.positions[:, -1:]}

    def step(token: torch.Tensor) -> torch.Tensor:
        state["attention"] = torch.cat([state["attention"], state["attention"].new_ones(len(token), 1)], dim=1)
        state["position"] = state["position"] + 1
        out = model(
            input_ids=token[:, None], attention_mask=state["attention"], position_ids=state["position"], **with_cache
        )
        return out.logits[:, -1].float()

    return logits, step


@contextlib.contextmanager
def no_router_loss(model):
    """An MoE model whose config.json sets output_router_logits samples without its router loss: transformers
    would compute it at every step against the whole attention mask, which a cached step's router logits (its new
    token's only) do not match (a shape error), and sampling has no use for it."""
    config = model.config
    before = getattr(config, "output_router_logits", None)
    if not before:
        yield
        return
    config.output_router_logits = False
    try:
        yield
    finally:
        config.output_router_logits = before


# A static cache's length is rounded up to a multiple of this, so a compiled step sees few distinct shapes.
STATIC_LENGTH_QUANTUM = 64


def _static_steps(model, batch: _Batch, max_new_tokens: int, compiled: bool):
    """(the prefill's last logits, a step function token -> next logits) over a StaticCache of `rows x length` (the
    prompts' width plus the cap, rounded up): every step has the same shapes; the attention mask is allocated once
    at full length (positions past the current one are hidden by causality). Every row is prefilled (a static
    cache's batch is fixed by its first write), and the cache is kept on the model and reset for the next call of
    the same shape, so a compiled step's static addresses stay the same."""
    rows, width = batch.input_ids.shape
    length = -(-(width + max_new_tokens) // STATIC_LENGTH_QUANTUM) * STATIC_LENGTH_QUANTUM
    cache = _static_cache(model, rows, length)
    mask = batch.attention.new_ones(rows, length)
    mask[:, :width] = batch.attention
    positions = batch.positions
    out = model(
        input_ids=batch.input_ids,
        attention_mask=mask,
        position_ids=positions,
        **{cache_keyword(): cache, "use_cache": True},
        logits_to_keep=1,
    )
    forward = _compiled_decode_step() if compiled else _decode_step
    state = {"position": positions[:, -1:]}

    def step(token: torch.Tensor) -> torch.Tensor:
        state["position"] = state["position"] + 1
        if not compiled:
            return forward(model, token[:, None], mask, state["position"], cache)
        if token.device.type == "cuda":
            torch.compiler.cudagraph_mark_step_begin()  # the last replay's outputs were read; reuse its buffers
        with torch.compiler.set_stance("default"):  # inside policy_eager: this step is compiled
            return forward(model, token[:, None], mask, state["position"], cache)

    return out.logits[:, -1].float(), step


def _decode_step(model, token, mask, position, cache) -> torch.Tensor:
    out = model(
        input_ids=token, attention_mask=mask, position_ids=position, **{cache_keyword(): cache, "use_cache": True}
    )
    return out.logits[:, -1].float().clone()  # a CUDA graph's output buffer is overwritten by its next replay


@functools.cache
def _compiled_decode_step():
    """`_decode_step` under torch.compile, made once per process: CUDA graphs on CUDA (mode reduce-overhead), fixed
    shapes (one graph per rows x length)."""
    return torch.compile(_decode_step, mode="reduce-overhead", dynamic=False)


def _static_cache(model, rows: int, length: int):
    """The model's StaticCache for `rows x length`, reset, made on first use of that shape and kept on the model."""
    from transformers import StaticCache

    kept = getattr(model, "_tunelab_static_caches", None)
    if kept is None:
        kept = {}
        model._tunelab_static_caches = kept
    key = (rows, length)
    if key not in kept:
        kept[key] = StaticCache(config=model.config, max_cache_len=length)
    else:
        kept[key].reset()
    return kept[key]


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
