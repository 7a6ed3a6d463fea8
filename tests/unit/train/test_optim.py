"""train/optim.py: each registry optimizer builds, steps and resumes exactly from a checkpoint; the step inside
backward matches the ordinary step and frees every gradient; bf16 weights learn where plain rounding stalls."""

from __future__ import annotations

import pytest
import torch

from tunelab import optimizers
from tunelab.config import OptimizerConfig
from tunelab.errors import TunelabError
from tunelab.train import checkpoint, loop, optim
from tunelab.train.checkpoint import TrainState

CPU = torch.device("cpu")
# paged_adamw_8bit needs CUDA (check_device refuses it elsewhere); tests/gpu covers it.
ON_CPU = [name for name in optimizers.NAMES if not optimizers.get(name).needs_cuda]


def _model(seed: int = 0, dtype=torch.float32) -> torch.nn.Module:
    torch.manual_seed(seed)
    # 64 x 128 = 8192 weights: above bitsandbytes' min_8bit_size (4096), so its 8-bit states are what is tested.
    return torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.Tanh(), torch.nn.Linear(128, 8)).to(dtype)


def _steps(model, optimizer, scheduler, n: int, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    dtype = next(model.parameters()).dtype
    for _ in range(n):
        x = torch.randn(16, 64, generator=g).to(dtype)
        model(x).float().square().mean().backward()
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)


def _run(spec: OptimizerConfig, steps: int, dtype=torch.float32, seed: int = 0):
    model = _model(seed, dtype)
    optimizer = optim.build_optimizer(model, spec, CPU)
    scheduler = loop.build_scheduler(optimizer, spec, total_steps=20)
    _steps(model, optimizer, scheduler, steps, seed=100)
    return model, optimizer, scheduler


def test_adamw_is_fused_and_falls_back_per_device(monkeypatch):
    model = torch.nn.Linear(4, 4)
    spec = OptimizerConfig(lr=1e-3)
    assert optim.build_optimizer(model, spec, CPU).defaults["fused"] is True

    real = torch.optim.AdamW

    def no_fused(params, fused=None, **kwargs):  # a torch or device without fused AdamW
        if fused:
            raise RuntimeError("fused=True is not supported here")
        return real(params, **kwargs)

    monkeypatch.setattr(torch.optim, "AdamW", no_fused)
    # foreach is the slowest of the three on CPU (benchmarks/design-decisions_cpu_2026-11-22.md), the fastest on GPUs.
    assert optim.build_optimizer(model, spec, CPU).defaults["foreach"] is False
    assert optim.build_optimizer(model, spec, torch.device("cuda")).defaults["foreach"] is True


MODES = [
    pytest.param({}, torch.float32, id="fp32"),
    pytest.param({"optimizer_in_backward": True, "max_grad_norm": 0.0}, torch.float32, id="in-backward"),
    pytest.param({"bf16_update": "stochastic"}, torch.bfloat16, id="bf16-stochastic"),
    pytest.param(
        {"bf16_update": "kahan", "optimizer_in_backward": True, "max_grad_norm": 0.0},
        torch.bfloat16,
        id="bf16-kahan-in-backward",
    ),
]


@pytest.mark.parametrize("name", ON_CPU)
@pytest.mark.parametrize("mode,dtype", MODES)
def test_a_checkpoint_resumes_each_optimizer_and_mode_exactly(tmp_path, name, mode, dtype):
    """3 steps, a checkpoint, 3 more; against the checkpoint loaded into a fresh model and optimizer and the same 3
    more steps: bit-identical weights (the optimizer state, Kahan buffers and RNG of stochastic rounding included)."""
    spec = OptimizerConfig(lr=1e-2, optimizer=name, **mode)
    model, optimizer, scheduler = _run(spec, 3, dtype)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    path = checkpoint.save(tmp_path, model, optimizer, scheduler, TrainState(step=3), keep=2)
    _steps(model, optimizer, scheduler, 3, seed=7)

    fresh, fresh_opt, fresh_sched = _run(spec, 0, dtype, seed=1)
    checkpoint.load(path, fresh, fresh_opt, fresh_sched)
    assert all(torch.equal(fresh.state_dict()[k], v) for k, v in before.items())
    _steps(fresh, fresh_opt, fresh_sched, 3, seed=7)
    for k, v in model.state_dict().items():
        assert torch.equal(fresh.state_dict()[k], v), k
    assert fresh_sched.get_last_lr() == scheduler.get_last_lr()
    changed = [not torch.equal(before[k], v) for k, v in model.state_dict().items()]
    assert all(changed)


@pytest.mark.parametrize("name", ON_CPU)
def test_the_step_in_backward_is_the_ordinary_step_and_frees_each_gradient(name):
    spec = OptimizerConfig(lr=1e-2, optimizer=name, max_grad_norm=0.0)
    plain, _, _ = _run(spec, 4)
    model = _model()
    in_backward = optim.build_optimizer(
        model, OptimizerConfig(lr=1e-2, optimizer=name, max_grad_norm=0.0, optimizer_in_backward=True), CPU
    )
    scheduler = loop.build_scheduler(in_backward, spec, total_steps=20)
    g = torch.Generator().manual_seed(100)
    for _ in range(4):
        model(torch.randn(16, 64, generator=g)).square().mean().backward()
        assert all(p.grad is None for p in model.parameters())  # stepped and freed in the hooks
        in_backward.step()
        scheduler.step()
    for a, b in zip(plain.parameters(), model.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_the_lr_schedule_reaches_the_step_in_backward():
    spec = OptimizerConfig(
        lr=1e-2, max_grad_norm=0.0, optimizer_in_backward=True, lr_scheduler="linear", warmup_ratio=0.0
    )
    model, optimizer, scheduler = _run(spec, 5)
    inner = optimizer.inner[next(model.parameters())][0]
    assert inner.param_groups[0]["lr"] == pytest.approx(1e-2 * 16 / 20)  # the lr of the 5th step, 4 steps decayed


def test_stochastic_rounding_is_unbiased_and_picks_a_neighbour():
    x = torch.full((200_000,), 1.0 + 2**-10, dtype=torch.float32)  # a quarter of the way from 1 to 1 + 2**-7
    r = optim.stochastic_round(x)
    assert set(r.float().unique().tolist()) == {1.0, 1.0 + 2**-7}
    assert r.float().mean().item() == pytest.approx(1.0 + 2**-10, abs=2e-5)
    exact = torch.tensor([1.5, -0.375, 0.0])
    assert torch.equal(optim.stochastic_round(exact).float(), exact)


@pytest.mark.parametrize("update,learns", [("nearest", False), ("stochastic", True), ("kahan", True)])
def test_bf16_weights_learn_from_updates_below_half_an_ulp_unless_rounded_to_nearest(update, learns):
    """Weights at 1.0 (bf16 ulp 2**-7) with AdamW steps of lr = 1e-3 < 2**-8: rounding to nearest keeps every
    weight at 1.0; stochastic rounding and the Kahan buffer move them by about 20 steps x 1e-3."""
    w = torch.nn.Parameter(torch.ones(4096, dtype=torch.bfloat16))
    spec = OptimizerConfig(lr=1e-3, bf16_update=update)
    optimizer = optim.build_optimizer(torch.nn.ParameterList([w]), spec, CPU)
    for _ in range(20):
        w.grad = torch.ones_like(w)
        optimizer.step()
    moved = 1.0 - w.float().mean().item()
    if learns:
        assert moved == pytest.approx(0.02, rel=0.15)
    else:
        assert moved == 0.0


def test_state_bytes_per_row():
    assert optimizers.get("adamw").state_bytes_of(4096, 4096) == 8 * 4096 * 4096
    assert optimizers.get("adamw_8bit").state_bytes_of(256, 1) == 2 * (256 + 4)
    assert optimizers.get("adafactor").state_bytes_of(4096, 1024) == 4 * (4096 + 1024)
    assert optimizers.get("adafactor").state_bytes_of(4096, 1) == 4 * 4096


def test_paged_states_and_many_processes_are_refused_in_one_line():
    with pytest.raises(TunelabError, match="set optimizer: adamw_8bit"):
        optim.check_device(OptimizerConfig(optimizer="paged_adamw_8bit"), CPU, 1)
    with pytest.raises(TunelabError, match="run one process"):
        optim.check_device(OptimizerConfig(optimizer_in_backward=True, max_grad_norm=0.0), CPU, 2)
    optim.check_device(OptimizerConfig(optimizer="adamw_8bit"), CPU, 1)


def test_a_checkpoint_of_other_parameters_is_refused_in_one_line(tmp_path):
    spec = OptimizerConfig(lr=1e-2, optimizer_in_backward=True, max_grad_norm=0.0)
    _, optimizer, _ = _run(spec, 1)
    state = optimizer.state_dict()
    state["inner"].pop(0)
    _, other, _ = _run(spec, 0)
    with pytest.raises(TunelabError, match="covers 3 parameters, this run trains 4"):
        other.load_state_dict(state)


@pytest.mark.slow
@pytest.mark.parametrize(
    "settings",
    [
        pytest.param(
            ("optimizer=adamw_8bit", "optimizer_in_backward=true", "max_grad_norm=0", "weights=bf16"),
            id="8bit-in-backward-bf16",
        ),
        pytest.param(("optimizer=adafactor", "weights=bf16", "bf16_update=kahan"), id="adafactor-bf16-kahan"),
    ],
)
def test_a_full_fine_tune_resumes_its_run_exactly(tiny_model_dir, addition_rows, tmp_path, settings):
    """`tunelab train`'s recipe under each memory lever: interrupted at step 5 after a checkpoint at 3, resumed to
    6, the loss curve is the uninterrupted run's, and the final weights are bf16."""
    import json

    from conftest import tiny_train_config, write_jsonl
    from safetensors.torch import load_file

    from tunelab.recipes.finetune import finetune
    from tunelab.train.loop import Measurement

    data = write_jsonl(tmp_path / "add.jsonl", addition_rows)
    args = ("method=full", "max_steps=6", "lr=1e-3", "precision=bf16", "grad_accum=1", *settings)

    def run(out, *extra, **kw):
        return finetune(tiny_train_config(tiny_model_dir, data, out, *args, *extra), show_progress=False, **kw)

    def curve(out):
        return [(m["step"], m["loss"]) for m in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())]

    run(tmp_path / "full")
    run(tmp_path / "cut", "save_steps=3", measure=Measurement(stop_at=5))
    run(tmp_path / "cut", "save_steps=3", "resume=true")
    assert curve(tmp_path / "cut") == curve(tmp_path / "full")
    assert [s for s, _ in curve(tmp_path / "full")] == list(range(1, 7))
    weights = load_file(next((tmp_path / "full" / "model").glob("*.safetensors")))
    assert {t.dtype for t in weights.values()} == {torch.bfloat16}


def test_pieces_cover_a_weight_in_aligned_spans_of_at_most_a_chunk():
    assert optim.pieces(1000, 0) == [(0, 1000)] and optim.pieces(1000, 4096) == [(0, 1000)]
    for numel in (128256 * 4096, optim.STEP_CHUNK + 1, 3 * optim.STEP_CHUNK):  # Llama-3's embedding among them
        spans = optim.pieces(numel, optim.STEP_CHUNK)
        assert spans[0][0] == 0 and spans[-1][1] == numel and len(spans) > 1
        assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
        assert all((e - s) % 256 == 0 and e - s <= optim.STEP_CHUNK for s, e in spans[:-1])
        assert spans[-1][1] - spans[-1][0] >= 4096  # bitsandbytes keeps smaller tensors' states in fp32


def _bf16_weights(chunk: int, monkeypatch, name: str, update: str, in_backward: bool, steps: int = 4):
    monkeypatch.setattr(optim, "STEP_CHUNK", chunk)
    torch.manual_seed(0)
    model = _model(0, torch.bfloat16)
    extra = {"optimizer_in_backward": True, "max_grad_norm": 0.0} if in_backward else {}
    spec = OptimizerConfig(lr=1e-2, optimizer=name, bf16_update=update, weight_decay=0.01, **extra)
    optimizer = optim.build_optimizer(model, spec, CPU)
    scheduler = loop.build_scheduler(optimizer, spec, total_steps=20)
    _steps(model, optimizer, scheduler, steps, seed=100)
    return model, optimizer


@pytest.mark.parametrize("name", ON_CPU)
@pytest.mark.parametrize("update", ["stochastic", "kahan", "nearest"])
@pytest.mark.parametrize("in_backward", [False, True], ids=["step", "in-backward"])
def test_a_large_bf16_weight_steps_in_chunks_bit_identically(monkeypatch, name, update, in_backward):
    """The 64 x 128 weight in pieces of 4096 values against whole: the same weights bit for bit (AdamW and
    8-bit AdamW are element-wise, bitsandbytes' blocks aligned; stochastic rounding draws the same CPU stream in
    the same order); Adafactor's factored moment is never split."""
    whole, _ = _bf16_weights(0, monkeypatch, name, update, in_backward)
    chunked, optimizer = _bf16_weights(4096, monkeypatch, name, update, in_backward)
    first = next(chunked.parameters())
    assert len(optimizer.spans[first]) == (2 if optimizers.get(name).elementwise else 1)
    for a, b in zip(whole.parameters(), chunked.parameters()):
        assert torch.equal(a, b)


def test_a_chunked_weight_resumes_exactly_and_refuses_other_pieces(monkeypatch, tmp_path):
    """A checkpoint of 8-bit states in two pieces and their Kahan buffer, loaded into a fresh run: the next step in
    backward gives the same weights; a run that steps the weight whole refuses that state in one line."""
    model, optimizer = _bf16_weights(4096, monkeypatch, "adamw_8bit", "kahan", True, steps=2)
    scheduler = loop.build_scheduler(optimizer, OptimizerConfig(), 20)
    path = checkpoint.save(tmp_path, model, optimizer, scheduler, TrainState(step=2), keep=2)
    state = optimizer.state_dict()
    assert len(state["inner"][0]["optimizer"]) == 2
    fresh, fresh_opt = _bf16_weights(4096, monkeypatch, "adamw_8bit", "kahan", True, steps=0)
    checkpoint.load(path, fresh, fresh_opt, loop.build_scheduler(fresh_opt, OptimizerConfig(), 20))
    x = torch.randn(16, 64, generator=torch.Generator().manual_seed(9)).to(torch.bfloat16)
    for m in (model, fresh):
        m(x).float().square().mean().backward()  # each weight steps in its hook
    for a, b in zip(model.parameters(), fresh.parameters()):
        assert torch.equal(a, b)
    _, whole = _bf16_weights(0, monkeypatch, "adamw_8bit", "kahan", True, steps=0)
    with pytest.raises(TunelabError, match="steps parameter 0 in 2 pieces, this run in 1"):
        whole.load_state_dict(state)


def test_adafactor_factors_a_bf16_matrix_as_it_does_an_fp32_one():
    """A bf16 weight steps through an fp32 shadow of its own shape, so Adafactor keeps a row and a column vector
    for the 128 x 64 matrix (what plan counts), not a second moment per value of a flattened copy."""
    spec = OptimizerConfig(lr=1e-2, optimizer="adafactor")
    shapes = {}
    for dtype in (torch.float32, torch.bfloat16):
        model, optimizer, _ = _run(spec, 2, dtype=dtype)
        state = optimizer.state_dict()
        inner = state["inner"][0]["optimizer"] if "inner" in state else state
        shapes[dtype] = sorted(tuple(t.shape) for t in inner["state"][0].values() if torch.is_tensor(t) and t.dim())
    assert shapes[torch.bfloat16] == shapes[torch.float32] == [(64,), (128,)]
