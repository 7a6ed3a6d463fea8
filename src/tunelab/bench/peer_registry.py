"""The peer registry: each peer bench runs beside tunelab, one row saying what it runs, the objective it runs
beside and what it needs (its records go to the results database, bench/store.py). `tunelab bench peers` (its names and help), the suites
(bench/suites.yaml's `peers`), the measuring loops and guide.md's bench table read these rows and never list peer
names of their own (tests/unit/bench/test_peer_registry.py). The recipes themselves are bench/peers.py's (the
Hugging Face trainers) and bench/grpo_peer.py's (TRL's GRPOTrainer). Torch-free."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

from .. import objectives
from ..errors import TunelabError

# The packages a peer may need: the module it imports -> (its name in the refusal, what `pip install` takes).
PACKAGES = {"trl": ("TRL", "trl"), "liger_kernel": ("liger-kernel", "liger-kernel")}


@dataclass(frozen=True)
class Peer:
    name: str
    runs: str  # what it runs, one line (the CLI's help, guide.md)
    objective: str = "sft"  # the tunelab objective it runs beside (objectives.py): its data and what it trains
    packages: tuple[str, ...] = ()  # modules it imports (PACKAGES), refused before a process is spawned for it
    cuda: str = ""  # why it needs a CUDA device; empty: it runs on any device

    @property
    def generates(self) -> bool:
        """Whether it samples its own completions: it runs beside tunelab's generating objective only."""
        return objectives.get(self.objective).generates

    @property
    def pairs(self) -> bool:
        """Whether it trains on preference pairs (data/pairs.py's rows) instead of single responses."""
        return objectives.get(self.objective).pairs

    def refusal(self, device: str) -> str | None:
        """Why it cannot run on `device` (`cpu`, `cuda:0`) with the packages installed here; None when it can."""
        if self.cuda and not device.startswith("cuda"):
            return f"peer {self.name} needs a CUDA device ({self.cuda}); this is {device}"
        for module in self.packages:
            if importlib.util.find_spec(module) is None:
                label, pip = PACKAGES[module]
                return f"peer {self.name} needs {label}, which is not installed; `pip install {pip}` or drop the peer"
        return None

    @property
    def label(self) -> str:
        """The name with what limits it, as the CLI's help lists it: `hf-trainer-liger (CUDA)`."""
        limits = (["CUDA"] if self.cuda else []) + (
            [f"objective {self.objective}"] if self.pairs or self.generates else []
        )
        return f"{self.name} ({', '.join(limits)})" if limits else self.name


REGISTRY = {
    p.name: p
    for p in (
        Peer(
            name="hf-trainer-seed",
            runs="transformers.Trainer + PEFT as the seed repos write it: LoRA r 8 on q_proj/v_proj, rows padded "
            "to 512, fp16 AMP on a GPU",
        ),
        Peer(
            name="hf-trainer-tuned",
            runs="transformers.Trainer as a careful user writes it: length-grouped dynamic padding, bf16, fused "
            "AdamW, tunelab's LoRA",
        ),
        Peer(
            name="hf-trainer-liger",
            runs="hf-trainer-tuned with use_liger_kernel (Liger's fused Triton kernels)",
            packages=("liger_kernel",),
            cuda="Liger's kernels are Triton",
        ),
        Peer(name="trl-sft", runs="TRL's SFTTrainer with its padding-free packing", packages=("trl",)),
        Peer(
            name="trl-dpo",
            runs="TRL's DPOTrainer on preference pairs, equal pairs per step",
            objective="dpo",
            packages=("trl",),
        ),
        Peer(
            name="trl-grpo",
            runs="TRL's GRPOTrainer beside tunelab's GRPO, equal prompts x G completions per step",
            objective="grpo",
            packages=("trl",),
        ),
    )
}
NAMES = tuple(REGISTRY)


def get(name: str) -> Peer:
    """The row of peer `name`; an unknown name fails naming the known ones."""
    if name not in REGISTRY:
        raise TunelabError(f"unknown peer {name!r}; choose from {', '.join(NAMES)}")
    return REGISTRY[name]


def check_runs_beside(names: list[str], generates: bool) -> None:
    """A generating objective (grpo) runs against generating peers only, and they against it only."""
    wrong = [n for n in names if get(n).generates != generates]
    if wrong:
        generating = [n for n in objectives.NAMES if objectives.get(n).generates]
        need = (
            f"objective {', '.join(generating)}"
            if not generates
            else "the peers " + ", ".join(n for n in NAMES if get(n).generates)
        )
        raise TunelabError(f"peers {', '.join(wrong)}: this config's objective runs against {need}")
