"""On-policy preference pairs: a model's own wrong answers to prompts whose answers are known, each set against
the row's reference response (`tunelab data pairs`).

Why: DPO learns from the difference between a pair's two responses under the model being tuned. A rejected
answer the model never writes (a generated near miss) holds little to learn, and pushing it down costs the
chosen answers likelihood too (benchmarks/preference/quickstart-dpo_xeon-amx-2c_2026-11-26.md). The model's own
mistakes are where its probability mass actually goes wrong. The completions come from the generation code
`tunelab eval` scores with (eval/generate.py, the KV-cache sampler GRPO samples with), the prompt rendered as
training rendered it; a completion is wrong when exact match (eval/exact_match.py) says so.

A prompt gets one pair per distinct wrong completion (chosen: the row's reference response, rejected: the
completion as the model wrote it, cut before its stop); a prompt answered right every time gives none.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..data.formats import CONVERSATION_FORMATS, conversation, prompt_text
from ..errors import TunelabError
from .exact_match import extract, parse_answer
from .generate import generate, generation_caps, prompt_ids, stops

# The row formats a pair can be written for: the pair's prompt renders exactly as generation prompted it.
FORMATS = ("alpaca", "completion", *CONVERSATION_FORMATS)


@dataclass(frozen=True)
class PairCounts:
    """What became of the sampled completions."""

    prompts: int
    completions: int
    right: int  # completions whose answer matched
    all_right: int  # prompts answered right in every sample: no pair, skipped
    repeats: int  # wrong completions identical to an earlier one of the same prompt, dropped
    empty: int  # completions with no text (a stop at once): nothing to reject
    capped: int  # completions that reached the generation cap, kept as written
    pairs: int

    def line(self) -> str:
        return (
            f"{self.right} of {self.completions} completions right; {self.all_right} of {self.prompts} prompts "
            f"answered right every time (skipped); {self.repeats} repeated and {self.empty} empty wrong "
            f"completions dropped; {self.capped} reached the cap"
        )


def pair_parts(fmt: str, row: dict[str, Any], where: str) -> tuple[str | list, str]:
    """(the pair's prompt, the reference response) of a row, in the {prompt, chosen, rejected} layout whose
    rendering (data/formats.render_pair_side) is the prompt generation used."""
    if fmt == "alpaca":
        if row.get("input"):
            raise TunelabError(
                f"{where}: the row has an 'input', which a pair's alpaca prompt cannot carry; "
                "fold it into the instruction"
            )
        return str(row["instruction"]), str(row["output"])
    if fmt == "completion":
        return str(row["prompt"]), str(row["completion"])
    if fmt in CONVERSATION_FORMATS:
        messages = conversation(fmt, row)
        roles = [m.get("role") for m in messages]
        if roles[-1] != "assistant" or "assistant" in roles[:-1]:
            raise TunelabError(
                f"{where}: on-policy pairs need one assistant turn, the last, as the reference answer; "
                f"this conversation has {roles.count('assistant')} or does not end with one"
            )
        return [dict(m) for m in messages[:-1]], str(messages[-1].get("content") or "")
    raise TunelabError(f"--format {fmt}: on-policy pairs are made from {', '.join(FORMATS)} rows")


def build_pairs(
    rows: Sequence[dict], fmt: str, completions: Sequence[Sequence[str]], capped: int = 0, label: str = "--data"
) -> tuple[list[dict], PairCounts]:
    """The pairs of each row's wrong completions (`completions[i]`: row i's samples), and the counts."""
    pairs: list[dict] = []
    right = all_right = repeats = empty = 0
    for number, (row, texts) in enumerate(zip(rows, completions, strict=True), 1):
        prompt, reference = pair_parts(fmt, row, f"{label} row {number}")
        truth = parse_answer(row["answer"])
        seen: set[str] = set()
        wrong = 0
        for text in texts:
            if extract(text, len(truth)) == truth:
                right += 1
                continue
            wrong += 1
            if not text.strip():
                empty += 1
            elif text in seen or text == reference:
                repeats += 1
            else:
                seen.add(text)
                pairs.append({"prompt": prompt, "chosen": reference, "rejected": text, "answer": str(row["answer"])})
        all_right += wrong == 0
    total = sum(len(t) for t in completions)
    return pairs, PairCounts(len(rows), total, right, all_right, repeats, empty, capped, len(pairs))


@dataclass(frozen=True)
class Sampling:
    """How the completions are drawn: `samples` per prompt at `temperature` (0: greedy, one sample), from a
    generator seeded with `seed`; the cap as `tunelab eval` sets it."""

    samples: int = 4
    temperature: float = 1.0
    seed: int = 0
    batch_size: int = 64
    max_new_tokens: int | None = None
    trained_response_tokens: int | None = None


def check_sampling(sampling: Sampling) -> None:
    if sampling.samples < 1:
        raise TunelabError(f"--samples {sampling.samples}: must be at least 1")
    if sampling.temperature < 0:
        raise TunelabError(f"--temperature {sampling.temperature}: must be 0 (greedy) or above")
    if sampling.temperature == 0 and sampling.samples > 1:
        raise TunelabError(
            f"--samples {sampling.samples} at --temperature 0: greedy decoding writes one completion per prompt; "
            "set --samples 1 or a temperature above 0"
        )


def sample_pairs(
    model, tokenizer, rows: Sequence[dict], fmt: str, template: str, sampling: Sampling, label: str = "--data"
) -> tuple[list[dict], PairCounts]:
    """Sample `model`'s completions of every row's prompt and pair its wrong ones against the reference; none
    left is an error naming `label`."""
    import torch

    check_sampling(sampling)
    for number, row in enumerate(rows, 1):  # a bad row fails before minutes of generation
        pair_parts(fmt, row, f"{label} row {number}")
    k = sampling.samples
    prompts = prompt_ids(tokenizer, [prompt_text(fmt, template, row, tokenizer) for row in rows])
    caps = generation_caps(tokenizer, rows, fmt, template, sampling.max_new_tokens, sampling.trained_response_tokens)
    generator = torch.Generator(device=next(model.parameters()).device).manual_seed(sampling.seed)
    out = generate(
        model,
        tokenizer,
        [p for p in prompts for _ in range(k)],  # a prompt's samples side by side: they share its prefill
        [c for c in caps for _ in range(k)],
        sampling.batch_size,
        stops(model, tokenizer, fmt),
        temperature=sampling.temperature,
        generator=generator,
    )
    completions = [out.texts[i * k : (i + 1) * k] for i in range(len(rows))]
    pairs, counts = build_pairs(rows, fmt, completions, sum(out.capped), label)
    if not pairs:
        raise TunelabError(
            f"{label}: the model answered all {len(rows)} prompts right in every one of {k} samples, so there is no "
            "wrong answer to pair; use more or harder prompts, more --samples or a higher --temperature"
        )
    return pairs, counts
