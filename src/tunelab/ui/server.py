"""`tunelab ui`'s web app: a Starlette (ASGI) app serving one static page (static/: HTML, JS, CSS and the vendored
uPlot chart library) and a JSON API over plan, the runs folder, generation and training runs.

Access: with a token (required for a non-loopback host, commands/ui.py) every request must carry it, as the
`X-Tunelab-Token` header, the `token` query parameter (the URL printed at start) or the cookie that URL sets;
without one, on loopback, requests must name a loopback Host (a DNS-rebinding page cannot reach the API). A POST
must be JSON, which a cross-site form cannot send without a CORS preflight this app never answers.
"""

from __future__ import annotations

import logging
from contextlib import asynccontextmanager
from importlib import resources
from pathlib import Path

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, PlainTextResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from ..access import key_matches, loopback_refusal
from ..errors import TunelabError
from . import planning, runs
from .chat import Chat
from .jobs import Jobs

TOKEN_HEADER = "x-tunelab-token"
COOKIE = "tunelab_token"
# Files the runs browser serves as text; anything else under --runs is sent as a download.
TEXT_SUFFIXES = (".yaml", ".yml", ".json", ".jsonl", ".md", ".txt", ".log", "")

log = logging.getLogger("tunelab.ui")


class Guard:
    """ASGI middleware: the token, or a loopback Host when there is none; JSON bodies for POST."""

    def __init__(self, app, token: str | None) -> None:
        self.app, self.token = app, token

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        request = Request(scope)
        refusal = self.refusal(request)
        if refusal is not None:
            return await PlainTextResponse(refusal, status_code=403)(scope, receive, send)
        given = request.query_params.get("token")
        if self.token and given and request.url.path == "/":
            # The printed URL carries the token once; the page's own requests then send the cookie.
            response = FileResponse(static_file("index.html"))
            response.set_cookie(COOKIE, self.token, httponly=True, samesite="strict")
            return await response(scope, receive, send)
        return await self.app(scope, receive, send)

    def refusal(self, request: Request) -> str | None:
        if self.token:
            given = (
                request.headers.get(TOKEN_HEADER)
                or request.query_params.get("token")
                or request.cookies.get(COOKIE)
                or ""
            )
            if not key_matches(given, self.token):
                return "refused: this tunelab ui needs its token (open the URL it printed at start)"
        else:
            refusal = loopback_refusal(request.headers.get("host", ""))
            if refusal is not None:
                return refusal
        if request.method == "POST" and request.headers.get("content-type", "").split(";")[0] != "application/json":
            return "refused: the API takes JSON bodies"
        return None


def static_file(name: str) -> Path:
    return Path(str(resources.files("tunelab.ui").joinpath("static", name)))


class Api:
    """The JSON API's handlers over one runs folder, its started runs and its loaded models."""

    def __init__(self, runs_dir: Path, configs_dir: Path) -> None:
        self.runs_dir = runs_dir
        self.jobs = Jobs(runs_dir, configs_dir)
        self.chat = Chat()

    def index(self, request: Request) -> Response:
        return FileResponse(static_file("index.html"))

    def choices(self, request: Request) -> Response:
        return JSONResponse({**planning.choices(), "configs": self.jobs.config_names(), "runs_dir": str(self.runs_dir)})

    async def plan(self, request: Request) -> Response:
        return JSONResponse(await _thread(planning.predict, await _body(request)))

    def run_list(self, request: Request) -> Response:
        rows = [runs.summary_row(self.runs_dir, n, self.jobs.exit_status(n)) for n in runs.run_names(self.runs_dir)]
        return JSONResponse({"runs": rows, "bench": runs.bench_databases(self.runs_dir), "jobs": self.jobs.views()})

    def run_detail(self, request: Request) -> Response:
        name = request.query_params.get("name", "")
        return JSONResponse(runs.detail(self.runs_dir, name, self.jobs.exit_status(name)))

    def run_file(self, request: Request) -> Response:
        path = runs.inside(self.runs_dir, request.query_params.get("path", ""))
        if not path.is_file():
            raise TunelabError(f"{request.query_params.get('path')}: no such file under the runs folder")
        if path.suffix in TEXT_SUFFIXES:
            return PlainTextResponse(path.read_text(errors="replace"))
        return FileResponse(path, filename=path.name)

    def bench(self, request: Request) -> Response:
        return JSONResponse({"rows": runs.bench_rows(self.runs_dir, request.query_params.get("name", ""))})

    async def generate(self, request: Request) -> Response:
        form = await _body(request)
        adapter = runs.inside(self.runs_dir, str(form.get("run", ""))) / "adapter"
        answer = await _thread(
            self.chat.answer,
            adapter,
            str(form.get("prompt", "")),
            _int(form.get("max_new_tokens", 64), "max new tokens"),
            _float(form.get("temperature", 0), "temperature"),
            bool(form.get("base", True)),
        )
        return JSONResponse(answer)

    async def start(self, request: Request) -> Response:
        form = await _body(request)
        overrides = form.get("overrides") or []
        if isinstance(overrides, str):
            overrides = overrides.split()
        return JSONResponse(self.jobs.start(str(form.get("config", "")), [str(o) for o in overrides]))

    async def stop(self, request: Request) -> Response:
        form = await _body(request)
        return JSONResponse(self.jobs.stop(_int(form.get("id"), "job id")))


def build_app(runs_dir: Path, configs_dir: Path, token: str | None = None) -> Starlette:
    """The app over `runs_dir` (the runs browser's root) and `configs_dir` (the configs a run starts from)."""
    api = Api(runs_dir, configs_dir)

    @asynccontextmanager
    async def lifespan(app):
        yield
        api.jobs.close()

    routes = [
        Route("/", api.index),
        Route("/api/choices", api.choices),
        Route("/api/plan", api.plan, methods=["POST"]),
        Route("/api/runs", api.run_list),
        Route("/api/run", api.run_detail),
        Route("/api/file", api.run_file),
        Route("/api/bench", api.bench),
        Route("/api/generate", api.generate, methods=["POST"]),
        Route("/api/start", api.start, methods=["POST"]),
        Route("/api/stop", api.stop, methods=["POST"]),
        Mount("/static", StaticFiles(directory=str(static_file(""))), name="static"),
    ]
    app = Starlette(
        routes=routes,
        middleware=[Middleware(Guard, token=token)],
        exception_handlers={TunelabError: _user_error},
        lifespan=lifespan,
    )
    app.state.jobs = api.jobs
    return app


async def _body(request: Request) -> dict:
    try:
        value = await request.json()
    except ValueError:
        raise TunelabError("the request body is not JSON") from None
    if not isinstance(value, dict):
        raise TunelabError("the request body must be a JSON object")
    return value


async def _thread(fn, *args):
    """A blocking call (plan's estimate, generation) off the event loop, so the page's polling goes on."""
    from starlette.concurrency import run_in_threadpool

    return await run_in_threadpool(fn, *args)


def _user_error(request: Request, exc: Exception) -> Response:
    return JSONResponse({"error": str(exc)}, status_code=400)


def _int(value, what: str) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        raise TunelabError(f"{what}: {value!r} is not a whole number") from None


def _float(value, what: str) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        raise TunelabError(f"{what}: {value!r} is not a number") from None
