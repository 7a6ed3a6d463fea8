"""The Plan tab: its form's choices, and a submitted form as `tunelab plan`'s own arguments, predicted by the
function the CLI calls (recipes/predict.plan_config) and returned as the records `tunelab plan --json` prints
(plan/render.json_line), so the page and the terminal cannot disagree. The form is also shown as the equivalent
command line."""

from __future__ import annotations

import json
import math
import shlex
from dataclasses import dataclass

from .. import config as cfgmod
from .. import methods, objectives
from ..errors import TunelabError
from ..plan import catalog, render
from ..recipes.predict import DEFAULT_GPU, PlanRequest, plan_config


def choices() -> dict:
    """What the form offers: the catalog's models and GPUs, the method and objective registries' names."""
    return {
        "models": sorted(catalog.read("models.yaml")["models"]),
        "gpus": catalog.gpu_ids(),
        "methods": list(methods.NAMES),
        "objectives": list(objectives.NAMES),
        "default_gpu": DEFAULT_GPU,
    }


@dataclass(frozen=True)
class PlanForm:
    """A submitted Plan form. Empty fields keep the config's defaults, as flags left out do."""

    overrides: tuple[str, ...]
    gpu: tuple[str, ...]
    examples: int | None
    mean_tokens: float | None
    price_per_hour: float | None

    @classmethod
    def of(cls, form: dict) -> PlanForm:
        overrides = []
        for key in ("model", "method", "objective", "seq_len", "micro_batch"):
            value = str(form.get(key) or "").strip()
            if value:
                overrides.append(f"{key}={value}")
        for key in ("packing", "grad_ckpt"):
            if form.get(key) is not None:
                overrides.append(f"{key}={'true' if _flag(form[key], key) else 'false'}")
        data = str(form.get("data_path") or "").strip()
        if data:
            overrides.append(f"data.path={data}")
        gpu = form.get("gpu") or [DEFAULT_GPU]
        gpus = tuple(str(g).strip() for g in (gpu.split(",") if isinstance(gpu, str) else gpu) if str(g).strip())
        return cls(
            tuple(overrides),
            gpus,
            _number(form, "examples", int),
            _number(form, "mean_tokens", float),
            _number(form, "price_per_hour", float),
        )

    def argv(self) -> list[str]:
        """The `tunelab plan` arguments that ask the same question."""
        out = [*self.overrides, "--gpu", ",".join(self.gpu)]
        for flag, value in (
            ("--examples", self.examples),
            ("--mean-tokens", self.mean_tokens),
            ("--price-per-hour", self.price_per_hour),
        ):
            if value is not None:
                out += [flag, str(value)]
        return out + ["--json"]

    def request(self) -> PlanRequest:
        return PlanRequest(
            gpu=list(self.gpu),
            examples=self.examples,
            mean_tokens=self.mean_tokens,
            price_per_hour=self.price_per_hour,
        )


def _flag(value, key: str) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text not in ("true", "false", "on", "off", "1", "0"):
        raise TunelabError(f"{key}: {value!r} is not true or false")
    return text in ("true", "on", "1")


def _number(form: dict, key: str, kind: type):
    raw = str(form.get(key) if form.get(key) is not None else "").strip()
    if not raw:
        return None
    try:
        value = kind(raw)
    except ValueError:
        raise TunelabError(f"{key}: {raw!r} is not a number") from None
    if isinstance(value, float) and not math.isfinite(value):
        raise TunelabError(f"{key}: {raw!r} is not a finite number")
    return value


def predict(form: dict) -> dict:
    """The plan for a submitted form: `tunelab plan --json`'s records (one per GPU) and the command line."""
    asked = PlanForm.of(form)
    request = asked.request()
    request.check_gpus()  # unknown ids fail before the config's dataset is read, as in the CLI
    cfg = cfgmod.load_config(None, list(asked.overrides))
    results = plan_config(cfg, request)
    return {
        "command": shlex.join(["tunelab", "plan", *asked.argv()]),
        "records": [json.loads(render.json_line(r)) for r in results],
    }
