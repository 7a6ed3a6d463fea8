"""bench/peer_registry.py is the one list of peers: each row's objective and packages are known, the CLI's help
and guide.md name every peer, and no other code compares peer names (tests/unit/test_registries.py's rule, for
peers). Torch-free."""

from __future__ import annotations

import ast
import importlib.util
import re

import pytest
from conftest import REPO

from tunelab import objectives
from tunelab.bench import peer_registry
from tunelab.cli import main
from tunelab.errors import TunelabError

PACKAGE = REPO / "src" / "tunelab"
# Code that may name peers: the registry; the Trainer recipes, one per peer; plan's model of the two HF stacks it
# predicts (plan sits below bench, so it cannot read the registry).
KNOWS_PEERS = {"bench/peer_registry.py", "bench/peers.py", "plan/hfstack.py"}


def test_every_row_runs_beside_a_known_objective_and_needs_known_packages():
    for peer in peer_registry.REGISTRY.values():
        assert peer.objective in objectives.NAMES, peer.name
        assert set(peer.packages) <= set(peer_registry.PACKAGES), peer.name
        assert peer.runs and peer.name == peer.name.strip()


def peer_dispatch(path) -> list[str]:
    """Comparisons with a peer name, or a table keyed by two or more, in `path`."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
        elif isinstance(node, ast.Dict):
            sides = [k for k in node.keys if k is not None]
            if sum(isinstance(k, ast.Constant) and k.value in peer_registry.REGISTRY for k in sides) < 2:
                continue
        else:
            continue
        items = [e for s in sides for e in (s.elts if isinstance(s, (ast.Tuple, ast.List, ast.Set)) else [s])]
        if any(isinstance(e, ast.Constant) and e.value in peer_registry.REGISTRY for e in items):
            found.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    return found


def test_no_code_outside_the_registry_lists_or_compares_peer_names():
    paths = [p for p in PACKAGE.rglob("*.py") if str(p.relative_to(PACKAGE)) not in KNOWS_PEERS]
    assert not [f for p in paths for f in peer_dispatch(p)]


def test_guide_and_the_cli_name_every_peer(capsys):
    guide = (REPO / "docs" / "guide.md").read_text()
    row = next(line for line in guide.splitlines() if line.startswith("| `tunelab bench peers"))
    assert [n for n in peer_registry.NAMES if n not in row] == []
    with pytest.raises(SystemExit):
        main(["bench", "peers", "--help"])
    text = re.sub(r"\s+", " ", capsys.readouterr().out)
    assert [p.label for p in peer_registry.REGISTRY.values() if p.label not in text] == []


def test_a_peer_is_refused_where_it_cannot_run(monkeypatch):
    liger, trl_sft = peer_registry.get("hf-trainer-liger"), peer_registry.get("trl-sft")
    assert liger.refusal("cpu") == "peer hf-trainer-liger needs a CUDA device (Liger's kernels are Triton); this is cpu"
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "trl" else real(name, *a))
    assert trl_sft.refusal("cuda:0") == (
        "peer trl-sft needs TRL, which is not installed; `pip install trl` or drop the peer"
    )
    assert peer_registry.get("hf-trainer-seed").refusal("cpu") is None
    with pytest.raises(TunelabError, match="unknown peer 'axolotl'; choose from hf-trainer-seed"):
        peer_registry.get("axolotl")


def test_generating_peers_run_beside_a_generating_objective_only():
    peer_registry.check_runs_beside(["trl-grpo"], generates=True)
    peer_registry.check_runs_beside(["hf-trainer-tuned", "trl-dpo"], generates=False)
    with pytest.raises(TunelabError, match="peers trl-grpo: this config's objective runs against objective grpo"):
        peer_registry.check_runs_beside(["trl-grpo"], generates=False)
    with pytest.raises(TunelabError, match="runs against the peers trl-grpo"):
        peer_registry.check_runs_beside(["trl-sft"], generates=True)
    assert not any(hasattr(p, "records") for p in peer_registry.REGISTRY.values())  # one store: bench/store.py
