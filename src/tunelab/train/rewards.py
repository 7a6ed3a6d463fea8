"""GRPO's rewards: built-in ones by name, and the user's own Python functions named `path/to/file.py:function`.

Every reward has TRL's signature, `fn(prompts, completions, completion_ids, **row_fields) -> list[float | None]`:
one value per completion, None where the function does not apply (TRL's NaN: left out of the group's mean). The
row's fields come as lists aligned with the completions (`answer=[...]`), plus the reward's own `args` from the
config. A function that raises, returns the wrong count, a non-number or NaN is a one-line error naming the
function and the prompt row it failed on.
"""

from __future__ import annotations

import importlib.util
import inspect
import math
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from ..errors import TunelabError
from ..eval.exact_match import extract, parse_answer


def exact_answer(prompts, completions, completion_ids=None, field: str = "answer", **rows) -> list[float | None]:
    """1 when the completion's final answer (eval/exact_match.py: the last integer, or `q R r`) equals the row's
    `field`, else 0; None for a row whose field is not an answer."""
    return _graded(completions, rows, field, lambda got, expected: float(got == expected))


def answer_digits(prompts, completions, completion_ids=None, field: str = "answer", **rows) -> list[float | None]:
    """Partial credit for the final answer (exact_answer's extraction): the share of its digits that are right,
    compared from the last digit, over the longer of the two numbers; 0 for a wrong sign or no answer, 1 exactly
    when exact_answer is 1. A group whose completions are all wrong still differs here, so it still teaches."""
    return _graded(
        completions,
        rows,
        field,
        lambda got, expected: 0.0 if got is None else sum(map(_digit_share, got, expected)) / len(expected),
    )


def _graded(completions, rows: dict, field: str, grade: Callable) -> list[float | None]:
    """`grade(the completion's final answer or None, the row's answer)` per completion; None for a row whose
    `field` is not an answer."""
    if field not in rows:
        raise ValueError(f"the rows have no field {field!r} to check against")
    out: list[float | None] = []
    for text, truth in zip(completions, rows[field]):
        expected = parse_answer(truth)
        out.append(None if expected is None else grade(extract(text, len(expected)), expected))
    return out


def _digit_share(got: int, expected: int) -> float:
    """Right digits, aligned at the units, over the longer number's digit count; 0 when the signs differ."""
    if (got < 0) != (expected < 0):
        return 0.0
    a, b = str(abs(got))[::-1], str(abs(expected))[::-1]
    return sum(x == y for x, y in zip(a, b)) / max(len(a), len(b))


def regex(prompts, completions, completion_ids=None, pattern: str = "", full: bool = False, **rows) -> list[float]:
    """1 when the completion matches `pattern` (anywhere, or as a whole with `full`), else 0: a format reward."""
    if not pattern:
        raise ValueError("needs args.pattern, a regular expression")
    compiled = re.compile(pattern, re.DOTALL)
    match = compiled.fullmatch if full else compiled.search
    return [float(match(text.strip() if full else text) is not None) for text in completions]


def length(prompts, completions, completion_ids=None, max_tokens: int = 0, **rows) -> list[float]:
    """A length penalty: minus the completion's tokens beyond `max_tokens`, as a fraction of `max_tokens`."""
    if max_tokens < 1:
        raise ValueError("needs args.max_tokens, the length beyond which a completion is penalised")
    return [-max(0, len(ids) - max_tokens) / max_tokens for ids in completion_ids]


BUILTIN: dict[str, Callable] = {
    "exact_answer": exact_answer,
    "answer_digits": answer_digits,
    "regex": regex,
    "length": length,
}


@dataclass(frozen=True)
class Reward:
    name: str  # as metrics name it: `rewards/<name>/mean`
    fn: Callable
    weight: float
    args: dict


def load(name: str, weight: float = 1.0, args: dict | None = None, where: str = "grpo.rewards") -> Reward:
    """A built-in reward by name, or `file.py:function` imported from that file."""
    if name in BUILTIN:
        return Reward(name, BUILTIN[name], weight, dict(args or {}))
    path, sep, function = name.rpartition(":")
    if not sep or not path.endswith(".py"):
        raise TunelabError(
            f"{where}: reward {name!r} is neither a built-in ({', '.join(BUILTIN)}) nor path/to/file.py:function"
        )
    file = Path(path)
    if not file.is_file():
        raise TunelabError(f"{where}: reward file {path} not found")
    spec = importlib.util.spec_from_file_location(f"tunelab_reward_{file.stem}", file)
    module = importlib.util.module_from_spec(spec)
    try:
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    except Exception as e:
        raise TunelabError(f"{where}: reward file {path} fails to import: {type(e).__name__}: {e}") from None
    fn = getattr(module, function, None)
    if not callable(fn):
        raise TunelabError(f"{where}: reward file {path} has no function {function!r}")
    return Reward(function, fn, weight, dict(args or {}))


def load_all(specs: Sequence, where: str = "grpo.rewards") -> list[Reward]:
    """Every reward of the config's grpo.rewards (config.RewardConfig), in order."""
    return [load(s.name, s.weight, s.args, f"{where}[{i}]") for i, s in enumerate(specs)]


def score(
    rewards: Sequence[Reward],
    prompts: Sequence[str],
    completions: Sequence[str],
    completion_ids: Sequence[Sequence[int]],
    rows: Sequence[dict],
    row_numbers: Sequence[int],
) -> torch.Tensor:
    """(completions, rewards) fp32 values, NaN where a function returned None. `rows[i]` is completion i's prompt
    row and `row_numbers[i]` its number in the data file (1-based), for errors."""
    columns = {k for row in rows for k in row}
    fields = {k: [row.get(k) for row in rows] for k in sorted(columns)}
    out = torch.full((len(completions), len(rewards)), math.nan, dtype=torch.float32)
    for j, reward in enumerate(rewards):
        try:
            values = _call(reward, prompts, completions, completion_ids, fields)
        except Exception as e:
            raise TunelabError(
                f"reward {reward.name}: raised {type(e).__name__}: {e} ({_culprit(reward, prompts, completions, completion_ids, rows, row_numbers)})"
            ) from None
        values = list(values) if values is not None else []
        if len(values) != len(completions):
            raise TunelabError(
                f"reward {reward.name}: returned {len(values)} values for {len(completions)} completions (of data rows "
                f"{_row_list(row_numbers)}); return one per completion"
            )
        for i, v in enumerate(values):
            if v is None:
                continue
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise TunelabError(
                    f"reward {reward.name}: returned {v!r} for a completion of data row {row_numbers[i]}; "
                    "return a finite number, or None where the reward does not apply"
                )
            out[i, j] = float(v)
    return out


def _call(reward: Reward, prompts, completions, completion_ids, fields: dict):
    """The reward function called as TRL calls it: the columns of the completions' rows as keyword lists."""
    kwargs = {**fields, **reward.args}
    if not _takes_any(reward.fn):
        names = inspect.signature(reward.fn).parameters
        kwargs = {k: v for k, v in kwargs.items() if k in names}
    return reward.fn(prompts=list(prompts), completions=list(completions), completion_ids=completion_ids, **kwargs)


def _culprit(reward: Reward, prompts, completions, completion_ids, rows, row_numbers) -> str:
    """Where a reward function raised, for its one-line error: the first completion it raises on alone (its index
    in the batch and its data row), else the batch's data rows."""
    for i in range(len(completions)):
        fields = {k: [rows[i].get(k)] for k in sorted(rows[i])}
        try:
            _call(reward, prompts[i : i + 1], completions[i : i + 1], completion_ids[i : i + 1], fields)
        except Exception:
            return f"on completion {i} of the batch, of data row {row_numbers[i]}"
    return f"on the batch of data rows {_row_list(row_numbers)}"


def _row_list(row_numbers: Sequence[int]) -> str:
    """The data rows of a batch's completions, each once, in the batch's order."""
    return ", ".join(str(n) for n in dict.fromkeys(row_numbers))


def _takes_any(fn: Callable) -> bool:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return True
    return any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params)
