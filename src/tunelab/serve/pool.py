"""The models `tunelab serve` answers with: one base in memory (an HF directory, a merged model, a `.gguf`, the
embedded default) and any number of saved adapters on it, each a model name. The adapter a request names is switched
on with peft's `set_adapter`, the base under `disable_adapter`: nothing is reloaded between requests. Adapters are
loaded as `tunelab eval` loads one (model/adapters.py: the fused LoRA forward, packed for inference), so a greedy
answer here is eval's."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ..errors import TunelabError


@dataclass(frozen=True)
class Served:
    """One model name a request can ask for."""

    name: str
    adapter: str | None  # the adapter folder; None: the base itself


def parse_adapters(specs: list[str]) -> dict[str, str]:
    """`--adapter [NAME=]PATH` values -> {name: path}; a bare RUN/adapter is named after its run's folder."""
    out: dict[str, str] = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep:
            folder = Path(spec).resolve()
            name, path = (folder.parent.name if folder.name == "adapter" else folder.name), spec
        if not name or not path:
            raise TunelabError(f"--adapter {spec!r}: write NAME=PATH or a path")
        if name in out:
            raise TunelabError(f"--adapter {spec!r}: the name {name!r} is taken; give it another with NAME=PATH")
        out[name] = path
    return out


class ModelPool:
    """The loaded base, its tokenizer and its adapters; `use(name)` switches to one. One generation at a time
    uses it (engine.py's worker thread)."""

    def __init__(self, base: str, adapters: dict[str, str], device, precision, base_name: str | None = None) -> None:
        from ..model.adapters import check_adapter, load_adapters
        from ..model.load import load_model
        from ..sources import load_tokenizer, resolve

        self.base_name = base_name or base_model_name(base)
        if self.base_name in adapters:
            raise TunelabError(f"--adapter {self.base_name}: that name is the base model's; name the adapter otherwise")
        for path in adapters.values():
            check_adapter(Path(path))
        source = resolve(base)
        self.tokenizer = load_tokenizer(source)
        model = load_model(source, precision.compute, "none", device)
        self.base = base
        self.context = context_length(model.config)
        self.model = load_adapters(model, adapters, base) if adapters else model
        self.models = [Served(self.base_name, None)] + [Served(n, p) for n, p in adapters.items()]

    def add(self, name: str, adapter: str) -> None:
        """One more adapter, served as `name` (`tunelab ui`'s Try it adds a run's when it is first asked for). Not
        while a generation runs."""
        from ..model.adapters import check_adapter, load_adapters, peft_from_pretrained
        from ..model.lora_linear import pack_for_inference, use_fused_lora

        if self.has(name):
            return
        check_adapter(Path(adapter))
        if self.adapted():
            peft_from_pretrained(self.model, adapter, self.base, name)
            self.model.requires_grad_(False)
            use_fused_lora(self.model)
            self.model.set_adapter(name)
            pack_for_inference(self.model)
        else:
            self.model = load_adapters(self.model, {name: adapter}, self.base)
        self.models.append(Served(name, adapter))

    def adapted(self) -> bool:
        """Whether the model carries adapters (a peft model; a plain transformers model has a `set_adapter` too)."""
        from peft import PeftModel

        return isinstance(self.model, PeftModel)

    def names(self) -> list[str]:
        return [m.name for m in self.models]

    def has(self, name: str) -> bool:
        return any(m.name == name for m in self.models)

    @contextlib.contextmanager
    def use(self, name: str) -> Iterator[object]:
        """The model with `name`'s adapter on (the base's: every adapter off), for one generation."""
        if name == self.base_name:
            if self.adapted():
                with self.model.disable_adapter():
                    yield self.model
            else:
                yield self.model
            return
        self.model.set_adapter(name)
        self.model.requires_grad_(False)  # peft's set_adapter marks the adapter trainable
        yield self.model


def base_model_name(base: str) -> str:
    """The name the base is served under: `embedded`, a hub id as given, a folder's or file's own name."""
    path = Path(base)
    if path.exists():
        return path.stem if path.suffix == ".gguf" else path.resolve().name
    return base


def context_length(config) -> int | None:
    """The longest sequence the model was built for (prompt plus completion), when its config says."""
    for key in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        value = getattr(config, key, None)
        if isinstance(value, int) and value > 0:
            return value
    return None
