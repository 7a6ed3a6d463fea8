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
    build = optimizers.load(optimizers.get(spec.optimizer))
    lr, decay = spec.lr, spec.weight_decay
    if not spec.optimizer_in_backward and not any(p.dtype == torch.bfloat16 for p in params):
        return build(params, lr, decay, device)
    return PerParameter(params, lambda shadow: build([shadow], lr, decay, device), spec)


def stochastic_round(x: torch.Tensor) -> torch.Tensor:
    """fp32 `x` as bf16, rounded up or down with probability proportional to its distance from each neighbour,
    so that the expected value is `x` (Gupta et al. 2015, "Deep Learning with Limited Numerical Precision",
    section 3.2): random bits added below bf16's 16 kept bits of the fp32 pattern, then truncated."""
    bits = x.contiguous().view(torch.int32)
    noise = torch.randint_like(bits, 0, 1 << 16)
    return ((bits + noise) & -65536).view(torch.float32).to(torch.bfloat16)


class PerParameter(torch.optim.Optimizer):
    """One inner optimizer per trainable parameter, stepped one parameter at a time.

    `param_groups` is one group over every parameter, so the LR scheduler sets its `lr` as for any optimizer;
    each inner optimizer takes it at its step. A bf16 parameter is stepped through an fp32 shadow that exists only
    during its own step (the inner optimizer's state is keyed by the shadow), and written back by
    `spec.bf16_update`: `stochastic`, `kahan` (a bf16 buffer keeps what rounding lost, added back at the next
    step: Zamirai et al. 2020, "Revisiting BFloat16 Training", section 4) or `nearest` (plain rounding, which
    loses every update below half a bf16 ulp of the weight).

    In backward (`spec.optimizer_in_backward`) each parameter steps in its post-accumulate-grad hook and its
    gradient is freed there; `step` and `zero_grad` then do nothing."""

    def __init__(self, params: list, build: Callable[[torch.nn.Parameter], torch.optim.Optimizer], spec):
        super().__init__(params, {"lr": spec.lr})
        self.update = spec.bf16_update
        self.in_backward = spec.optimizer_in_backward
        self.params = list(params)
        self.shadows = {p: _shadow(p) for p in self.params}
        self.inner = {p: build(self.shadows[p]) for p in self.params}
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
        inner = self.inner[p]
        for group in inner.param_groups:
            group["lr"] = self.param_groups[0]["lr"]
        shadow = self.shadows[p]
        if shadow is p:
            inner.step()
            return
        value = p.float()
        if p in self.compensation:
            value += self.compensation[p].float()
        shadow.data = value
        shadow.grad = p.grad.float()
        inner.step()
        if self.update == "stochastic":
            p.copy_(stochastic_round(shadow.data))
        else:
            p.copy_(shadow.data)
            if p in self.compensation:
                self.compensation[p].copy_(shadow.data - p.float())
        shadow.grad = None
        shadow.data = torch.empty(0, device=p.device)

    def step(self, closure=None):
        if not self.in_backward:
            for p in self.params:
                self.step_param(p)
        return None

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            p.grad = None

    def state_dict(self) -> dict:
        """Each parameter's inner state by its index, its Kahan buffer, and the shared group (lr, step count)."""
        out = {"param_groups": [{k: v for k, v in self.param_groups[0].items() if k != "params"}], "inner": {}}
        for i, p in enumerate(self.params):
            entry = {"optimizer": self.inner[p].state_dict()}
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
            self.inner[p].load_state_dict(entry["optimizer"])
            if p in self.compensation:
                self.compensation[p].copy_(entry["compensation"])


def _shadow(p: torch.nn.Parameter) -> torch.nn.Parameter:
    """The fp32 parameter a bf16 one steps through (empty between its steps); an fp32 parameter is its own."""
    if p.dtype != torch.bfloat16:
        return p
    return torch.nn.Parameter(torch.empty(0, device=p.device), requires_grad=False)
