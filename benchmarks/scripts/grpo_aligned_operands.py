"""Run 29's second reward (weight 0.25), named `configs/rewards/arithmetic.py:aligned_operands` in its worktree and
not shipped: it did not raise the gain. A user's reward as any is written: TRL's signature, one float per completion,
the row's fields as keyword lists aligned with the completions."""

import re

EXPRESSION = re.compile(r"\s*(\d+) \+ (\d+) =")


def aligned_operands(prompts, completions, completion_ids=None, a=None, b=None, **rows) -> list[float | None]:
    """1 when the completion restates both operands zero-padded to the longer one's width (`00846`), the layout the
    quickstart trained, whatever its sum; 0 otherwise; None for a row without operands. The SFT model's own errors are
    mostly here: a pad one zero too long or short that shifts the columns it then adds."""
    if a is None or b is None:
        raise ValueError("the rows have no fields 'a' and 'b' (tunelab data arithmetic --prompts writes them)")
    out: list[float | None] = []
    for text, x, y in zip(completions, a, b):
        if x is None or y is None:
            out.append(None)
            continue
        width = max(len(str(x)), len(str(y)))
        m = EXPRESSION.match(text)
        out.append(float(bool(m) and m.group(1) == str(x).zfill(width) and m.group(2) == str(y).zfill(width)))
    return out
