"""The output directory's steps that every recipe takes, in one place: the writable check before anything loads,
the lock and the stale temps a killed run left (`held`), the logs as at a checkpoint resumed from and config.yaml
(`start_logs`), the final save (adapter or model, atomic, a full disk ending the run with one line), best/ as at a
checkpoint resumed from, summary.json under the same disk-error handling (`write_summary`), the line a time
limit prints (`say_time_limited`) and the run's tracker, which logs under output_dir (`tracking`)."""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from .. import methods
from ..config import TrainConfig, dump_yaml, to_dict
from ..device import device_memory_bytes, device_name, library_versions
from ..errors import TunelabError
from ..io import atomic_dir, disk_errors, link_tree, remove_stale_temps, write_atomic
from ..model.lora_linear import nf4_layers
from ..train import checkpoint, distributed, trackers
from ..train.checkpoint import TrainState
from ..train.lock import PROBE_PREFIX, lock_output_dir
from .summary import RunSummary

METRICS = "metrics.jsonl"
SUMMARY = "summary.json"


@contextmanager
def held(out: Path, main: bool = True) -> Iterator[None]:
    """output_dir for one run: checked writable, locked (train/lock.py: a second run there fails at once) and rid
    of the temps a killed run left, all by the `main` process; the others of a distributed run touch nothing."""
    if not main:
        yield
        return
    check_writable_dir(out)
    with lock_output_dir(out):
        # Under the lock no other run writes here: temp entries are what a killed run left mid-write.
        for folder in (out, out / "checkpoints"):
            remove_stale_temps(folder)
        yield


def start_logs(
    cfg: TrainConfig, out: Path, resumed: Path | None, step: int, show_progress: bool, logs: tuple[str, ...] = ()
) -> float | None:
    """metrics.jsonl and the recipe's other `logs` as at the checkpoint `resumed` from (at `step`: the lines past
    it are about to be written again), or fresh; then config.yaml, which `tunelab eval --adapter` reads the base,
    format and template from. Returns the first training loss a resumed run logged before."""
    out.mkdir(parents=True, exist_ok=True)
    first_loss = None
    if resumed is not None:
        first_loss = truncate_metrics(out / METRICS, step)
        for name in logs:
            truncate_metrics(out / name, step)
        if show_progress:
            print(f"resumed from {resumed} at step {step}", flush=True)
    else:
        if cfg.run.resume is True and show_progress:  # a re-run of the same command after a crash, the first time
            print(f"resume: no checkpoint in {out / 'checkpoints'} yet; starting from step 0", flush=True)
        for name in (METRICS, *logs):
            (out / name).unlink(missing_ok=True)
    write_atomic(out / "config.yaml", [dump_yaml(cfg)])
    return first_loss


def write_summary(out: Path, summary: dict) -> None:
    """summary.json, atomically; a full disk ends the run with one line (the checkpoint to resume from)."""
    text = json.dumps(summary, indent=2)
    with disk_errors(str(out / SUMMARY), out, len(text), after_disk_error(out)):
        write_atomic(out / SUMMARY, [text])


def say_time_limited(max_minutes: float, step: int, total_steps: int) -> None:
    """The line a run ended by max_minutes prints: it is saved as finished."""
    print(
        f"time limit: max_minutes {max_minutes:g} ended training after step {step} of {total_steps}; saved as a "
        "finished run",
        flush=True,
    )


def check_writable_dir(path: Path) -> None:
    """Fail before training if the output dir cannot be written: create it and a probe file, then undo that.

    A real write is the only reliable test (root passes every permission check; /proc refuses anyway).
    """
    created = [p for p in (path, *path.parents) if not p.exists()]
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=PROBE_PREFIX):
            pass
    except OSError as e:
        raise TunelabError(f"output_dir {path}: cannot write there ({e.strerror}); choose another output_dir") from None
    finally:
        for p in created:  # deepest first
            if p.exists():
                p.rmdir()


def save_final(model, tokenizer, out: Path, method: str, weights: dict | None = None) -> Path:
    """`adapter/` (PEFT format) for adapter methods, `model/` (HF format) for full fine-tuning; atomic.
    `weights`: the model's state dict gathered from an FSDP run, whose own parameters are shards."""
    final = out / methods.get(method).saves
    save_pretrained(model, tokenizer, final, out, method, weights=weights)
    return final


BEST = checkpoint.BEST  # out/best, as each checkpoint names its copy of it
BEST_RECORD = "tunelab_best.json"


def save_pretrained(
    model, tokenizer, path: Path, out: Path, method: str, record: dict | None = None, weights: dict | None = None
) -> None:
    """The weights as the final save writes them (adapter or full model) plus the tokenizer, atomically;
    `record` goes beside them as BEST_RECORD. A full disk mid-save leaves the previous files as they were and
    ends the run with one line."""
    params = [p for p in model.parameters() if methods.get(method).trains_base or p.requires_grad]
    needed = sum(p.numel() * p.element_size() for p in params)
    with disk_errors(str(path), out, needed, after_disk_error(out)), atomic_dir(path) as tmp:
        model.save_pretrained(tmp, **({} if weights is None else {"state_dict": weights}))
        tokenizer.save_pretrained(tmp)
        if record is not None:
            (tmp / BEST_RECORD).write_text(json.dumps(record))


def restore_best(checkpoint_dir: Path, out: Path, state: TrainState) -> None:
    """Make `best/` what it was at the checkpoint: a run that died after it may have rewritten best/ with a step
    that the resumed run is about to train again (and, with other settings, may never reach)."""
    best = out / BEST
    record = best / BEST_RECORD
    on_disk = json.loads(record.read_text()).get("step") if record.is_file() else None
    if on_disk == state.best_step:
        return
    kept = checkpoint_dir / checkpoint.BEST
    if state.best_step is not None and kept.is_dir():
        with atomic_dir(best) as tmp:
            link_tree(kept, tmp)
    elif best.exists():
        shutil.rmtree(best)


def after_disk_error(out: Path) -> str:
    latest = checkpoint.list_checkpoints(out / "checkpoints")
    if latest:
        return f"free space, then run again with resume: true (checkpoint {latest[-1].name} is untouched)"
    return "free space or choose another output_dir, then run again (save_steps keeps checkpoints to resume from)"


def truncate_metrics(path: Path, step: int) -> float | None:
    """After a resume, drop log lines past the checkpoint: they are about to be produced again. Returns the first
    training loss the kept lines hold (None without one)."""
    if not path.exists():
        return None
    keep = [line for line in path.read_text().splitlines() if _logged_step(line) <= step]
    write_atomic(path, (line + "\n" for line in keep))
    return next((record["loss"] for record in map(json.loads, keep) if "loss" in record), None)


def _logged_step(line: str) -> float:
    """The step of a metrics line; a line a kill cut short counts as past every checkpoint, so it goes."""
    try:
        return json.loads(line)["step"]
    except (ValueError, KeyError, TypeError):
        return float("inf")


@contextmanager
def tracking(accelerator, setup: trackers.TrackerSetup | None, cfg: TrainConfig, show_progress: bool):
    """Start the run's tracker (says where it logs), yield whether one is on, and close it however the run ends.
    `accelerator` was made with `log_with=report_to` and `project_dir=output_dir` (trackers.TrackerSetup)."""
    if setup is None:
        yield False
        return
    if show_progress:
        for note in setup.notes:
            print(note, flush=True)
    accelerator.init_trackers(setup.project, trackers.flat_config(to_dict(cfg)), setup.init_kwargs)
    try:
        yield True
    finally:
        # Each tracker's own finish, not `accelerator.end_training()`: that also destroys the process group, which
        # a distributed run still needs for its final save.
        for tracker in accelerator.trackers:
            tracker.finish()


def summarize(run, result, *, data: dict, total_steps: int, packing: bool, elapsed_s: float, **own) -> RunSummary:
    """summary.json's record of a recipe's run after the shared loop (`result`: train/loop.LoopResult): the settings,
    the model's counts, the loop's steps, tokens, rates and memory, filled the same way for every objective. `run`
    holds cfg, out, prep, trainee, procs, state and logged_first_loss, as each recipe's run does; `data`,
    `total_steps`, `packing`, `elapsed_s` and `own` (early stopping and evaluations, the last reward) are the
    recipe's own."""
    cfg, prep, state, trainee = run.cfg, run.prep, run.state, run.trainee
    return RunSummary(
        output_dir=str(run.out),
        model=cfg.model,
        method=cfg.adapter.method,
        objective=cfg.objective.name,
        base_quant=cfg.adapter.quant,
        nf4_layers=nf4_layers(trainee.model),
        device=device_name(prep.device),
        device_memory_bytes=device_memory_bytes(prep.device),
        precision=prep.precision.name,
        params_trainable=trainee.params_trainable,
        params_total=trainee.params_total,
        params_local=distributed.local_numel(trainee.loss_fn),
        seq_len=cfg.batch.seq_len,
        micro_batch=cfg.batch.micro_batch,
        grad_accum=cfg.batch.grad_accum,
        packing=packing,
        grad_ckpt=cfg.compute.grad_ckpt,
        compile=None if prep.compile is None else prep.compile.as_dict(),
        activation_offload=cfg.compute.activation_offload,
        world_size=run.procs.world,
        data=data,
        steps=state.step,
        total_steps=total_steps,
        schedule_steps=state.schedule_steps,
        finished=result.finished,
        time_limited=result.time_limited,
        loss_first=run.logged_first_loss
        if run.logged_first_loss is not None
        else (result.losses[0][1] if result.losses else None),
        loss_last=result.losses[-1][1] if result.losses else None,
        tokens_padded=state.tokens_padded,
        tokens_nonpad=state.tokens_nonpad,
        tokens_loss=state.tokens_loss,
        **result.rates(),
        peak_memory_bytes=result.peak_memory_bytes,
        peak_memory_reserved_bytes=result.peak_reserved_bytes,
        peak_memory_absolute_bytes=result.peak_absolute_bytes,
        train_s=state.elapsed_s,
        elapsed_s=elapsed_s,
        versions=library_versions(),
        **own,
    )
