"""One measured bench point: recipes/finetune.py's `train` for warm-up + N optimizer steps in a fresh process, and
its record beside plan's prediction; `tunelab bench` and bench suites both measure through it."""

from __future__ import annotations

import os

from .. import config as cfgmod
from ..errors import TunelabError
from ..io import safe_name
from . import measure, peer_registry, store

KIND = "tunelab"
# Bench forces these: a checkpoint write inside the window is not throughput, resume would skip the
# window, and a log line per step gives step_time_s a median over steps rather than over log windows.
FORCED = ("resume=false", "save_steps=0", "log_steps=1")
STEP_KEYS = ("step_time_s", "step_time_median_s", "step_time_p90_s", "step_time_max_s")


def _peer_in_child(name: str, cfg: cfgmod.TrainConfig, steps: int, warmup: int) -> dict:
    from dataclasses import replace

    from ..libraries import quiet_libraries
    from . import peers

    quiet_libraries()
    batch = cfg.batch
    if peer_registry.get(name).pairs:  # as many pairs per batch as tunelab's packed micro-batches hold
        batch = replace(batch, micro_batch=pairs_per_micro_batch(cfg))
    return peers.run_peer(
        name,
        cfg.model,
        cfg.data,
        steps,
        warmup,
        lora=cfg.adapter.lora,
        batch=batch,
        optimizer=cfg.optimizer,
        seed=cfg.run.seed,
        device=cfg.compute.device,
    )


def pairs_per_micro_batch(cfg: cfgmod.TrainConfig) -> int:
    """tunelab's mean pairs per packed micro-batch for `cfg`: a pair peer batches that many, so both train equal
    pairs per step."""
    from ..recipes.finetune import prepare_run

    schedule = prepare_run(cfg).schedule
    return max(1, round(len(schedule.data) / 2 / len(schedule.global_rows(0)) / schedule.steps_per_epoch))


def slug(label: str) -> str:
    """A point's label (`lora.r=16 micro_batch=4`) as a directory name that any file transfer keeps."""
    return safe_name(label.replace(" ", "__"))


# ---- against plan's prediction (recipes/predict.local_prediction) ---------------------------------------------


def check_length(prediction, stop_at: int) -> None:
    available = prediction.work.optimizer_steps
    if available < stop_at:
        raise TunelabError(
            f"the dataset gives {available} optimizer steps, fewer than warm-up + steps = {stop_at}; "
            "use more data, more epochs, or fewer --steps"
        )


def predicted_figures(e) -> dict:
    """plan's figures for the quantities bench measures (render.record's conventions for nonpad/loss)."""
    w = e.work
    rate = e.speed.tokens_per_s
    return {
        "tokens_padded_per_s": rate,
        "tokens_nonpad_per_s": rate * w.tokens_nonpad / w.tokens_padded,
        "tokens_loss_per_s": rate * w.tokens_loss / w.tokens_padded,
        "step_time_s": w.tokens_padded / w.optimizer_steps / rate,
        "peak_memory_bytes": e.memory.total,
        "efficiency": e.efficiency.value,
        "source": e.efficiency.label,
    }


# ---- measurement -----------------------------------------------------------------------------------------


def measure_point(cfg: cfgmod.TrainConfig, stop_at: int, warmup: int) -> dict:
    """`finetune()` for `stop_at` optimizer steps in a fresh process; its summary.

    Fresh, because CPU peak memory is peak RSS minus RSS before the model loads: in a process that already
    trained (or ran a probe), allocator and oneDNN arenas are resident, and every later point would read
    low. Started fresh (in_fresh_process), never forked from this one: forking a process whose OpenMP
    threads exist can deadlock.
    """
    return in_fresh_process(_train_in_child, cfg, stop_at, warmup)


def measure_peer(name: str, cfg: cfgmod.TrainConfig, steps: int, warmup: int) -> dict:
    """The peer recipe `name` for `steps` optimizer steps (`warmup` of them unmeasured) in a fresh
    process, for the reasons measure_point gives; its record."""
    return in_fresh_process(_peer_in_child, name, cfg, steps, warmup)


# What a point's process imports before it trains (torch, transformers, peft, accelerate, bitsandbytes): ~5 s of
# CPU each time on a 2-core CPU host, more than many CPU points' own steps.
PRELOAD = ["tunelab.recipes.finetune"]


def start_method() -> str:
    """How a point's fresh process starts: from a fork server that has imported PRELOAD once per bench command
    where this host has no CUDA device, spawned where it has one (the server's imports may initialize CUDA,
    which a forked process cannot use). Either way the process never trained: no training's allocator or
    oneDNN arenas are resident, and no OpenMP threads exist when it starts (the server runs no parallel work)."""
    import torch

    return "spawn" if torch.cuda.is_available() else "forkserver"


def fork_server():
    """multiprocessing's fork server context, importing PRELOAD when it starts. The server is one per process, so
    everything that forks from it in a process (bench points, benchmarks/scripts/faults.py's runs) asks for it
    here, with one preload list."""
    import multiprocessing

    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(PRELOAD)
    return context


def in_fresh_process(fn, *args, method: str | None = None):
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    method = method or start_method()
    context = fork_server() if method == "forkserver" else multiprocessing.get_context(method)
    with ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
        # The environment of now, as a spawned process gets it (the server's is that of its start). What the
        # preloaded libraries read once on import (HF_HUB_OFFLINE, OMP_*) keeps the server's value: nothing
        # tunelab runs changes those between points.
        return pool.submit(_with_environment, dict(os.environ), fn, *args).result()


def _with_environment(environ: dict, fn, *args):
    os.environ.clear()
    os.environ.update(environ)
    return fn(*args)


def _train_in_child(cfg: cfgmod.TrainConfig, stop_at: int, warmup: int) -> dict:
    from ..libraries import quiet_libraries
    from ..recipes import entry
    from ..train.loop import Measurement

    quiet_libraries()
    measure = Measurement(stop_at=stop_at, warmup_window=warmup)
    return entry.train(cfg, show_progress=False, measure=measure).as_dict()


def device_peak(device_ref: str, summary: dict, catalog_gpu: str | None, fresh: bool = False) -> measure.Peak:
    """Measured in this (parent) process after the point ran, so the probe never competes with training."""
    from ..device import pick_device

    return measure.device_peak(
        pick_device(device_ref),
        summary["device"],
        summary["device_memory_bytes"],
        summary["precision"],
        gpu_id=catalog_gpu,
        fresh=fresh,
    )


def point_peak(peaks: dict, device_ref: str, summary: dict, catalog_gpu: str | None) -> measure.Peak:
    """The peak a point of a sweep or suite divides by. A GPU's is its catalog figure (or one probe per precision,
    kept in `peaks`); a CPU is probed again after every point: a CPU shared with other processes changes speed
    between points (the probes of benchmarks/plan-accuracy/cpu-steps_*.json), and each point's MFU and plan's
    fit (`tunelab bench fit`) need the speed it ran at."""
    from ..device import pick_device

    on_cpu = pick_device(device_ref).type == "cpu"
    if on_cpu or summary["precision"] not in peaks:
        peaks[summary["precision"]] = device_peak(device_ref, summary, catalog_gpu, fresh=on_cpu)
    return peaks[summary["precision"]]


def build_record(label: str, summary: dict, peak: measure.Peak, prediction, warmup: int, cfg) -> dict:
    flops = prediction.flops
    nonpad = summary["tokens_nonpad_per_s"]
    pred = predicted_figures(prediction)
    versions = summary["versions"]
    return {
        "kind": KIND,
        "label": label,
        "device": summary["device"],
        "device_memory_bytes": summary["device_memory_bytes"],
        "torch_version": versions["torch"],
        "transformers_version": versions["transformers"],
        "peft_version": versions["peft"],
        "accelerate_version": versions["accelerate"],
        "model": summary["model"],
        "method": summary["method"],
        "precision": summary["precision"],
        "micro_batch": summary["micro_batch"],
        "grad_accum": summary["grad_accum"],
        "world_size": summary.get("world_size", 1),
        "seq_len": summary["seq_len"],
        "packing": summary["packing"],
        "grad_ckpt": summary["grad_ckpt"],
        "compile": summary.get("compile"),  # runtime.compile_choice: whether the blocks compiled, and why
        "warmup_steps": warmup,
        "steps": summary["steady_window_steps"],
        "data": summary["data"],
        "tokens_padded_per_s": summary["tokens_padded_per_s"],
        "tokens_nonpad_per_s": nonpad,
        "tokens_loss_per_s": summary["tokens_loss_per_s"],
        "rate_basis": store.RATE_BASIS,
        "steady_window_s": summary["steady_window_s"],
        **{k: summary[k] for k in STEP_KEYS},
        "model_flops_per_token": flops.model,
        "hardware_flops_per_token": flops.hardware,
        "device_peak_flops": peak.flops,
        "peak_source": peak.source,
        "mfu": measure.mfu(nonpad, flops, peak.flops),
        "mfu_useful": measure.useful_mfu(nonpad, flops, peak.flops),
        "hfu": measure.hfu(nonpad, flops, peak.flops),
        "peak_memory_bytes": summary["peak_memory_bytes"],
        "peak_memory_reserved_bytes": summary["peak_memory_reserved_bytes"],
        "peak_memory_absolute_bytes": summary["peak_memory_absolute_bytes"],
        **{f"predicted_{k}": v for k, v in pred.items()},
        "peak_probes": peak.probes,
        "device_bandwidth_bps": peak.bandwidth or None,
        "device_call_s": peak.call_s or None,
        "gpu_copy_bps": peak.gpu_copy_bps or None,
        "mamf_flops": peak.mamf or None,
        "mamf_shape": list(peak.mamf_shape) if peak.mamf else None,
        "config": cfgmod.to_dict(cfg),
    }


def json_view(rec: dict) -> dict:
    """--json: measured keys at the top level, plan's figures under `predicted`."""
    out = {k: v for k, v in rec.items() if not k.startswith("predicted_") and k != "config"}
    out["predicted"] = {k.removeprefix("predicted_"): v for k, v in rec.items() if k.startswith("predicted_")}
    return out


def step_stats(rec: dict) -> str:
    return (
        f"step time median {rec['step_time_median_s']:.3f} s, p90 {rec['step_time_p90_s']:.3f} s, "
        f"max {rec['step_time_max_s']:.3f} s"
    )
