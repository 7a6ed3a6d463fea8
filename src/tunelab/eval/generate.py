"""Batched greedy generation with the training prompt, and `evaluate`, which scores it by exact match.

Generation is eval/sampling.py's KV-cache loop at temperature 0 (the one generation step GRPO samples with and the
page's Try it answers with): prompts sorted by
length so a batch holds similar lengths (little left padding), each row stopping at its own EOS, the batch when
every row has or at its cap. The cap is what the model was trained to write (the longest training response, from
the run's summary.json, plus slack) when that is known, else `--max-new-tokens`, else the longest expected
response of the batch's rows plus slack; how many completions reached the cap is reported, since a completion cut
there is scored as written. Generation runs in the weights' dtype (bf16 on AMX CPUs and Ampere GPUs; a PEFT
adapter keeps its fp32 weights, peft casts around them).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .. import decoding
from ..data.formats import CONVERSATION_FORMATS, effective_chat_template, prompt_text, render
from ..data.tokenize import bos_ids
from ..model.prepack import prepacked
from .exact_match import EvalResult, score
from .sampling import sample

# Room past the longest expected response, for a model that adds a word or a space before its answer.
BUDGET_SLACK = 8
# The fastest of 16/32/64 on the embedded model on a 2-core CPU: larger batches amortise generate's per-step
# overhead (benchmarks/design-decisions_cpu_2026-11-22.md#generation-batch-size-64).
DEFAULT_BATCH_SIZE = 64
# End-of-turn markers of chat templates (ChatML, Llama-3, Gemma): a tuned chat model ends its answer with the
# template's marker, which need not be the tokenizer's EOS (Qwen2.5 base: `<|endoftext|>`).
END_OF_TURN = ("<|im_end|>", "<|eot_id|>", "<end_of_turn>")


@dataclass(frozen=True)
class Stops:
    """Where a response ends: any of `ids` (generation stops there), or the first of `texts` in the decoded
    text (a marker the tokenizer splits into several tokens, which training taught as plain text)."""

    ids: tuple[int, ...]
    texts: tuple[str, ...] = ()


def stops(model, tokenizer, fmt: str | None = None) -> Stops:
    """The tokenizer's EOS, the model's generation_config EOS ids, and, for a conversation format, the
    end-of-turn marker of the chat template its prompts are rendered with."""
    ids: list[int] = []
    config = getattr(model, "generation_config", None)
    for found in (tokenizer.eos_token_id, getattr(config, "eos_token_id", None)):
        for i in found if isinstance(found, (list, tuple)) else [found]:
            if i is not None and int(i) not in ids:
                ids.append(int(i))
    texts: list[str] = []
    if fmt in CONVERSATION_FORMATS:
        template = effective_chat_template(tokenizer)
        for marker in (m for m in END_OF_TURN if m in template):
            single = tokenizer(marker, add_special_tokens=False)["input_ids"]
            if len(single) == 1 and tokenizer.convert_tokens_to_ids(marker) == single[0]:
                if single[0] not in ids:
                    ids.append(single[0])
            else:
                texts.append(marker)
    return Stops(tuple(ids), tuple(texts))


def prompt_ids(tokenizer, prompts: Sequence[str]) -> list[list[int]]:
    """Token ids exactly as training builds a row's prompt (data/tokenize.py): BOS only when the tokenizer adds one,
    then the text without special tokens."""
    bos = bos_ids(tokenizer)
    return [bos + ids for ids in tokenizer(list(prompts), add_special_tokens=False)["input_ids"]]


def response_budgets(tokenizer, rows: Sequence[dict], fmt: str, template: str) -> list[int]:
    """Per row, the tokens of its expected response (the trainable text, EOS included) plus slack."""
    eos = tokenizer.eos_token or ""
    texts = ["".join(s.text for s in render(fmt, template, row, eos, tokenizer) if s.trainable) for row in rows]
    return [len(ids) + BUDGET_SLACK for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]


def generation_caps(
    tokenizer,
    rows: Sequence[dict],
    fmt: str,
    template: str,
    max_new_tokens: int | None = None,
    trained_response_tokens: int | None = None,
) -> list[int]:
    """Each row's generation cap: `max_new_tokens`, else `trained_response_tokens` (the longest response the model
    was trained on) plus slack, else its own expected response plus slack."""
    if max_new_tokens:
        return [max_new_tokens] * len(rows)
    if trained_response_tokens:
        return [trained_response_tokens + BUDGET_SLACK] * len(rows)
    return response_budgets(tokenizer, rows, fmt, template)


@dataclass(frozen=True)
class Generated:
    texts: list[str]  # each row's response, cut before its first stop
    capped: list[bool]  # the response reached its cap without a stop


@torch.inference_mode()
def generate(
    model,
    tokenizer,
    prompts: Sequence[list[int]],
    budgets: Sequence[int],
    batch_size: int,
    stop: Stops | None = None,
    temperature: float = 0.0,
    generator: torch.Generator | None = None,
    decode: str = "dynamic",
) -> Generated:
    """Greedy continuations of tokenized prompts, in input order, each cut before its first stop (default: the
    EOS ids of `stops`) or at its batch's largest budget; a row stops on its own while the rest of its batch goes on.
    `temperature` > 0 samples instead (`tunelab ui`'s Try it, `tunelab data pairs`), from the model's distribution
    at that temperature, drawing from `generator` when given."""
    stop = stop or stops(model, tokenizer)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (stop.ids or [0])[0]
    order = sorted(range(len(prompts)), key=lambda i: (len(prompts[i]), budgets[i]))
    texts: list[str] = [""] * len(prompts)
    capped: list[bool] = [False] * len(prompts)
    # Weights laid out once for every batch (CPU; model/prepack.py); sample() reuses them. Not for the compiled
    # mode, whose step traces the plain weights.
    compiled = decoding.resolve(decode, next(model.parameters()).device.type).compiled
    with contextlib.nullcontext() if compiled else prepacked(model, min(batch_size, len(prompts))):
        for start in range(0, len(order), batch_size):
            chunk = order[start : start + batch_size]
            out = sample(
                model,
                [prompts[i] for i in chunk],
                max(budgets[i] for i in chunk),
                stop.ids,
                pad,
                temperature=temperature,
                generator=generator,
                decode=decode,
            )
            rows = [_until(ids, stop.ids) for ids in out.ids]
            for i, text, cut in zip(chunk, tokenizer.batch_decode(rows, skip_special_tokens=True), out.clipped):
                for marker in stop.texts:
                    text = text.split(marker, 1)[0]
                texts[i], capped[i] = text, cut
    return Generated(texts, capped)


def _until(ids: list[int], stop_ids: Sequence[int]) -> list[int]:
    return next((ids[:k] for k, i in enumerate(ids) if i in stop_ids), ids)


def evaluate(
    model,
    tokenizer,
    rows: Sequence[dict],
    fmt: str,
    template: str,
    batch_size: int = DEFAULT_BATCH_SIZE,
    max_new_tokens: int | None = None,
    trained_response_tokens: int | None = None,
    decode: str = "dynamic",
) -> EvalResult:
    """Exact-match accuracy of `model` on `rows` (each with an `answer`), prompted as training prompted them.

    The cap: `max_new_tokens`, else `trained_response_tokens` (the longest response the model was trained on) plus
    slack, else each batch's longest expected response plus slack. `decode`: decoding.py's mode (dynamic by
    default: an evaluation is too short for a compile to pay for itself, and its batches change shape). Works on a PEFT
    model in memory, so a demo can evaluate right after training; it runs in the model's dtype.
    """
    started = time.perf_counter()
    prompts = prompt_ids(tokenizer, [prompt_text(fmt, template, row, tokenizer) for row in rows])
    caps = generation_caps(tokenizer, rows, fmt, template, max_new_tokens, trained_response_tokens)
    out = generate(model, tokenizer, prompts, caps, batch_size, stops(model, tokenizer, fmt), decode=decode)
    result = score(rows, out.texts, time.perf_counter() - started)
    result.capped = sum(out.capped)
    return result
