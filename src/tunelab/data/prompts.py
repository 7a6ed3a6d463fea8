"""Prompt rows for objective grpo: each row's prompt rendered as training renders it (data/formats.py: alpaca,
completion, chat without its assistant turns), tokenized as eval tokenizes a prompt (BOS where the tokenizer adds
one, then the text), with every other field of the row kept for the rewards (an `answer` to check against).

A prompt longer than seq_len minus the completion budget (DataSpec.reserve) is counted and dropped, as a
supervised row that keeps no target is; none left is an error.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import TunelabError
from .formats import PROMPT_FORMATS, check_fields, prompt_text
from .read import read_source
from .tokenize import bos_ids


@dataclass(frozen=True)
class PromptData:
    ids: list[list[int]]  # each prompt's token ids
    texts: list[str]  # each prompt as text (what a reward function is given as `prompts`)
    rows: list[dict]  # each row's fields, the prompt's own included
    rows_read: int
    dropped: int  # prompts too long to leave room for a completion

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def longest(self) -> int:
        return max(len(p) for p in self.ids)


def prepare_prompts(spec, tokenizer) -> PromptData:
    """The prompts of `spec`'s source (a data/pipeline.DataSpec with one path, its format one of PROMPT_FORMATS)."""
    check = PROMPT_FORMATS.get(spec.format)
    if check is None:
        raise TunelabError(f"data.format {spec.format}: prompt rows are {', '.join(PROMPT_FORMATS)}")
    source = read_source(spec.path, check, spec.max_examples, spec.seq_len, spec.key)
    rows = [dict(row) for row in source.rows]
    for n, row in enumerate(rows, start=1):
        check_fields(check, row, f"{source.label}: row {n}")
    texts = [prompt_text(spec.format, spec.template, row, tokenizer) for row in rows]
    bos = bos_ids(tokenizer)
    ids = [bos + piece for piece in tokenizer(texts, add_special_tokens=False)["input_ids"]]
    limit = spec.seq_len - spec.reserve
    keep = [i for i, p in enumerate(ids) if len(p) <= limit]
    if not keep:
        raise TunelabError(
            f"{source.label}: every prompt is longer than seq_len {spec.seq_len} minus the completion budget "
            f"{spec.reserve}; raise seq_len or lower grpo.max_completion_length"
        )
    return PromptData(
        [ids[i] for i in keep], [texts[i] for i in keep], [rows[i] for i in keep], len(rows), len(rows) - len(keep)
    )
