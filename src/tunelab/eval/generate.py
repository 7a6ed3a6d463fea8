"""Batched greedy generation with the training prompt, and `evaluate`, which scores it by exact match.

Speed on CPU comes from: one `model.generate` call per batch (no per-token Python loop of our own), prompts
sorted by length so a batch holds similar lengths (little left padding), each batch stopping at the
budget of its own longest expected response. Generation runs in the weights' dtype: load the base in bf16
on AMX CPUs and Ampere GPUs (a PEFT adapter keeps its fp32 weights; peft casts around them). Autocast over
bf16 weights was slower on CPU in our measurement (shared cores, noisy), so there is none.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

from ..data.formats import prompt_text, render
from .exact_match import EvalResult, score

# Room past the longest expected response, for a model that adds a word or a space before its answer.
BUDGET_SLACK = 8
# The fastest of 16/32/64 on the embedded model on a 2-core CPU: larger batches amortise generate's per-step
# overhead (benchmarks/design-decisions_cpu_2026-11-22.md#generation-batch-size-64).
DEFAULT_BATCH_SIZE = 64


def prompt_ids(tokenizer, prompts: Sequence[str]) -> list[list[int]]:
    """Token ids exactly as training builds a row's prompt: BOS only when the tokenizer adds one, then the
    text without special tokens (data/pipeline.py tokenizes each segment the same way)."""
    bos = (
        [tokenizer.bos_token_id]
        if getattr(tokenizer, "add_bos_token", False) and tokenizer.bos_token_id is not None
        else []
    )
    return [bos + ids for ids in tokenizer(list(prompts), add_special_tokens=False)["input_ids"]]


def response_budgets(tokenizer, rows: Sequence[dict], fmt: str, template: str) -> list[int]:
    """Per row, the tokens of its expected response (the trainable text, EOS included) plus slack."""
    eos = tokenizer.eos_token or ""
    texts = ["".join(s.text for s in render(fmt, template, row, eos, tokenizer) if s.trainable) for row in rows]
    return [len(ids) + BUDGET_SLACK for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]


@torch.inference_mode()
def generate(
    model,
    tokenizer,
    prompts: Sequence[list[int]],
    budgets: Sequence[int],
    batch_size: int,
) -> list[str]:
    """Greedy continuations of tokenized prompts, in input order, each cut at EOS or its batch's budget."""
    device = next(model.parameters()).device
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    order = sorted(range(len(prompts)), key=lambda i: (len(prompts[i]), budgets[i]))
    out: list[str] = [""] * len(prompts)
    was_training = model.training
    model.eval()
    try:
        for start in range(0, len(order), batch_size):
            chunk = order[start : start + batch_size]
            width = max(len(prompts[i]) for i in chunk)
            input_ids = torch.full((len(chunk), width), pad, dtype=torch.long)
            attention = torch.zeros((len(chunk), width), dtype=torch.long)
            for row, i in enumerate(chunk):  # left padding: every prompt ends where generation starts
                ids = prompts[i]
                input_ids[row, width - len(ids) :] = torch.tensor(ids)
                attention[row, width - len(ids) :] = 1
            generated = model.generate(
                input_ids=input_ids.to(device),
                attention_mask=attention.to(device),
                do_sample=False,
                max_new_tokens=max(budgets[i] for i in chunk),
                use_cache=True,
                eos_token_id=tokenizer.eos_token_id,
                pad_token_id=pad,
            )
            texts = tokenizer.batch_decode(generated[:, width:], skip_special_tokens=True)
            for i, text in zip(chunk, texts):
                out[i] = text
    finally:
        model.train(was_training)
    return out


def evaluate(
    model,
    tokenizer,
    rows: Sequence[dict],
    fmt: str,
    template: str,
    batch_size: int = DEFAULT_BATCH_SIZE,
    max_new_tokens: int | None = None,
) -> EvalResult:
    """Exact-match accuracy of `model` on `rows` (each with an `answer`), prompted as training prompted them.

    `max_new_tokens=None` gives each batch the budget of its longest expected response. Works on a PEFT
    model in memory, so a demo can evaluate right after training; it runs in the model's dtype.
    """
    started = time.perf_counter()
    prompts = prompt_ids(tokenizer, [prompt_text(fmt, template, row, tokenizer) for row in rows])
    budgets = [max_new_tokens] * len(rows) if max_new_tokens else response_budgets(tokenizer, rows, fmt, template)
    responses = generate(model, tokenizer, prompts, budgets, batch_size)
    return score(rows, responses, time.perf_counter() - started)
