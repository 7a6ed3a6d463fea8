"""No device->host synchronisation inside a training step: the loop's promise (train/loop.py) that the host runs
ahead of the device except at log steps, evaluations and saves.

On CPU there is no device to wait for, so the test counts what would wait on a GPU: every tensor operation
whose result the host reads (`.item()`, `bool(t)`, `.tolist()`, `.cpu()`, `nonzero` and the other ops whose
output size depends on the data), through a TorchFunctionMode that sees every tensor call of the run,
transformers', peft's and bitsandbytes' included. A `.to(device)` is not counted: on CPU it cannot tell a copy
to the host from one to the device. Each call is attributed to the micro-batch whose forward began last; the
window of every micro-batch but the last holds a forward, a backward and (at a step's end) the clip and
optimizer step, and must be empty. The last window holds the run's one log, where the loss is read.
Some calls sync only with some arguments (`syncs`): boolean-mask indexing, `where` with the condition alone,
`repeat_interleave` with tensor repeats and no output size; formatting a tensor always does.
What this cannot see: a sync inside a CUDA-only branch (the gpu tier runs the loop under
torch.cuda.set_sync_debug_mode for that) and a pageable host->device copy.
"""

from __future__ import annotations

import traceback

import pytest
import torch
from conftest import tiny_train_config, write_jsonl
from torch.overrides import TorchFunctionMode

pytestmark = pytest.mark.slow

# Tensor calls that make the host wait for the device on CUDA (torch.cuda.set_sync_debug_mode flags the same).
SYNCING = {
    "item",
    "tolist",
    "numpy",
    "cpu",
    "__bool__",
    "__int__",
    "__float__",
    "__index__",
    "nonzero",
    "argwhere",
    "masked_select",
    "unique",
    "unique_consecutive",
    "equal",
    "allclose",
}


# Calls that sync only with some arguments: the output's size or the printed text depends on the data.
FORMATTING = {"__repr__", "__str__", "__format__"}


def _has_bool_tensor(value) -> bool:
    """A boolean mask among `value` (an index, or a tuple of indices): indexing by it is nonzero underneath."""
    if isinstance(value, (tuple, list)):
        return any(_has_bool_tensor(v) for v in value)
    return isinstance(value, torch.Tensor) and value.dtype == torch.bool


def syncs(name: str, args: tuple, kwargs: dict) -> bool:
    """Whether the tensor call `name(*args, **kwargs)` makes the host wait for the device's result."""
    if name in SYNCING or name in FORMATTING or name == "bincount":
        return True
    if name in ("__getitem__", "__setitem__", "index_put", "index_put_"):
        return len(args) > 1 and _has_bool_tensor(args[1])
    if name == "where":  # where(cond) alone is nonzero(cond, as_tuple=True)
        return len(args) + len(kwargs) == 1
    if name == "repeat_interleave":  # tensor repeats: the output length is their sum, unless it is given
        repeats = args[1] if len(args) > 1 else kwargs.get("repeats", args[0] if len(args) == 1 else None)
        return isinstance(repeats, torch.Tensor) and kwargs.get("output_size") is None
    return False


class SyncCounter(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.micro_batch = 0  # the micro-batch whose forward began last (0: before the loop)
        self.calls: list[tuple[int, str, str]] = []
        self.seen = 0  # tensor calls inside the loop: the mode does see the run

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        self.seen += bool(self.micro_batch)
        if self.micro_batch and syncs(name, args, kwargs):
            where = "".join(traceback.format_stack(limit=6)[:-1])
            self.calls.append((self.micro_batch, name, where))
        return func(*args, **kwargs)


# The GPU's default attention (flex) under every method, and the CPU's (slots) under LoRA.
@pytest.mark.parametrize(
    "attention,method", [("flex", "lora"), ("flex", "dora"), ("flex", "qlora"), ("flex", "full"), ("slots", "lora")]
)
def test_no_host_sync_between_log_steps(tiny_model_dir, tmp_path, addition_rows, monkeypatch, method, attention):
    from tunelab.recipes.finetune import finetune
    from tunelab.train import loop

    steps, accum = 4, 2
    counter = SyncCounter()
    forward = loop.forward

    def counted(*args, **kwargs):
        counter.micro_batch += 1
        return forward(*args, **kwargs)

    monkeypatch.setattr(loop, "forward", counted)
    data = write_jsonl(tmp_path / "d.jsonl", addition_rows)
    cfg = tiny_train_config(
        tiny_model_dir,
        data,
        tmp_path / "out",
        f"method={method}",
        f"attention={attention}",
        f"max_steps={steps}",
        f"grad_accum={accum}",
        "log_steps=1000",  # one log, at the run's end
        "packing=true",
    )
    with counter:
        finetune(cfg, show_progress=False)

    assert counter.micro_batch == steps * accum
    assert counter.seen > 1000 * steps
    inside = [c for c in counter.calls if c[0] < counter.micro_batch]
    assert not inside, "host syncs inside training steps:\n" + "\n".join(
        f"{n} in micro-batch {m}:\n{w}" for m, n, w in inside[:3]
    )
    # The last window reads the loss for the log, once.
    assert [n for m, n, _ in counter.calls if m == counter.micro_batch].count("item") >= 1


@pytest.mark.parametrize(
    "call,expected",
    [
        (lambda t, m: t[m], True),
        (lambda t, m: t.__setitem__(m, 0.0), True),
        (lambda t, m: torch.where(m), True),
        (lambda t, m: torch.where(m, t, 0.0), False),
        (lambda t, m: t.repeat_interleave(torch.tensor([1, 2, 1, 0])), True),
        (lambda t, m: t.repeat_interleave(torch.tensor([1, 2, 1, 0]), output_size=4), False),
        (lambda t, m: t.repeat_interleave(2), False),
        (lambda t, m: torch.bincount(m.long()), True),
        (lambda t, m: f"{t}", True),
        (lambda t, m: t[1:3], False),
        (lambda t, m: t[torch.tensor([0, 2])], False),
    ],
    ids=[
        "mask-get",
        "mask-set",
        "where1",
        "where3",
        "ri-tensor",
        "ri-sized",
        "ri-int",
        "bincount",
        "format",
        "slice",
        "index",
    ],
)
def test_the_counter_sees_calls_that_sync_only_with_some_arguments(call, expected):
    counter = SyncCounter()
    counter.micro_batch = 1
    t, m = torch.arange(4.0), torch.tensor([True, False, True, False])
    with counter:
        call(t, m)
    assert bool(counter.calls) is expected, counter.calls
