"""recipes/entry.py: one entry to training for every objective. The objective row names its recipe, `train` runs
that one, and the commands, bench and the Python API call it rather than a recipe by name."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path
from types import SimpleNamespace

import pytest

import tunelab
from tunelab import objectives
from tunelab.recipes import entry
from tunelab.recipes.summary import RunSummary

PACKAGE = Path(tunelab.__file__).parent
# The callers of training: each must reach a recipe through entry.train.
CALLERS = [*(PACKAGE / "commands").glob("*.py"), *(PACKAGE / "bench").glob("*.py"), PACKAGE / "api.py"]


@pytest.mark.parametrize("name", objectives.NAMES)
def test_train_runs_the_recipe_its_objective_row_names(name, monkeypatch):
    cfg = SimpleNamespace(objective=SimpleNamespace(name=name, row=objectives.get(name)))  # what entry reads
    ran = []

    def recipe(cfg, show_progress, measure):
        ran.append((cfg.objective.name, show_progress, measure))
        return "summary"

    loaded = []
    monkeypatch.setattr(objectives, "load", lambda ref: loaded.append(ref) or recipe)
    assert entry.train(cfg, show_progress=False) == "summary"
    assert loaded == [objectives.get(name).recipe] and ran == [(name, False, None)]


@pytest.mark.parametrize("name", objectives.NAMES)
def test_every_rows_recipe_takes_the_entrys_arguments_and_returns_a_run_summary(name):
    recipe = objectives.load(objectives.get(name).recipe)
    signature = inspect.signature(recipe)
    assert list(signature.parameters)[:3] == ["cfg", "show_progress", "measure"]
    assert signature.return_annotation in ("RunSummary", RunSummary)


def recipe_imports(source: str) -> list[str]:
    """The imports in `source` of a recipe's run by name: a recipe module's `train` or `finetune`, or a recipe
    module that only runs (recipes/grpo.py)."""
    modules = {o.recipe.partition(":")[0].removeprefix("recipes.") for o in objectives.REGISTRY.values()}
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.ImportFrom):
            continue
        parts = (node.module or "").split(".")
        names = {a.name for a in node.names}
        if parts[-1] in modules and names & {"train", "finetune"}:
            found.append(f"{node.lineno} {node.module}: {', '.join(sorted(names & {'train', 'finetune'}))}")
        if (parts[-1] == "recipes" and "grpo" in names) or parts[-2:] == ["recipes", "grpo"]:
            found.append(f"{node.lineno} recipes.grpo")
    return found


def test_the_scan_finds_a_recipe_run_by_name():
    source = (
        "from ..recipes.finetune import finetune, prepare_run\nfrom ..recipes import grpo\nfrom .recipes import entry\n"
    )
    assert recipe_imports(source) == ["1 recipes.finetune: finetune", "2 recipes.grpo"]


def test_no_caller_of_training_runs_a_recipe_by_name():
    """commands/, bench/ and api.py import no recipe's `train` or `finetune` (nor recipes/grpo.py at all): a second
    door to training would skip the objective row's choice."""
    offenders = [f"{p.relative_to(PACKAGE)}:{f}" for p in CALLERS for f in recipe_imports(p.read_text())]
    assert not offenders


def test_every_rows_capabilities_are_known_ones():
    for row in objectives.REGISTRY.values():
        assert row.capabilities <= set(objectives.CAPABILITIES), row.name


def test_nproc_for_an_objective_without_the_processes_capability_is_one_line_before_any_launch(
    tmp_path, monkeypatch, capsys
):
    """A row without the processes capability is refused at launch; GRPO, which has it, refuses more processes than
    the prompts a step samples (each prompt's completions stay in one process), and DeepSpeed ZeRO by its row's
    capability."""
    import dataclasses

    from tunelab.cli import main
    from tunelab.config import load_config
    from tunelab.errors import TunelabError
    from tunelab.train import launch

    monkeypatch.setattr(launch, "run_launcher", lambda cmd: pytest.fail("launched"))
    config = tmp_path / "g.yaml"
    config.write_text(
        "objective: grpo\ndata:\n  path: p.jsonl\nseq_len: 64\nmicro_batch: 1\ngrad_accum: 2\ngrpo:\n"
        "  max_completion_length: 16\n  rewards:\n    - name: exact_answer\n"
    )
    train = ["train", "--config", str(config), f"output_dir={tmp_path / 'out'}"]
    assert main([*train, "--nproc", "3"]) == 2
    err = capsys.readouterr().err.strip()
    assert f"{config}: 3 processes for the 2 prompts each step samples (micro_batch x grad_accum)" in err
    assert "use --nproc 2 or fewer" in err and "\n" not in err
    with pytest.raises(TunelabError, match="objective grpo lacks the capability zero .DeepSpeed ZeRO."):
        launch.check_deepspeed_run(load_config(config), "g.yaml")
    with pytest.raises(TunelabError, match="keeps a frozen copy of the weights, which FSDP does not shard"):
        launch.check_fsdp_run(load_config(config, ["method=full", "grpo.beta=0.1"]), "g.yaml")
    launch.check_fsdp_run(load_config(config, ["method=full"]), "g.yaml")  # β 0: no reference
    row = dataclasses.replace(objectives.get("grpo"), capabilities=frozenset())
    monkeypatch.setitem(objectives.REGISTRY, "grpo", row)
    assert main([*train, "--nproc", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert "objective grpo lacks the capability processes (several processes): run it without --nproc" in err
    assert "\n" not in err
