"""`tunelab serve`'s HTTP API: `/v1/models`, `/v1/chat/completions` and `/v1/completions` as OpenAI's API reference
defines them (request fields model, messages | prompt, temperature, top_p, max_tokens | max_completion_tokens, stop,
n, seed, stream, stream_options.include_usage; responses with ids, created, choices with finish_reason, usage;
streams as server-sent `data:` chunks ending with `data: [DONE]`).

Access, as `tunelab ui` decides it (access.py): with a key, every request carries `Authorization: Bearer KEY`;
without one (loopback only), its Host must be a loopback name. Every error is OpenAI's body,
{"error": {"message", "type", "param", "code"}}, with its status: 400 a bad request, 401 a wrong key, 404 an unknown
model or path, 500 a bug (logged here with its traceback, never sent).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from ..access import key_matches, loopback_refusal
from .engine import Engine, Job
from .pool import ModelPool

log = logging.getLogger("tunelab.serve")
# The most choices one request may ask for, and the most stop strings (OpenAI's own limit).
MAX_N = 16
MAX_STOPS = 4


class ApiError(Exception):
    """An OpenAI-shaped error: its status, message, type, the request field at fault and a code."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

    def response(self) -> JSONResponse:
        kind = {401: "authentication_error", 404: "invalid_request_error", 500: "server_error"}.get(
            self.status, "invalid_request_error"
        )
        body = {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}}
        return JSONResponse(body, status_code=self.status)


class KeyGuard:
    """ASGI middleware: `Authorization: Bearer KEY` when there is a key, else a loopback Host."""

    def __init__(self, app, key: str | None) -> None:
        self.app, self.key = app, key

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        request = Request(scope)
        if self.key:
            scheme, _, given = request.headers.get("authorization", "").partition(" ")
            if scheme.lower() != "bearer" or not key_matches(given.strip(), self.key):
                error = ApiError(
                    401, "Incorrect API key provided: send Authorization: Bearer KEY", code="invalid_api_key"
                )
                return await error.response()(scope, receive, send)
        else:
            refusal = loopback_refusal(request.headers.get("host", ""))
            if refusal is not None:
                return await ApiError(403, refusal, code="forbidden").response()(scope, receive, send)
        return await self.app(scope, receive, send)


class Api:
    def __init__(self, pool: ModelPool, engine: Engine, max_tokens: int) -> None:
        self.pool, self.engine, self.max_tokens = pool, engine, max_tokens
        self.created = int(time.time())

    def models(self, request: Request) -> Response:
        data = [{"id": n, "object": "model", "created": self.created, "owned_by": "tunelab"} for n in self.pool.names()]
        return JSONResponse({"object": "list", "data": data})

    def model(self, request: Request) -> Response:
        name = request.path_params["name"]
        self._check_model(name)
        return JSONResponse({"id": name, "object": "model", "created": self.created, "owned_by": "tunelab"})

    async def chat(self, request: Request) -> Response:
        from ..data.formats import chat_prompt

        body = await _body(request)
        model = self._model(body)
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise ApiError(400, "messages: a non-empty list of {role, content} is required", "messages")
        _unsupported(
            body, {"logprobs": (None, False), "top_logprobs": (None, 0), "response_format": (None, {"type": "text"})}
        )
        text = chat_prompt(self.pool.tokenizer, [_message(m, i) for i, m in enumerate(messages)])
        prompt = self._tokens(text)
        return await self._answer(request, body, model, [prompt], chat=True)

    async def completions(self, request: Request) -> Response:
        body = await _body(request)
        model = self._model(body)
        _unsupported(body, {"echo": (None, False), "suffix": (None, ""), "logprobs": (None,), "best_of": (None, 1)})
        given = body.get("prompt")
        if isinstance(given, str):
            prompts = [self._tokens(given)]
        elif isinstance(given, list) and given and all(isinstance(p, str) for p in given):
            prompts = [self._tokens(p) for p in given]
        elif isinstance(given, list) and given and all(isinstance(p, int) for p in given):
            prompts = [list(given)]
        else:
            raise ApiError(400, "prompt: a string, a list of strings or a list of token ids is required", "prompt")
        return await self._answer(request, body, model, prompts, chat=False)

    def _check_model(self, name) -> None:
        if not self.pool.has(name):
            raise ApiError(
                404,
                f"The model {name!r} does not exist; this server has {', '.join(self.pool.names())}",
                "model",
                "model_not_found",
            )

    def _model(self, body: dict) -> str:
        name = body.get("model")
        if not isinstance(name, str) or not name:
            raise ApiError(400, "model: required (one of GET /v1/models)", "model")
        self._check_model(name)
        if body.get("tools") or body.get("functions"):
            raise ApiError(400, "tools: not supported by tunelab serve", "tools")
        return name

    def _tokens(self, text: str) -> list[int]:
        from ..eval.generate import prompt_ids

        return prompt_ids(self.pool.tokenizer, [text])[0]

    def _jobs(self, body: dict, model: str, prompts: list[list[int]], chat: bool, emit) -> list[Job]:
        temperature = _number(body, "temperature", 1.0, 0.0, 2.0)
        top_p = _number(body, "top_p", 1.0, 0.0, 1.0)
        if top_p == 0:
            raise ApiError(400, "top_p: must be above 0", "top_p")
        n = _whole(body, "n", 1, 1, MAX_N)
        seed = body.get("seed")
        if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
            raise ApiError(400, f"seed: {seed!r} is not an integer", "seed")
        stop = body.get("stop")
        stops = () if stop is None else (stop,) if isinstance(stop, str) else stop
        if (
            not isinstance(stops, (list, tuple))
            or len(stops) > MAX_STOPS
            or not all(isinstance(s, str) and s for s in stops)
        ):
            raise ApiError(400, f"stop: a string or a list of at most {MAX_STOPS} non-empty strings", "stop")
        field = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
        asked = _whole(body, field, None, 1, None)
        jobs = []
        for index, prompt in enumerate(prompts):
            room = None if self.pool.context is None else self.pool.context - len(prompt)
            if room is not None and (room < 1 or (asked is not None and asked > room)):
                raise ApiError(
                    400,
                    f"This model's maximum context length is {self.pool.context} tokens; the prompt has {len(prompt)}"
                    + (f" and {field} asks for {asked}" if asked is not None else "")
                    + "; shorten the prompt or lower "
                    + field,
                    "messages" if chat else "prompt",
                    "context_length_exceeded",
                )
            cap = asked if asked is not None else min(self.max_tokens, room or self.max_tokens)
            first = index * n

            def relay(event, first=first):  # a prompt's choices are numbered after the earlier prompts'
                if event[0] in ("delta", "finish"):
                    event = (event[0], event[1] + first, *event[2:])
                emit(event)

            jobs.append(Job(model, prompt, cap, relay, chat, n, temperature, top_p, seed, tuple(stops)))
        return jobs

    async def _answer(self, request: Request, body: dict, model: str, prompts, chat: bool) -> Response:
        loop = asyncio.get_running_loop()
        events: asyncio.Queue = asyncio.Queue()

        def emit(event) -> None:
            loop.call_soon_threadsafe(events.put_nowait, event)

        jobs = self._jobs(body, model, prompts, chat, emit)
        stream = body.get("stream") is True
        options = body.get("stream_options") or {}
        usage_wanted = isinstance(options, dict) and options.get("include_usage") is True
        reply = _Reply(chat, model, sum(len(p) for p in prompts))
        for job in jobs:
            self.engine.submit(job)
        if stream:
            return StreamingResponse(
                self._stream(jobs, events, reply, usage_wanted),
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache"},
            )
        try:
            await _drain(jobs, events, reply)
        finally:
            for job in jobs:  # a client gone before its answer: its rows end at the next step
                job.cancelled.set()
        return JSONResponse(reply.whole())

    async def _stream(self, jobs, events: asyncio.Queue, reply: _Reply, usage_wanted: bool) -> AsyncIterator[str]:
        try:
            for index in range(sum(job.n for job in jobs)):
                yield _sse(reply.chunk(index, role=True))
            try:
                async for event in _events(jobs, events, reply):
                    if event[0] == "delta":
                        yield _sse(reply.chunk(event[1], text=event[2]))
                    elif event[0] == "finish":
                        yield _sse(reply.chunk(event[1], finish=event[2]))
            except ApiError as e:  # the status is sent already: the error is the stream's last event
                yield _sse(json.loads(e.response().body))
                return
            if usage_wanted:
                yield _sse({**reply.head("chunk"), "choices": [], "usage": reply.usage()})
            yield "data: [DONE]\n\n"
        finally:  # also when the client disconnects mid-stream: its rows end at the next step
            for job in jobs:
                job.cancelled.set()


class _Reply:
    """One response's id and choices as they are written."""

    def __init__(self, chat: bool, model: str, prompt_tokens: int) -> None:
        self.chat, self.model, self.prompt_tokens = chat, model, prompt_tokens
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())
        self.texts: dict[int, list[str]] = {}
        self.finish: dict[int, str] = {}
        self.tokens = 0

    def head(self, kind: str) -> dict:
        obj = ("chat.completion" if self.chat else "text_completion") + (
            ".chunk" if kind == "chunk" and self.chat else ""
        )
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model, "system_fingerprint": None}

    def record(self, event) -> None:
        if event[0] == "delta":
            self.texts.setdefault(event[1], []).append(event[2])
        elif event[0] == "finish":
            self.finish[event[1]] = event[2]
            self.tokens += event[3]

    def usage(self) -> dict:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.tokens,
            "total_tokens": self.prompt_tokens + self.tokens,
        }

    def chunk(self, index: int, text: str | None = None, finish: str | None = None, role: bool = False) -> dict:
        if self.chat:
            delta = {"role": "assistant", "content": ""} if role else ({} if text is None else {"content": text})
            choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish}
        else:
            choice = {"index": index, "text": text or "", "logprobs": None, "finish_reason": finish}
        return {**self.head("chunk"), "choices": [choice]}

    def whole(self) -> dict:
        choices = []
        for index in sorted(self.finish):
            text = "".join(self.texts.get(index, []))
            if self.chat:
                message = {"role": "assistant", "content": text, "refusal": None}
                choices.append(
                    {"index": index, "message": message, "logprobs": None, "finish_reason": self.finish[index]}
                )
            else:
                choices.append({"index": index, "text": text, "logprobs": None, "finish_reason": self.finish[index]})
        return {**self.head("whole"), "choices": choices, "usage": self.usage()}


async def _events(jobs, events: asyncio.Queue, reply: _Reply):
    """The jobs' events until every job is done; an engine error becomes a 500."""
    pending = len(jobs)
    while pending:
        event = await events.get()
        if event[0] == "done":
            pending -= 1
            continue
        if event[0] == "error":
            log.error("generation failed", exc_info=event[1])
            raise ApiError(500, "The server failed to generate this completion (its log has the traceback)")
        reply.record(event)
        yield event


async def _drain(jobs, events: asyncio.Queue, reply: _Reply) -> None:
    async for _ in _events(jobs, events, reply):
        pass


def _unsupported(body: dict, allowed: dict) -> None:
    """A 400 naming the first field set to something this server does not do (each field's harmless values given)."""
    for field, values in allowed.items():
        if body.get(field) not in values:
            raise ApiError(400, f"{field}: {body.get(field)!r} is not supported by tunelab serve", field)


def _sse(payload: dict) -> str:
    return f"data: {json.dumps(payload)}\n\n"


def _message(m, index: int) -> dict:
    where = f"messages[{index}]"
    if not isinstance(m, dict) or not isinstance(m.get("role"), str):
        raise ApiError(400, f"{where}: an object with a role and content is required", where)
    content = m.get("content")
    if isinstance(content, list):  # content parts: only text ones
        if not all(isinstance(p, dict) and p.get("type") == "text" for p in content):
            raise ApiError(400, f"{where}.content: only text parts are supported", f"{where}.content")
        content = "".join(str(p.get("text", "")) for p in content)
    if not isinstance(content, str):
        raise ApiError(400, f"{where}.content: a string is required", f"{where}.content")
    role = "system" if m["role"] == "developer" else m["role"]
    return {"role": role, "content": content}


def _number(body: dict, field: str, default: float, low: float, high: float) -> float:
    value = body.get(field)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise ApiError(400, f"{field}: {value!r} is not a number in {low:g}..{high:g}", field)
    return float(value)


def _whole(body: dict, field: str, default, low: int, high: int | None):
    value = body.get(field)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
        bound = f"{low}..{high}" if high is not None else f"at least {low}"
        raise ApiError(400, f"{field}: {value!r} must be a whole number, {bound}", field)
    return value


async def _body(request: Request) -> dict:
    try:
        value = await request.json()
    except ValueError:
        raise ApiError(400, "The request body is not JSON") from None
    if not isinstance(value, dict):
        raise ApiError(400, "The request body must be a JSON object")
    return value


def _api_error(request: Request, exc: Exception) -> Response:
    return exc.response()


def _http_error(request: Request, exc: Exception) -> Response:
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
    return ApiError(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}", code=code).response()


def _server_error(request: Request, exc: Exception) -> Response:
    log.error("request failed", exc_info=exc)
    return ApiError(500, "The server failed on this request (its log has the traceback)").response()


def build_app(
    pool: ModelPool, key: str | None = None, batch_size: int = 16, max_tokens: int = 256, decode: str = "dynamic"
) -> Starlette:
    """The OpenAI-compatible app over `pool`: its worker starts with the app and stops with it."""
    from starlette.middleware import Middleware

    engine = Engine(pool, batch_size, decode)
    api = Api(pool, engine, max_tokens)

    @asynccontextmanager
    async def lifespan(app):
        yield
        engine.close()

    routes = [
        Route("/v1/models", api.models),
        Route("/v1/models/{name:path}", api.model),
        Route("/v1/chat/completions", api.chat, methods=["POST"]),
        Route("/v1/completions", api.completions, methods=["POST"]),
    ]
    app = Starlette(
        routes=routes,
        middleware=[Middleware(KeyGuard, key=key)],
        exception_handlers={ApiError: _api_error, HTTPException: _http_error, Exception: _server_error},
        lifespan=lifespan,
    )
    app.state.engine = engine
    return app
