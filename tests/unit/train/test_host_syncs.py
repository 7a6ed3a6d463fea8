"""Between log steps a training step reads nothing back to the host.

On a GPU a read-back (`.item()`, `bool(tensor)`, `.tolist()`, `nonzero`, boolean-mask indexing) waits for every
queued kernel, so the host cannot run ahead and launch the next ones: the step becomes host-bound. A CPU has no
queue, but the calls are the same Python calls, so a TorchFunctionMode that records them proves the property
here for every path a CPU runs (the CUDA-only kernels of flex attention and bitsandbytes are not covered).
"""

from __future__ import annotations

import collections

import pytest
import torch
from torch.overrides import TorchFunctionMode

from conftest import tiny_train_config, write_jsonl
from tunelab.recipes.train import train
from tunelab.train import batches

pytestmark = pytest.mark.slow  # every test here trains or compiles

READ_BACKS = {
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
}


class ReadBacks(TorchFunctionMode):
    """Records each read-back under the optimizer step that made it (None before the loop)."""

    def __init__(self):
        super().__init__()
        self.step = None
        self.calls: dict = collections.defaultdict(list)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        bool_mask = (
            name == "__getitem__" and isinstance(args[1], torch.Tensor) and args[1].dtype == torch.bool
            if len(args) > 1
            else False
        )
        if name in READ_BACKS or bool_mask:
            self.calls[self.step].append(name)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize(
    "extra",
    [[], ["method=dora", "grad_ckpt=true", "lora.dropout=0.1"], ["method=full", "packing=false"]],
    ids=["lora", "dora-ckpt-dropout", "full-unpacked"],
)
def test_only_log_steps_read_back(tiny_model_dir, addition_rows, tmp_path, monkeypatch, extra):
    data = write_jsonl(tmp_path / "add.jsonl", addition_rows)
    cfg = tiny_train_config(
        tiny_model_dir,
        data,
        tmp_path / "run",
        "max_steps=6",
        "log_steps=3",
        "grad_accum=2",
        "micro_batch=4",
        "seq_len=64",
        *extra,
    )
    recorder = ReadBacks()
    iterate = batches.Schedule.iterate

    def marked(self, start, stop):
        for step, micro_batches in iterate(self, start, stop):
            recorder.step = step + 1
            yield step, micro_batches
        recorder.step = "after"

    monkeypatch.setattr(batches.Schedule, "iterate", marked)
    with recorder:
        summary = train(cfg, show_progress=False)
    assert summary["steps"] == 6
    in_loop = {step: calls for step, calls in recorder.calls.items() if step not in (None, "after")}
    # The loss of each log window is the one value read back: at steps 3 and 6, nowhere else.
    assert in_loop == {3: ["item"], 6: ["item"]}
