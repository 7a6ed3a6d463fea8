"""The optimizers that optimizers.py's rows name, and the per-parameter stepping that two memory levers need:
the step inside backward (`optimizer_in_backward`: each parameter updated in its gradient hook and its gradient
freed, so no whole-model gradient buffer exists, as torchtune's `create_optim_in_bwd_wrapper` does) and bf16
weights for full fine-tuning (each update computed in fp32 and written back with stochastic rounding or a Kahan
compensation buffer, so that updates smaller than half a bf16 ulp still move the weights)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from .. import optimizers
from ..config import OptimizerConfig
from ..errors import TunelabError
from ..runtime import STEP_CHUNK


def build_adamw(params: list, lr: float, weight_decay: float, device: torch.device) -> torch.optim.Optimizer:
    # Fused AdamW does one kernel per step for all params (CUDA, and CPU since torch 2.4). The fallback is
    # foreach on GPUs only: on CPU foreach was slower than one tensor at a time
    # (benchmarks/design-decisions_cpu_2026-11-22.md#fused-adamw-on-cpu).
    try:
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, fused=True)
    except (RuntimeError, TypeError):
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, foreach=device.type != "cpu")


def _bitsandbytes():
    try:
        import bitsandbytes
    except ImportError:
        raise TunelabError(
            "optimizer: the 8-bit optimizers need bitsandbytes, which is not installed; "
            "pip install bitsandbytes, or set optimizer: adafactor"
        ) from None
    return bitsandbytes


def build_adamw_8bit(params: list, lr: float, weight_decay: float, device: torch.device) -> torch.optim.Optimizer:
    return _bitsandbytes().optim.AdamW8bit(params, lr=lr, weight_decay=weight_decay)


def build_paged_adamw_8bit(params: list, lr: float, weight_decay: float, device: torch.device):
    return _bitsandbytes().optim.PagedAdamW8bit(params, lr=lr, weight_decay=weight_decay)


def build_adafactor(params: list, lr: float, weight_decay: float, device: torch.device) -> torch.optim.Optimizer:
    from transformers.optimization import Adafactor

    # `lr` as AdamW's (an absolute step size under the schedule), not Adafactor's relative step: what fine-tuning
    # recipes set (transformers' Adafactor docstring) and what lets one config switch optimizers.
    return Adafactor(
        params, lr=lr, weight_decay=weight_decay, scale_parameter=False, relative_step=False, warmup_init=False
    )


def check_device(spec: OptimizerConfig, device: torch.device, world: int) -> None:
    """What the optimizer section needs of the run's device and processes, refused in one line before the model
    loads (config validation checks what needs no device)."""
    row = optimizers.get(spec.optimizer)
    if row.needs_cuda and device.type != "cuda":
        raise TunelabError(
            f"config: optimizer {row.name} pages its states through CUDA unified memory, and this run is on "
            f"{device.type}; set optimizer: {row.instead}"
        )
    if row.bitsandbytes:
        _bitsandbytes()
    if spec.optimizer_in_backward and world > 1:
        raise TunelabError(
            "config: optimizer_in_backward steps each parameter before the processes' gradients are reduced; "
            "run one process or set optimizer_in_backward: false"
        )


def build_optimizer(model: torch.nn.Module, spec: OptimizerConfig, device: torch.device):
    """The run's optimizer over `model`'s trainable parameters: the row's own over all of them, or a PerParameter
    where the step runs inside backward or the weights are bf16."""
    params = [p for p in model.parameters() if p.requires_grad]
    row = optimizers.get(spec.optimizer)
    build = optimizers.load(row)
    lr, decay = spec.lr, spec.weight_decay
    if not spec.optimizer_in_backward and not any(p.dtype == torch.bfloat16 for p in params):
        return build(params, lr, decay, device)
    chunk = STEP_CHUNK if row.elementwise else 0
    return PerParameter(params, lambda shadow: build([shadow], lr, decay, device), spec, chunk=chunk)


def stochastic_round(x: torch.Tensor) -> torch.Tensor:
    """fp32 `x` as bf16, rounded up or down with probability proportional to its distance from each neighbour,
    so that the expected value is `x` (Gupta et al. 2015, "Deep Learning with Limited Numerical Precision",
    section 3.2): random bits added below bf16's 16 kept bits of the fp32 pattern, then truncated. In place on
    the noise, so the only temporaries are the noise (4 B a value) and the bf16 result (2 B)."""
    bits = x.contiguous().view(torch.int32)
    noise = torch.randint_like(bits, 0, 1 << 16)
    return noise.add_(bits).bitwise_and_(-65536).view(torch.float32).to(torch.bfloat16)


def pieces(numel: int, chunk: int) -> list[tuple[int, int]]:
    """[start, end) spans of a flattened weight of `numel` values stepped one at a time: one span when `chunk` is 0
    or the weight fits in it, else near-equal spans of at most `chunk` values, each a multiple of 256 but the last
    (bitsandbytes' block, so its blockwise states quantize as for the whole tensor; the last is still far above its
    4096-value min_8bit_size, below which it would keep fp32 states)."""
    if not chunk or numel <= chunk:
        return [(0, numel)]
    count = -(-numel // chunk)
    size = -(-numel // count // 256) * 256
    return [(start, min(start + size, numel)) for start in range(0, numel, size)]


class PerParameter(torch.optim.Optimizer):
    """One inner optimizer per trainable parameter (per piece of a large bf16 one), stepped one at a time.

    `param_groups` is one group over every parameter, so the LR scheduler sets its `lr` as for any optimizer;
    each inner optimizer takes it at its step. A bf16 parameter is stepped through an fp32 shadow that exists only
    during its own step (the inner optimizer's state is keyed by the shadow), and written back by
    `spec.bf16_update`: `stochastic`, `kahan` (a bf16 buffer keeps what rounding lost, added back at the next
    step: Zamirai et al. 2020, "Revisiting BFloat16 Training", section 4) or `nearest` (plain rounding, which
    loses every update below half a bf16 ulp of the weight). With `chunk` > 0 (an element-wise optimizer:
    optimizers.Optimizer.elementwise) a bf16 parameter of more values steps in pieces of at most `chunk` values
    (`pieces`), each with its own shadow and inner optimizer, so the fp32 temporaries stay bounded; the update is
    the unchunked one, value for value, and stochastic rounding draws the same random stream in the same order.

    In backward (`spec.optimizer_in_backward`) each parameter steps in its post-accumulate-grad hook and its
    gradient is freed there; `step` and `zero_grad` then do nothing."""

    def __init__(
        self, params: list, build: Callable[[torch.nn.Parameter], torch.optim.Optimizer], spec, chunk: int = 0
    ):
        super().__init__(params, {"lr": spec.lr})
        self.update = spec.bf16_update
        self.in_backward = spec.optimizer_in_backward
        self.chunk = chunk
        self.params = list(params)
        self.spans = {p: pieces(p.numel(), chunk if p.dtype == torch.bfloat16 else 0) for p in self.params}
        self.shadows = {p: [_shadow(p) for _ in self.spans[p]] for p in self.params}
        self.inner = {p: [build(shadow) for shadow in self.shadows[p]] for p in self.params}
        self.compensation = {
            p: torch.zeros_like(p) for p in self.params if p.dtype == torch.bfloat16 and self.update == "kahan"
        }
        self.hooks = [p.register_post_accumulate_grad_hook(self._hook) for p in self.params] if self.in_backward else []

    def _hook(self, p: torch.nn.Parameter) -> None:
        self.step_param(p)
        p.grad = None

    @torch.no_grad()
    def step_param(self, p: torch.nn.Parameter) -> None:
        if p.grad is None:
            return
        lr = self.param_groups[0]["lr"]
        for inner in self.inner[p]:
            for group in inner.param_groups:
                group["lr"] = lr
        if self.shadows[p][0] is p:
            self.inner[p][0].step()
            return
        compensation = self.compensation.get(p)
        if not self.chunk:  # a factored optimizer's weight steps whole, in its own shape: Adafactor factors it
            self._step_piece(p.data, p.grad, compensation, self.shadows[p][0], self.inner[p][0])
            return
        weight, grad = p.view(-1), p.grad.reshape(-1)
        compensation = None if compensation is None else compensation.view(-1)
        for (start, end), shadow, inner in zip(self.spans[p], self.shadows[p], self.inner[p]):
            kept = None if compensation is None else compensation[start:end]
            self._step_piece(weight[start:end], grad[start:end], kept, shadow, inner)

    def _step_piece(self, weight, grad, compensation, shadow, inner) -> None:
        """One piece of a bf16 weight: its fp32 value (plus the Kahan buffer) and gradient into the shadow, the inner
        step, the result written back; at most two fp32 temporaries of the piece alive at once."""
        value = weight.float()
        if compensation is not None:
            value += compensation.float()
        shadow.data = value
        shadow.grad = grad.float()
        inner.step()
        shadow.grad = None
        if self.update == "stochastic":
            weight.copy_(stochastic_round(shadow.data))
        else:
            weight.copy_(shadow.data)
            if compensation is not None:
                compensation.copy_(shadow.data.sub_(weight.float()))
        shadow.data = torch.empty(0, device=weight.device)

    def step(self, closure=None):
        if not self.in_backward:
            for p in self.params:
                self.step_param(p)
        return None

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            p.grad = None

    def state_dict(self) -> dict:
        """Each parameter's inner state by its index (a list, one per piece, for a chunked one), its Kahan buffer,
        and the shared group (lr, step count)."""
        out = {"param_groups": [{k: v for k, v in self.param_groups[0].items() if k != "params"}], "inner": {}}
        for i, p in enumerate(self.params):
            states = [inner.state_dict() for inner in self.inner[p]]
            entry = {"optimizer": states[0] if len(states) == 1 else states}
            if p in self.compensation:
                entry["compensation"] = self.compensation[p]
            out["inner"][i] = entry
        return out

    def load_state_dict(self, state: dict) -> None:
        inner = state["inner"]
        if len(inner) != len(self.params):
            raise TunelabError(
                f"resume: the checkpoint's optimizer state covers {len(inner)} parameters, this run trains "
                f"{len(self.params)}; resume with the settings it was saved with"
            )
        self.param_groups[0].update(state["param_groups"][0])
        for i, p in enumerate(self.params):
            entry = inner[i]
            saved = entry["optimizer"] if isinstance(entry["optimizer"], list) else [entry["optimizer"]]
            if len(saved) != len(self.inner[p]):
                raise TunelabError(
                    f"resume: the checkpoint steps parameter {i} in {len(saved)} pieces, this run in "
                    f"{len(self.inner[p])}; resume with the tunelab version and optimizer it was saved with"
                )
            for optimizer, sd in zip(self.inner[p], saved):
                optimizer.load_state_dict(sd)
            if p in self.compensation:
                self.compensation[p].copy_(entry["compensation"])


def _shadow(p: torch.nn.Parameter) -> torch.nn.Parameter:
    """The fp32 parameter a bf16 one steps through (empty between its steps); an fp32 parameter is its own."""
    if p.dtype != torch.bfloat16:
        return p
    return torch.nn.Parameter(torch.empty(0, device=p.device), requires_grad=False)
