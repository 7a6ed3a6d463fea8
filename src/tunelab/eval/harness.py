"""Standard evaluation tasks through EleutherAI's lm-evaluation-harness (the optional `lm-eval` extra): `tunelab eval
--tasks NAMES` scores the base model and the tuned one (an adapter on it, or a merged model) on the same tasks, so a
user sees what the fine-tune cost elsewhere. The models are loaded as `tunelab eval` loads them
(recipes/generation.py: embedded, HF directory, `.gguf`, adapter) and handed to the harness's HF model class
(`lm_eval.models.huggingface.HFLM(pretrained=<model>)`); tasks are the harness's own (hub datasets: hellaswag,
arc_easy, ...) or YAML task definitions in `--tasks-path` folders (a local jsonl through `dataset_path: json`)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ..errors import TunelabError

EXTRA = "pip install 'tunelab[lm-eval]'"


def task_manager(paths: Sequence[str], names: Sequence[str]):
    """The harness's task index that knows `names`: the YAML folders in `paths` alone when they define every one
    (indexing the harness's own thousands of task files takes seconds), else those and the harness's own; one line
    naming the tasks neither knows."""
    try:
        from lm_eval.tasks import TaskManager
    except ModuleNotFoundError as e:
        raise TunelabError(f"tunelab eval --tasks needs lm-evaluation-harness ({e.name} is missing): {EXTRA}") from None
    for path in paths:
        if not Path(path).is_dir():
            raise TunelabError(f"--tasks-path {path}: not a folder of task YAML files")
    if paths:
        own = TaskManager(include_path=list(paths), include_defaults=False)
        if not _unknown(own, names):
            return own
    manager = TaskManager(include_path=list(paths) or None)
    unknown = _unknown(manager, names)
    if unknown:
        raise TunelabError(
            f"--tasks: unknown task {', '.join(unknown)}; `lm-eval ls tasks` lists the harness's, and --tasks-path "
            "adds folders of your own YAML tasks"
        )
    return manager


def _unknown(manager, names: Sequence[str]) -> list[str]:
    known = set(manager.all_tasks)
    return [n for n in names if n not in known and not manager.match_tasks([n])]


def run_tasks(model, tokenizer, manager, names: Sequence[str], limit: int | None, batch_size: int) -> dict:
    """{task: {metric: value}} of `model` on `names` (stderr entries dropped), the harness's own aggregation."""
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM

    lm = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=batch_size)
    out = simple_evaluate(model=lm, tasks=list(names), task_manager=manager, limit=limit, log_samples=False)
    scores: dict[str, dict[str, float]] = {}
    for task, metrics in (out or {}).get("results", {}).items():
        for key, value in metrics.items():
            metric, _, _filter = key.partition(",")
            if isinstance(value, (int, float)) and not isinstance(value, bool) and not metric.endswith("_stderr"):
                scores.setdefault(task, {})[metric] = float(value)
    return scores


def side_by_side(columns: dict[str, dict]) -> list[list[str]]:
    """Rows task, metric, one value per column (base, tuned) and, with two columns, the change."""
    names = list(columns)
    first = columns[names[0]]
    rows = []
    for task in sorted(first):
        for metric in sorted(first[task]):
            values = [columns[n].get(task, {}).get(metric) for n in names]
            cells = ["" if v is None else f"{v:.4f}" for v in values]
            if len(values) == 2 and None not in values:
                cells.append(f"{values[1] - values[0]:+.4f}")
            rows.append([task, metric, *cells])
    return rows
