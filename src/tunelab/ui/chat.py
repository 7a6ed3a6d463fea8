"""The Try it tab: a typed prompt answered by a run's adapter and by its base model, side by side, through
`tunelab serve`'s engine (serve/engine.py over serve/pool.py: one base in memory, each run's adapter switched on per
request, generation by eval/sampling.py) with the prompt, stops and decoding `tunelab eval` uses (eval/setup's model,
format and template of the run; eval/generate's prompt tokens), so a greedy answer here is the one `tunelab eval
--max-new-tokens N` and `tunelab serve` give for the same prompt."""

from __future__ import annotations

import threading
from pathlib import Path

from ..errors import TunelabError
from ..eval.setup import prompt_row, resolve_setup

MAX_NEW_TOKENS = 512


class Chat:
    def __init__(self) -> None:
        self._served = None  # (base model name, ModelPool, Engine): the one base in memory
        self._lock = threading.Lock()  # one answer at a time: the cores are shared, and adapters are added between

    def _engine(self, model: str):
        if self._served is None or self._served[0] != model:
            from ..device import pick_device, pick_precision
            from ..serve.engine import Engine
            from ..serve.pool import ModelPool

            if self._served is not None:
                self._served[2].close()
            device = pick_device("auto")
            pool = ModelPool(model, {}, device, pick_precision("auto", device), base_name="base")
            self._served = (model, pool, Engine(pool, batch_size=1))
        return self._served[1], self._served[2]

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
            pool, engine = self._engine(setup.model)
            pool.add(str(adapter), str(adapter))
            out = {"model": setup.model, "format": setup.format, "template": setup.template}
            out["tuned"] = self._complete(pool, engine, setup, str(adapter), prompt, max_new_tokens, temperature)
            if base:
                out["base"] = self._complete(pool, engine, setup, "base", prompt, max_new_tokens, temperature)
        return out

    def _complete(self, pool, engine, setup, name: str, prompt: str, max_new_tokens: int, temperature: float) -> str:
        from ..data.formats import CONVERSATION_FORMATS, prompt_text
        from ..eval.generate import prompt_ids

        # A `text` run has no prompt part: the typed text is continued as it stands.
        text = prompt_text(setup.format, setup.template, prompt_row(setup.format, prompt), pool.tokenizer) or prompt
        ids = prompt_ids(pool.tokenizer, [text])[0]
        chat = setup.format in CONVERSATION_FORMATS
        [(answer, _)] = engine.complete(
            model=name, prompt=ids, max_tokens=max_new_tokens, chat=chat, temperature=temperature
        )
        return answer
