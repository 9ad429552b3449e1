"""`gptpipe serve`'s HTTP side: an OpenAI-compatible completions API over the batched decode loop.

`POST /v1/completions` (OpenAI's body; `stream` as server-sent events), `POST /v1/chat/completions` (a chat
model's answer to OpenAI's messages, rendered in its chat template, ending at its end of turn; streamed the
same way), `GET /v1/models`, `GET /health`, `GET /metrics` (Prometheus' text) and `POST /invocations`
(MLflow's scoring body, for the clients of the MLflow model server). Each prompt of a request becomes a
`Sequence` queued on the `Scheduler`; the handler waits for its events on the event loop, so thousands of
waiting clients cost no thread each. A client that leaves, or a request past its deadline, cancels its
sequences: their rows in the batch are free at the next step. Every refusal is OpenAI's error object with
one sentence (400, 401, 404, 413, 429 with Retry-After, 504); a failure inside is a 500 with one sentence,
its traceback in the server's log alone. The API key, when one is set, is compared in constant time and
never logged.
"""

from __future__ import annotations

import asyncio
import hmac
import itertools
import json
import secrets
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, suppress
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from gptcore.serving.config import ServeConfig
from gptcore.serving.decoder import BatchDecoder
from gptcore.serving.metrics import ServerMetrics
from gptcore.serving.requests import BadRequest, Job, chat_job, completion_job, invocation_job
from gptcore.serving.scheduler import QueueFull, Scheduler
from gptcore.serving.sequence import Sequence
from gptcore.serving.served import ServedModel
from gptcore.tools.records import JSONObject

# Answered without the API key: a load balancer's probe carries none, and the chat page asks for it (its
# requests to the API carry the key a person types into it).
OPEN_PATHS = ("/health", "/ping", "/")
CHAT_PAGE = Path(__file__).with_name("static") / "chat.html"  # one static page: no build, no CDN
ENDPOINTS = (
    "/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/ping", "/metrics", "/invocations",
    "/",
)  # fmt: skip
LEFT = (-1, "", None)  # the event a request's watcher queues when its client has left


class CompletionServer:
    """The served model and its decode loop; `start` loads the model on the loop's thread."""

    def __init__(self, load: Callable[[], ServedModel], limits: ServeConfig) -> None:
        self.limits = limits
        self.served: ServedModel | None = None
        self.metrics = ServerMetrics(lambda: self.scheduler.waiting, lambda: self.scheduler.running)
        self.scheduler = Scheduler(lambda: self._build(load), limits.max_queue, self.metrics)
        self.started = time.time()

    def _build(self, load: Callable[[], ServedModel]) -> BatchDecoder:
        self.served = load()
        return BatchDecoder(self.served.model, self.limits.max_batch, self.limits.step_tokens)

    def start(self) -> CompletionServer:
        self.scheduler.start()
        return self

    def stop(self) -> None:
        self.scheduler.stop()

    @property
    def model(self) -> ServedModel:
        assert self.served is not None, "start the server first"
        return self.served

    def sequences(self, job: Job) -> list[Sequence]:
        """A sequence per prompt (a chat request's: its messages in the template, ending at the end of
        turn); a prompt longer than the model's window is refused by name."""
        served, deadline = self.model, time.monotonic() + self.limits.request_timeout
        if job.chat is not None:
            return [self._chat_sequence(job, deadline)]
        sequences = []
        for index, prompt in enumerate(job.prompts):
            ids = served.encode(prompt)
            where = "prompt" if len(job.prompts) == 1 else f"prompt[{index}]"
            self._fits(ids, where, "prompt")
            end = served.end_of_text if job.stop_at_end_of_text else None
            sequences.append(Sequence(ids, job.sampling, served.tokenizer, end, deadline, stream=job.stream))
        return sequences

    def _chat_sequence(self, job: Job, deadline: float) -> Sequence:
        served = self.model
        if served.chat_template is None:
            message = (
                f"model: {served.name} has no chat template (it was not chat fine-tuned: "
                "finetune.format: chat); POST /v1/completions continues text"
            )
            raise BadRequest(400, message, "model")
        assert job.chat is not None
        ids = served.encode_chat(job.chat)
        self._fits(ids, "messages", "messages")
        sampling = job.sampling
        if job.within_window:
            sampling = replace(
                sampling, max_tokens=max(1, min(sampling.max_tokens, served.window - len(ids)))
            )
        return Sequence(ids, sampling, served.tokenizer, served.end_of_turn, deadline, stream=job.stream)

    def _fits(self, ids: list[int], where: str, param: str) -> None:
        window = self.model.window
        if len(ids) > window:
            message = f"{where}: {len(ids)} tokens is more than this model's window of {window} tokens"
            raise BadRequest(400, message, param)


@dataclass
class Waiting:
    """A request's sequences, their events delivered onto the event loop as they happen."""

    server: CompletionServer
    sequences: list[Sequence]
    events: asyncio.Queue = field(default_factory=asyncio.Queue)

    def __post_init__(self) -> None:
        loop = asyncio.get_running_loop()
        for index, sequence in enumerate(self.sequences):
            sequence.on_event = self._bridge(loop, index, sequence)

    def _bridge(self, loop: asyncio.AbstractEventLoop, index: int, sequence: Sequence) -> Callable:
        def deliver(delta: str, reason: str | None) -> None:  # on the decode thread
            if reason is not None:
                self.server.metrics.sequence_ended(sequence)
            with suppress(RuntimeError):  # the event loop closed: the server is stopping
                loop.call_soon_threadsafe(self.events.put_nowait, (index, delta, reason))

        return deliver

    def submit(self) -> None:
        try:
            self.server.scheduler.submit(self.sequences)
        except QueueFull as error:
            raise BadRequest(429, f"the server is busy: {error}; retry shortly") from None

    async def until_done(self, request: Request) -> AsyncIterator[tuple[int, str, str | None]]:
        """Every event up to each sequence's last (the one with its finish reason); it stops early when
        the client leaves or the deadline passes (the sequences cancelled)."""
        watcher = asyncio.create_task(self._watch(request))
        try:
            ended = 0
            while ended < len(self.sequences):
                event = await self.next_event()
                if event is None:
                    return
                ended += event[2] is not None
                yield event
        finally:
            watcher.cancel()

    async def _watch(self, request: Request) -> None:
        """Wait for the client to leave (the body is read: the next message is its disconnect), then
        wake the handler: a waiting request costs nothing until then, however long it waits."""
        while (await request.receive())["type"] != "http.disconnect":
            pass
        self.events.put_nowait(LEFT)

    async def next_event(self) -> tuple[int, str, str | None] | None:
        """The next event; None when the client left or the deadline passed (the sequences cancelled)."""
        deadline = self.sequences[0].deadline
        remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
        try:
            async with asyncio.timeout(remaining):
                event = await self.events.get()
        except TimeoutError:
            return self.cancel()
        return self.cancel() if event is LEFT else event

    def cancel(self) -> None:
        self.server.scheduler.cancel([s for s in self.sequences if not s.finished])

    def usage(self) -> dict[str, int]:
        prompt = sum(len(s.prompt_ids) for s in self.sequences)
        completion = sum(len(s.generated) for s in self.sequences)
        total = prompt + completion
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": total}


@dataclass(frozen=True)
class Health:
    """`GET /health`."""

    status: str  # "ok" while it answers
    model: str  # the served model's name
    running: int  # prompts being decoded
    waiting: int  # prompts queued


@dataclass(frozen=True)
class ModelCard:
    """The served model in `GET /v1/models` (OpenAI's model object, and this server's limits)."""

    id: str  # its name
    object: str  # "model"
    created: int  # when the server started, Unix time
    owned_by: str  # "gptpipe"
    max_model_len: int  # prompt tokens at most
    max_tokens: int  # new tokens a prompt may ask for at most
    precision: str  # the weights' method (fp32, int8, ...)


@dataclass(frozen=True)
class ModelList:
    """`GET /v1/models`: the one model served."""

    object: str  # "list"
    data: list[ModelCard]


@dataclass(frozen=True)
class Head:
    """What every completion body and chunk starts with (OpenAI's)."""

    id: str  # cmpl-<hex> (chat: chatcmpl-<hex>)
    object: str  # text_completion (chat: chat.completion, chat.completion.chunk)
    created: int  # Unix time
    model: str  # the served model's name


@dataclass(frozen=True)
class Choice:
    """One prompt's text in a completion body or chunk (OpenAI's)."""

    text: str  # the completion, or a chunk's piece of it
    index: int  # the prompt's place in the request
    logprobs: None  # not given
    finish_reason: str | None  # stop, length, ...; None while it goes on


def error_body(message: str, status: int, param: str | None = None) -> JSONObject:
    kind = {401: "authentication_error", 404: "not_found_error", 429: "rate_limit_error"}.get(
        status, "invalid_request_error" if status < 500 else "server_error"
    )
    return {"error": {"message": message, "type": kind, "param": param, "code": None}}


def refusal(status: int, message: str, param: str | None = None) -> JSONResponse:
    return JSONResponse(error_body(message, status, param), status_code=status, headers=_retry(status))


def _retry(status: int) -> dict[str, str] | None:
    return {"Retry-After": "1"} if status == 429 else None  # a full queue drains in about a second


async def read_body(request: Request, limit: int) -> bytes:
    """The body, refused with 413 past `limit` bytes (by its length header, or as it arrives)."""
    declared = request.headers.get("content-length")
    too_large = f"body: more than {limit} bytes, this server's limit"
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise BadRequest(413, too_large)
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise BadRequest(413, too_large)
    return bytes(body)


def create_app(server: CompletionServer) -> Starlette:
    """The HTTP API of a started `server`; shutting the app down stops its decode loop. Starlette's
    routing, nothing above it: a short request's time belongs to the model (docs/inference.md)."""
    limits = server.limits

    @asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        yield
        await asyncio.to_thread(server.stop)

    async def health(_: Request) -> Response:
        served, scheduler = server.model, server.scheduler
        return JSONResponse(asdict(Health("ok", served.name, scheduler.running, scheduler.waiting)))

    page = CHAT_PAGE.read_text(encoding="utf-8")

    async def chat_page(_: Request) -> Response:
        return HTMLResponse(page)

    async def ping(_: Request) -> Response:
        return Response("\n", media_type="application/json")  # MLflow's scoring server's probe

    async def metrics(_: Request) -> Response:
        return Response(server.metrics.text(), media_type="text/plain; version=0.0.4; charset=utf-8")

    async def models(_: Request) -> Response:
        served = server.model
        card = ModelCard(
            served.name, "model", int(server.started), "gptpipe", served.window, limits.max_tokens_cap,
            served.method,
        )  # fmt: skip
        return JSONResponse(asdict(ModelList("list", [card])))

    async def completions(request: Request) -> Response:
        job = completion_job(await read_body(request, limits.max_body_bytes), limits, server.model.name)
        return await _respond(server, job, request, _stream, _completion_body)

    async def chat_completions(request: Request) -> Response:
        job = chat_job(await read_body(request, limits.max_body_bytes), limits, server.model.name)
        return await _respond(server, job, request, _chat_stream, _chat_body)

    async def invocations(request: Request) -> Response:
        job = invocation_job(await read_body(request, limits.max_body_bytes), limits)
        waiting = Waiting(server, server.sequences(job))
        waiting.submit()
        if not await _wait(waiting, request):
            return _timed_out(waiting)
        return JSONResponse({"predictions": [sequence.text for sequence in waiting.sequences]})

    routes = [
        Route("/", chat_page, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/ping", ping, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/invocations", invocations, methods=["POST"]),
    ]
    return Starlette(
        routes=routes,
        middleware=[Middleware(Guard, server=server)],
        exception_handlers={BadRequest: _bad_request, HTTPException: _http_error, Exception: _failure},
        lifespan=lifespan,
    )


# --- every refusal as one sentence: OpenAI's error object, MLflow's on /invocations ---------------------


async def _bad_request(request: Request, error: Exception) -> Response:
    assert isinstance(error, BadRequest)
    if request.url.path == "/invocations":  # in MLflow's scoring server's words, for its clients
        body = {"error_code": "INVALID_PARAMETER_VALUE", "message": error.message}
        return JSONResponse(body, status_code=error.status, headers=_retry(error.status))
    return refusal(error.status, error.message, error.param)


async def _http_error(request: Request, error: Exception) -> Response:
    assert isinstance(error, HTTPException)
    messages = {
        404: f"{request.url.path}: no such endpoint; see GET /v1/models and POST /v1/completions",
        405: f"{request.method} {request.url.path}: method not allowed",
    }
    return refusal(error.status_code, messages.get(error.status_code, str(error.detail)))


async def _failure(_: Request, error: Exception) -> Response:
    return refusal(500, f"the server failed to answer ({type(error).__name__}); see its log")


class Guard:
    """The key (when set) on every path but /health and /ping; every answer counted by endpoint and
    status. Plain ASGI, not Starlette's `BaseHTTPMiddleware`: under that one a streaming handler's
    `request.is_disconnected()` says a client left that is still reading."""

    def __init__(self, app: Any, server: CompletionServer) -> None:
        self.app, self.server = app, server

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        status = {"code": 500}

        async def counted(message: dict) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        key = self.server.limits.api_key
        try:
            if key and scope["path"] not in OPEN_PATHS and not _authorized(Request(scope), key):
                message = "a valid API key is required: Authorization: Bearer <key>"
                await refusal(401, message)(scope, receive, counted)
            else:
                await self.app(scope, receive, counted)
        finally:
            endpoint = scope["path"] if scope["path"] in ENDPOINTS else "other"
            self.server.metrics.requests.labels(endpoint, str(status["code"])).inc()


def _authorized(request: Request, key: str) -> bool:
    given = request.headers.get("authorization", "")
    scheme, _, token = given.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), key.encode())


async def _wait(waiting: Waiting, request: Request) -> bool:
    """Wait for every sequence to end; False when one did not finish (the client left, the deadline)."""
    async for _ in waiting.until_done(request):
        pass
    return all(sequence.finish_reason in ("stop", "length") for sequence in waiting.sequences)


async def _respond(
    server: CompletionServer,
    job: Job,
    request: Request,
    streamer: Callable[[Waiting, Job, Request], AsyncIterator[str]],
    body: Callable[[Waiting], JSONObject],
) -> Response:
    """A job's sequences queued, then streamed as `streamer` writes events, or waited for and answered
    with `body`."""
    waiting = Waiting(server, server.sequences(job))
    waiting.submit()
    if job.stream:
        return StreamingResponse(streamer(waiting, job, request), media_type="text/event-stream")
    if not await _wait(waiting, request):
        return _timed_out(waiting)
    return JSONResponse(body(waiting))


def _completion_body(waiting: Waiting) -> JSONObject:
    choices = [_choice(index, s.text, s.finish_reason) for index, s in enumerate(waiting.sequences)]
    return {**_head(waiting.server), "choices": choices, "usage": waiting.usage()}


def _chat_body(waiting: Waiting) -> JSONObject:
    [sequence] = waiting.sequences
    message = {"role": "assistant", "content": sequence.text}
    choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": sequence.finish_reason}
    return {**_head(waiting.server, CHAT), "choices": [choice], "usage": waiting.usage()}


def _unfinished(waiting: Waiting) -> tuple[int, str]:
    """Why a request's sequences did not all finish, as a status and a sentence."""
    if any(sequence.finish_reason == "error" for sequence in waiting.sequences):
        return 500, "decoding failed inside the server; see its log"
    seconds = waiting.server.limits.request_timeout
    return 504, f"the request took longer than this server allows ({seconds:g} s); it was stopped"


def _timed_out(waiting: Waiting) -> JSONResponse:
    return refusal(*_unfinished(waiting))


COMPLETION_IDS = itertools.count()
ID_PREFIX = secrets.token_hex(6)  # one random prefix a process, a counter after it: unique, cheap


# What an id starts with and what `object` says, for each kind of body (OpenAI's).
TEXT = ("cmpl", "text_completion")
CHAT = ("chatcmpl", "chat.completion")
CHAT_CHUNK = ("chatcmpl", "chat.completion.chunk")


def _head(server: CompletionServer, kind: tuple[str, str] = TEXT) -> dict[str, str | int]:
    """The head of a completion body or chunk, as its body holds it (`Head`'s fields)."""
    prefix, name = kind
    head = Head(f"{prefix}-{ID_PREFIX}{next(COMPLETION_IDS):08x}", name, int(time.time()), server.model.name)
    return dict(vars(head))  # vars, not asdict: a flat record needs no deep copy


def _choice(index: int, text: str, reason: str | None) -> dict[str, str | int | None]:
    """A choice as its body holds it."""
    return dict(vars(Choice(text, index, None, reason)))


async def _stream(waiting: Waiting, job: Job, request: Request) -> AsyncIterator[str]:
    """Server-sent events: a chunk per piece of text, one with each prompt's finish reason, the usage
    when asked (`stream_options.include_usage`), then `[DONE]`. A deadline ends it with an error event."""
    head = _head(waiting.server)
    try:
        async for index, delta, reason in waiting.until_done(request):
            if reason in ("stop", "length") or (delta and reason is None):
                yield _event({**head, "choices": [_choice(index, delta, reason)]})
        for event in _closing(waiting, job, head):
            yield event
    finally:  # the client left mid-stream (the response task is cancelled): free the rows now
        waiting.cancel()


async def _chat_stream(waiting: Waiting, job: Job, request: Request) -> AsyncIterator[str]:
    """A chat answer as server-sent events, as OpenAI sends them: a first chunk with the role, a chunk
    per piece of the answer, one with the finish reason, the usage when asked, then `[DONE]`."""
    head = _head(waiting.server, CHAT_CHUNK)

    def chunk(delta: dict[str, str], reason: str | None) -> str:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}
        return _event({**head, "choices": [choice]})

    try:
        yield chunk({"role": "assistant", "content": ""}, None)
        async for _, delta, reason in waiting.until_done(request):
            if delta:
                yield chunk({"content": delta}, None)
            if reason in ("stop", "length"):
                yield chunk({}, reason)
        for event in _closing(waiting, job, head):
            yield event
    finally:  # the client left mid-stream: free the row now
        waiting.cancel()


def _closing(waiting: Waiting, job: Job, head: dict[str, str | int]) -> list[str]:
    """A stream's last events: an error event for a request that did not finish (a deadline, a failure),
    else the usage when asked (`stream_options.include_usage`); then `[DONE]`."""
    events = []
    if not all(s.finish_reason in ("stop", "length") for s in waiting.sequences):
        status, message = _unfinished(waiting)
        events.append(_event(error_body(message, status)))
    elif job.include_usage:
        events.append(_event({**head, "choices": [], "usage": waiting.usage()}))
    return [*events, "data: [DONE]\n\n"]


def _event(payload: JSONObject) -> str:
    return f"data: {json.dumps(payload)}\n\n"
