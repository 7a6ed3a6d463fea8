"""The Try it tab: a typed prompt answered by a run's adapter and by its base model, side by side, through the
generation code `tunelab eval` uses (eval/setup.resolve_setup for the model, format and template the run trained
with; eval/generate for the prompt's tokens, the stops and the decoding), so a greedy answer here is the one
`tunelab eval --max-new-tokens N` gives for the same prompt."""

from __future__ import annotations

import threading
from collections import OrderedDict
from pathlib import Path

from ..errors import TunelabError
from ..eval.setup import prompt_row, resolve_setup

# Loaded (model, adapter) pairs kept between prompts: a base and its tuned copy.
KEEP_MODELS = 2
MAX_NEW_TOKENS = 512


class Chat:
    def __init__(self) -> None:
        self._models: OrderedDict[tuple[str, str | None], tuple] = OrderedDict()
        self._lock = threading.Lock()  # one generation at a time: the cores are shared, and so is the cache

    def _load(self, model: str, adapter: Path | None):
        key = (model, None if adapter is None else str(adapter))
        if key in self._models:
            self._models.move_to_end(key)
            return self._models[key]
        from ..device import pick_device, pick_precision
        from ..model.adapters import check_adapter, load_adapter
        from ..model.load import load_model
        from ..sources import load_tokenizer, resolve

        device = pick_device("auto")
        precision = pick_precision("auto", device)
        source = resolve(model)
        tokenizer = load_tokenizer(source)
        loaded = load_model(source, precision.compute, "none", device)
        if adapter is not None:
            check_adapter(adapter)
            loaded = load_adapter(loaded, str(adapter), model)
        self._models[key] = (loaded, tokenizer)
        while len(self._models) > KEEP_MODELS:
            self._models.popitem(last=False)
        return loaded, tokenizer

    def answer(self, adapter: Path, prompt: str, max_new_tokens: int, temperature: float, base: bool) -> dict:
        """The tuned completion of `prompt` (and the base model's, with `base`), greedy at temperature 0."""
        if not prompt.strip():
            raise TunelabError("type a prompt first")
        if not 1 <= max_new_tokens <= MAX_NEW_TOKENS:
            raise TunelabError(f"max new tokens must be in 1..{MAX_NEW_TOKENS}, got {max_new_tokens}")
        if not 0 <= temperature <= 5:
            raise TunelabError(f"temperature must be in 0..5 (0 is greedy), got {temperature}")
        setup = resolve_setup(str(adapter), None, None, None)
        with self._lock:
            out = {"model": setup.model, "format": setup.format, "template": setup.template}
            out["tuned"] = self._complete(setup, adapter, prompt, max_new_tokens, temperature)
            if base:
                out["base"] = self._complete(setup, None, prompt, max_new_tokens, temperature)
        return out

    def _complete(self, setup, adapter: Path | None, prompt: str, max_new_tokens: int, temperature: float) -> str:
        from ..data.formats import prompt_text
        from ..eval.generate import generate, prompt_ids, stops

        model, tokenizer = self._load(setup.model, adapter)
        # A `text` run has no prompt part: the typed text is continued as it stands.
        text = prompt_text(setup.format, setup.template, prompt_row(setup.format, prompt), tokenizer) or prompt
        ids = prompt_ids(tokenizer, [text])
        stop = stops(model, tokenizer, setup.format)
        return generate(model, tokenizer, ids, [max_new_tokens], 1, stop, temperature).texts[0]
