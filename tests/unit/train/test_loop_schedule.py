"""train/loop.py's schedule helpers, without training: a schedule built mid-run equals one stepped there, and the
step where a schedule fitted to max_minutes ends."""

from __future__ import annotations

import pytest
import torch

from tunelab.config import OptimizerConfig
from tunelab.train.loop import build_scheduler, fitted_schedule_steps


@pytest.mark.parametrize("name", ["cosine", "linear", "constant"])
def test_a_schedule_built_at_a_step_equals_one_stepped_there(name):
    spec = OptimizerConfig(lr=1e-3, lr_scheduler=name, warmup_ratio=0.2)

    def optimizer():
        return torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=spec.lr)

    stepped_opt = optimizer()
    stepped = build_scheduler(stepped_opt, spec, 20)
    for _ in range(7):
        stepped_opt.step()
        stepped.step()
    built_opt = optimizer()
    built = build_scheduler(built_opt, spec, 20, at_step=7)
    assert built.get_last_lr() == pytest.approx(stepped.get_last_lr())
    assert built_opt.param_groups[0]["lr"] == pytest.approx(stepped_opt.param_groups[0]["lr"])
    for _ in range(13):  # and they go on alike to the end
        for opt, sched in ((stepped_opt, stepped), (built_opt, built)):
            opt.step()
            sched.step()
        assert built.get_last_lr() == pytest.approx(stepped.get_last_lr())


def test_a_shortened_schedule_decays_from_where_the_run_stands():
    spec = OptimizerConfig(lr=1e-3, lr_scheduler="cosine", warmup_ratio=0.0)
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=spec.lr)
    build_scheduler(opt, spec, 50)
    short = build_scheduler(opt, spec, 10, at_step=5)
    assert short.get_last_lr()[0] == pytest.approx(0.5e-3)  # half way through the 10-step cosine
    assert short.base_lrs == [1e-3]  # the peak stays the config's lr


def test_fitted_schedule_steps_counts_whole_batches_that_end_inside_the_limit():
    # 60 s done after 1 step, 60 s a batch of 1 step, 270 s allowed: 3 more batches end by 240 s.
    assert fitted_schedule_steps(4.5, 60.0, 1, 60.0, 1) == 4
    # Batches of 2 steps (num_iterations 2): whole batches only.
    assert fitted_schedule_steps(4.5, 120.0, 2, 120.0, 2) == 4
    assert fitted_schedule_steps(15.0, 54.0, 1, 54.0, 1) == 16  # the AVX2 quickstart's pace
    assert fitted_schedule_steps(1.0, 90.0, 3, 30.0, 1) == 3  # already past the limit: no more
