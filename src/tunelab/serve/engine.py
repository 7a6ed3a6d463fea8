"""Batched generation for `tunelab serve`: one worker thread owns the model (the cores are shared, and so is the
cache) and runs eval/sampling.py's decode loop, the one eval and GRPO generate with (KV cache, prepacked weights on
fp32 CPUs).

Requests that arrive while the worker is busy wait, and the next batch takes every one waiting: those that ask for
the same model and the same sampling (temperature, top-p; a seeded request alone, since its draws come from its own
generator) share one `sample` call, up to `batch_size` rows; a request's `n` choices are `n` rows of one prompt,
which the sampler prefills once. Tokens reach the request as they are drawn (`sample`'s `on_step`), so a stream
sends each as it comes, a stop string ends its row at once, and a request whose client has gone ends its rows at
the next step: its slot is free for the rest of the batch, and a waiting one is never started.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from .pool import ModelPool


@dataclass
class Job:
    """One request: `n` completions of one tokenized prompt. `emit` is called from the worker thread with
    ("delta", index, text), ("finish", index, reason, tokens) and finally ("done",) or ("error", exception)."""

    model: str
    prompt: list[int]
    max_tokens: int
    emit: Callable[[tuple], None]
    chat: bool = False  # a chat completion: the chat template's end-of-turn marker also stops it
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    cancelled: threading.Event = field(default_factory=threading.Event)

    def key(self) -> tuple:
        """Jobs with equal keys can share a `sample` call."""
        sampling = (0.0, 1.0) if self.temperature == 0 else (self.temperature, self.top_p)
        return (self.model, self.chat, *sampling, id(self) if self.seed is not None else None)


@dataclass
class _Row:
    """One choice of a job, as it is written."""

    job: Job
    index: int
    ids: list[int] = field(default_factory=list)
    sent: int = 0  # characters of its text already emitted
    finished: bool = False


class Engine:
    def __init__(self, pool: ModelPool, batch_size: int = 16, decode: str = "dynamic") -> None:
        self.pool, self.batch_size, self.decode = pool, batch_size, decode
        self._queue: queue.Queue[Job | None] = queue.Queue()
        self._thread = threading.Thread(target=self._work, name="tunelab-serve", daemon=True)
        self._thread.start()
        self._stops: dict[bool, object] = {}
        self.rows_cancelled = 0  # rows ended early because their client went away

    def submit(self, job: Job) -> None:
        self._queue.put(job)

    def complete(self, **fields) -> list[tuple[str, str]]:
        """A job's (text, finish reason) per choice, waiting for them (`tunelab ui`'s Try it: a blocking call)."""
        texts: dict[int, list[str]] = {}
        reasons: dict[int, str] = {}
        done = threading.Event()
        failed: list[BaseException] = []

        def emit(event: tuple) -> None:
            if event[0] == "delta":
                texts.setdefault(event[1], []).append(event[2])
            elif event[0] == "finish":
                reasons[event[1]] = event[2]
            else:
                failed.extend(event[1:2])
                done.set()

        job = Job(emit=emit, **fields)
        self.submit(job)
        done.wait()
        if failed:
            raise failed[0]
        return [("".join(texts.get(i, [])), reasons.get(i, "length")) for i in range(job.n)]

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=30)

    def _work(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            waiting = [first]
            while True:
                try:
                    job = self._queue.get_nowait()
                except queue.Empty:
                    break
                if job is None:
                    self._queue.put(None)  # stop after this batch
                    break
                waiting.append(job)
            groups: dict[tuple, list[Job]] = {}
            for job in waiting:
                if job.cancelled.is_set():  # its client left before a step began: its rows end unstarted
                    self.rows_cancelled += job.n
                    job.emit(("done",))
                else:
                    groups.setdefault(job.key(), []).append(job)
            for jobs in groups.values():
                for batch in _batches(jobs, self.batch_size):
                    try:
                        self._generate(batch)
                    except Exception as e:  # a bug: each waiting client gets a 500, the server goes on
                        for job in batch:
                            job.emit(("error", e))

    def _stop_ids(self, model, chat: bool):
        from ..eval.generate import stops

        if chat not in self._stops:
            self._stops[chat] = stops(model, self.pool.tokenizer, "chat" if chat else None)
        return self._stops[chat]

    def _generate(self, jobs: Sequence[Job]) -> None:
        import torch

        from ..eval.sampling import sample

        tokenizer = self.pool.tokenizer
        first = jobs[0]
        rows = [_Row(job, i) for job in jobs for i in range(job.n)]
        generator = None if first.seed is None else torch.Generator().manual_seed(first.seed)
        with self.pool.use(first.model) as model:
            stop = self._stop_ids(model, first.chat)
            stop_ids = set(stop.ids)
            pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (stop.ids or [0])[0]

            def on_step(tokens: torch.Tensor) -> torch.Tensor:
                ended = []
                for row, token in zip(rows, tokens.tolist()):
                    if not row.finished:
                        self._advance(row, token, stop_ids, stop.texts)
                    ended.append(row.finished)
                return torch.tensor(ended)

            sample(
                model,
                [row.job.prompt for row in rows],
                max(job.max_tokens for job in jobs),
                stop.ids,
                pad,
                temperature=first.temperature,
                top_p=first.top_p,
                generator=generator,
                decode=self.decode,
                on_step=on_step,
            )
        for row in rows:  # reached the batch's cap
            if not row.finished:
                self._finish(row, "length", stop.texts)
        for job in jobs:
            job.emit(("done",))

    def _advance(self, row: _Row, token: int, stop_ids: set[int], stop_texts: Sequence[str]) -> None:
        job = row.job
        if job.cancelled.is_set():
            row.finished = True
            self.rows_cancelled += 1
            return
        if token in stop_ids:
            row.ids.append(token)
            self._finish(row, "stop", stop_texts)
            return
        row.ids.append(token)
        text = self._text(row)
        for marker in (*job.stop, *stop_texts):
            if marker in text:
                self._finish(row, "stop", stop_texts)
                return
        if len(row.ids) >= job.max_tokens:
            self._finish(row, "length", stop_texts)
            return
        # Hold back what could still become a stop string, and a character the next token completes.
        hold = max((len(s) - 1 for s in (*job.stop, *stop_texts)), default=0)
        safe = len(text) - hold
        while safe > row.sent and text[safe - 1] == "\ufffd":
            safe -= 1
        if safe > row.sent:
            job.emit(("delta", row.index, text[row.sent : safe]))
            row.sent = safe

    def _text(self, row: _Row) -> str:
        ids = [i for i in row.ids if i not in self._stop_ids_of(row)]
        return self.pool.tokenizer.decode(ids, skip_special_tokens=True)

    def _stop_ids_of(self, row: _Row) -> set[int]:
        return set(self._stops[row.job.chat].ids)

    def _finish(self, row: _Row, reason: str, stop_texts: Sequence[str]) -> None:
        """End `row`: its text cut before its first stop string, the rest of it emitted, its finish sent."""
        row.finished = True
        text = self._text(row)
        for marker in (*row.job.stop, *stop_texts):
            text = text.split(marker, 1)[0]
        if len(text) > row.sent:
            row.job.emit(("delta", row.index, text[row.sent :]))
            row.sent = len(text)
        row.job.emit(("finish", row.index, reason, len(row.ids)))


def _batches(jobs: list[Job], rows: int) -> list[list[Job]]:
    """`jobs` in order, in batches of at most `rows` rows (a job's `n` rows stay together)."""
    out: list[list[Job]] = [[]]
    used = 0
    for job in jobs:
        if out[-1] and used + job.n > rows:
            out.append([])
            used = 0
        out[-1].append(job)
        used += job.n
    return out
