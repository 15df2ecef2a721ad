"""The gateway's HTTP server and its sessions.

`Gateway` serves `POST /v1/chat/completions` and `GET /v1/models` (Starlette on uvicorn, on a
daemon thread) on 127.0.0.1 only: the address is fixed, never another interface. A request
carries a run's token as its API key (`Authorization: Bearer TOKEN`); one without it, or with a
token that is not a live run's, is refused (401). A run belongs to a `Session`: the engine, the
renderer and tool format of the policy, and the limits of the calls.

Requests do not call the engine themselves: they queue in their session, and the thread that
drives it (`Session.drive`: in training the thread that collects the batch, which holds the
engine's lock; for `agentrl serve` a thread of its own) takes them in batches and calls
`engine.generate` once per batch and sampling setting. A batch is taken when every live run of
the session has a request queued, or `batch_wait_s` after its first request, so that agents that
call in lockstep share one generate call as the episodes of a `TextEnv` do.

Per-row seeds: a session's calls use one seed, and a prompt's `seed_offsets` count its earlier
rows in the session (`agentrl.rollout.engines.base.row_seeds`), so the n runs of a task, which
open with the same prompt, draw different samples whichever generate call they land in. A
session without a seed (`agentrl serve`) samples a request that has a `seed` with that seed
(`row_seeds` without offsets: the same request with the same seed gets the same reply, whatever
else is in its generate call; two such requests in one call draw as the `n` samples of one
request do), and one without from the engine's state.
"""

from __future__ import annotations

import asyncio
import errno
import json
import secrets
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from agentrl.gateway.http_body import read_body, receive_body
from agentrl.gateway.protocol import (
    ChatRequest,
    GatewayError,
    bad,
    check_template_kwargs,
    completion_body,
    cut_at_stop,
    error_body,
    finish_reason,
    forced_prefix,
    logprobs_body,
    parse_request,
    reply_message,
    split_calls,
    stream_chunks,
)
from agentrl.gateway.record import PromptTooLong, RunRecord
from agentrl.models.tokens import encode_continuation
from agentrl.rollout.chat import ChatRenderer
from agentrl.rollout.engines.base import SamplingParams, prompt_key

HOST = "127.0.0.1"
"""The only address the gateway listens on."""
MAX_REQUEST_BYTES = 4 * 2**20
"""The largest request body accepted (4 MiB); a larger one is refused with 413."""
INLINE_BYTES = 32 * 2**10
"""A request body up to this size (32 KiB) is rendered and answered on the server's event loop
thread (a few hundred microseconds: less than the two thread hand-offs it saves); a larger one
on a worker thread, so that its rendering does not hold up the other runs' requests."""


@dataclass
class RunState:
    """One agent run as the gateway sees it: its token, its calls (`record`; None: not recorded,
    `agentrl serve`), and what went wrong. `pending` counts its requests in the server,
    `last_active` is when it last started or got an answer (`time.monotonic()`)."""

    token: str
    session: Session
    record: RunRecord | None
    live: bool = True
    pending: int = 0
    last_active: float = field(default_factory=time.monotonic)
    calls: int = 0
    generate_s: float = 0.0
    refusals: list[str] = field(default_factory=list)
    failed: str | None = None
    truncated: bool = False
    finished: bool = False

    def finish(self) -> None:
        """The run's agent has returned (or was abandoned): batches stop waiting for its
        requests, and the thread driving its session wakes (it may be waiting for the end)."""
        self.finished = True
        self.session.wake()

    def refused(self, e: GatewayError) -> None:
        """Note a refused request: a prompt over the token limit truncates the run; anything
        else (malformed, unknown model, too large) fails it (the run ends as a recorded error)."""
        self.refusals.append(f"{e.status} {e.code or e.type}: {e.message}"[:300])
        if e.code == "context_length_exceeded":
            self.truncated = True
        elif self.failed is None:
            self.failed = f"gateway refused a request: {e.message}"[:500]


@dataclass
class _Req:
    run: RunState
    prompt: list[int]
    n: int
    max_tokens: int
    temperature: float
    top_p: float
    seed: int | None = None  # the request's (a session without a seed of its own)
    future: Future = field(default_factory=Future)
    waiter: asyncio.Future | None = None  # the server's await of `future` (`_wake`)


def _wake(reqs: list[_Req]) -> None:
    """Pass the outcomes of `reqs` (their `future`s are done) to the event loops awaiting them:
    one hand-off per loop for a whole batch (`asyncio.wrap_future` makes one per request)."""
    by_loop: dict[Any, list[_Req]] = {}
    for r in reqs:
        if r.waiter is not None and r.future.done():
            by_loop.setdefault(r.waiter.get_loop(), []).append(r)
    for loop, rs in by_loop.items():
        try:
            loop.call_soon_threadsafe(_settle, rs)
        except RuntimeError:  # the loop has closed: nobody awaits these
            pass


def _settle(reqs: list[_Req]) -> None:
    """On the awaiting loop: each request's waiter gets its future's result or exception."""
    for r in reqs:
        w = r.waiter
        if w is None or w.done():  # cancelled meanwhile
            continue
        e = r.future.exception()
        if e is not None:
            w.set_exception(e)
        else:
            w.set_result(r.future.result())


class Session:
    """The calls of one batch of agent runs (or of `agentrl serve`) and what they sample from.

    Args:
        engine: the policy's engine (`generate(prompt ids, SamplingParams)`), called only by
            the thread that drives the session.
        renderer: the policy's chat renderer; parser: its tool-call format
            (`agentrl_tools.parser.get_parser`).
        model_names: the model names requests may ask for (another: 404).
        max_episode_tokens: the most ids of a prompt and its completion.
        max_tokens: the most new ids per call (a request may ask fewer).
        sampling: `(temperature, top_p)` every call samples with (training: the learner's
            logprobs are of `logits / rollout.temperature`); None: the request's (default 1.0).
        seed: the sampler's seed of the session (None: the engine's state).
        batch_wait_s: how long a batch waits for the other live runs' requests.
        start_wait_s: how long a batch waits, instead, while some live runs have not sent a
            request yet (their agents are starting: a thread, an event loop, a client), so that
            runs started together make their first calls in one batch, and the next ones stay
            in step (measured: 16 runs of 4 calls then take 4 generate calls, not 5 to 7).
    """

    def __init__(self, engine: Any, renderer: ChatRenderer, parser: Any, *, model_names: list[str],
                 max_episode_tokens: int, max_tokens: int,
                 sampling: tuple[float, float] | None = None, seed: int | None = None,
                 batch_wait_s: float = 0.02, start_wait_s: float = 0.25,
                 max_request_bytes: int = MAX_REQUEST_BYTES):
        self.engine, self.renderer, self.parser = engine, renderer, parser
        self.model_names = list(model_names)
        self.max_episode_tokens, self.max_tokens = int(max_episode_tokens), int(max_tokens)
        self.sampling, self.seed, self.batch_wait_s = sampling, seed, batch_wait_s
        self.start_wait_s = start_wait_s
        self.max_request_bytes = max_request_bytes
        self.runs: list[RunState] = []
        self.in_flight = 0
        self.generate_calls = 0
        self.generate_s = 0.0  # wall seconds in engine.generate (this session's calls)
        self._queue: list[_Req] = []
        self._cond = threading.Condition()
        self._seen: dict[bytes, int] = {}

    # -- the server's side (its event loop thread) --------------------------------------------
    async def call(self, run: RunState, req: ChatRequest, size: int = 0) -> dict[str, Any]:
        """Answer one checked request of `run` (a body of `size` bytes): render its prompt,
        queue it, wait for the driving thread to sample it, record the replies. Returns the
        response body. Rendering and recording run on this event loop's thread for a body up to
        `INLINE_BYTES`, else on a worker thread.

        Raises:
            GatewayError: 400 for a prompt the template refuses or too long for the run.
        """
        loop = asyncio.get_running_loop()
        inline = size <= INLINE_BYTES
        prep = (self._prepare(run, req) if inline
                else await loop.run_in_executor(None, self._prepare, run, req))
        waiter = loop.create_future()
        self._submit(run, prep.prompt_ids, req, waiter)
        outs, version, gen_s = await waiter
        run.generate_s += gen_s
        if inline:
            return self._finish(run, req, prep, outs, version)
        return await loop.run_in_executor(None, self._finish, run, req, prep, outs, version)

    def _prepare(self, run: RunState, req: ChatRequest) -> Any:
        """The call's prompt (`RunRecord.prepare`); for `tool_choice` "required" or a named
        function, with the opening of a call (`forced_prefix`) appended as context ids, not
        sampled (loss mask 0), so that the sampler writes the rest of the call."""
        check_template_kwargs(req.template_kwargs, self.renderer.template_kwargs)
        record = run.record or RunRecord(self.renderer, self.max_episode_tokens - 1)
        try:
            prep = record.prepare(req.messages, req.tools)
        except PromptTooLong as e:
            raise GatewayError(400, str(e), code="context_length_exceeded", param="messages") from None
        except Exception as e:  # noqa: BLE001 - the chat template refused the messages
            raise bad(f"the chat template cannot render the messages: {type(e).__name__}: {e}",
                      "messages") from None
        if req.require_call:
            forced = forced_prefix(self.parser, req.call_name)
            ids = encode_continuation(self.renderer.tokenizer, forced)
            prep = replace(prep, context_ids=prep.context_ids + ids, prompt_ids=prep.prompt_ids + ids,
                           forced=forced)
            if len(prep.prompt_ids) > record.max_prompt_tokens:
                raise GatewayError(400, f"the prompt has {len(prep.prompt_ids)} tokens with the "
                                   f"prefilled tool call; the most this run allows is "
                                   f"{record.max_prompt_tokens} (rollout.max_episode_tokens - 1)",
                                   code="context_length_exceeded", param="messages")
        return prep

    def _submit(self, run: RunState, prompt: list[int], req: ChatRequest,
                waiter: asyncio.Future | None = None) -> _Req:
        """Queue a request for the driving thread (`waiter`: an event loop's future that gets
        its outcome, `_wake`). The driving thread is woken when its batch may be complete: the
        first request queued, a run's first request (it is no longer starting), or as many
        requests as it waits for (`expected`); a run ending wakes it too (`RunState.finish`)."""
        if self.sampling is not None:
            temperature, top_p = self.sampling
        else:
            temperature = 1.0 if req.temperature is None else req.temperature
            top_p = 1.0 if req.top_p is None else req.top_p
        room = self.max_episode_tokens - len(prompt)
        r = _Req(run, prompt, req.n, max(1, min(req.max_tokens or self.max_tokens, self.max_tokens, room)),
                 temperature, top_p, seed=req.seed if self.seed is None else None, waiter=waiter)
        with self._cond:
            self._queue.append(r)
            if len(self._queue) == 1 or run.calls == 0 or len(self._queue) >= self.expected():
                self._cond.notify_all()
        return r

    def _finish(self, run: RunState, req: ChatRequest, prep: Any, outs: list[Any],
                version: int) -> dict[str, Any]:
        tok = self.renderer.tokenizer
        messages, reasons, logprobs, n_out = [], [], [], 0
        for c in outs:
            ids, lps, reason = list(c.token_ids), list(c.logprobs), c.finish_reason
            text = self.renderer.decode_action(ids)
            cut = cut_at_stop(lambda x: tok.decode(x, skip_special_tokens=False), ids, text, req.stop)
            if cut is not None:
                k, text = cut
                ids, lps, reason = ids[:k], lps[:k], "stop"
            text = prep.forced + text  # the prefilled opening of a call (tool_choice), if any
            content, calls = (split_calls(self.parser, text) if req.tools and req.parse_calls
                              else (text, []))
            msg = reply_message(content, calls[:1] if req.one_call else calls, getattr(self.parser, "name", ""))
            if run.record is not None and run.live:
                run.record.record(prep, ids, lps, reason, text, msg, version)
            messages.append(msg)
            reasons.append(finish_reason(reason, msg))
            if req.logprobs:
                logprobs.append(logprobs_body(lambda x: tok.decode(x, skip_special_tokens=False), ids, lps))
            n_out += len(ids)
        run.calls += 1
        return completion_body(req.model, messages, reasons, len(prep.prompt_ids), n_out,
                               logprobs if req.logprobs else None)

    # -- the driving thread's side ---------------------------------------------------------------
    def expected(self) -> int:
        """Requests a batch waits for: the live runs whose agent has not returned (or the
        requests in the server)."""
        return max(self.in_flight, sum(r.live and not r.finished for r in self.runs))

    def starting(self) -> bool:
        """Whether a live run has not sent its first request yet (its agent is starting)."""
        return any(r.live and not r.finished and r.calls == 0 and r.pending == 0 and not r.refusals
                   for r in self.runs)

    def wake(self) -> None:
        """Wake the driving thread if it waits in `step` (a run ended: `drive` rechecks its
        `until`, a batch its `expected`)."""
        with self._cond:
            self._cond.notify_all()

    def step(self, timeout_s: float = 0.05) -> int:
        """Take the queued requests (waiting up to `timeout_s` for a first one, then up to
        `batch_wait_s` for `expected()` of them, `start_wait_s` while a run is `starting()`)
        and sample them. Returns how many were taken.

        Raises:
            What `engine.generate` raises (the waiting requests get it too).
        """
        with self._cond:
            if not self._queue:
                self._cond.wait(timeout_s)
            if not self._queue:
                return 0
            first = time.monotonic()
            while len(self._queue) < self.expected():
                wait = self.start_wait_s if self.starting() else self.batch_wait_s
                left = first + max(wait, self.batch_wait_s) - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            reqs, self._queue = self._queue, []
        try:
            self._execute([r for r in reqs if r.run.live] or [])
        finally:
            for r in reqs:
                if not r.run.live and not r.future.done():
                    r.future.set_exception(GatewayError(401, "this run has ended", code="invalid_api_key"))
            _wake(reqs)
        return len(reqs)

    def drive(self, until: Callable[[], bool], on_tick: Callable[[], None] | None = None) -> None:
        """Sample queued requests on this thread until `until()` is true; `on_tick()` after each
        round (a watchdog)."""
        while not until():
            self.step()
            if on_tick is not None:
                on_tick()

    def _execute(self, reqs: list[_Req]) -> None:
        groups: dict[tuple[float, float, int, int | None], list[_Req]] = {}
        for r in reqs:
            groups.setdefault((r.temperature, r.top_p, r.n, r.seed), []).append(r)
        for (temperature, top_p, n, seed), group in groups.items():
            prompts = [r.prompt for r in group]
            keys = [prompt_key(p) for p in prompts]
            offsets = [self._seen.get(k, 0) for k in keys]
            for k in keys:
                self._seen[k] = self._seen.get(k, 0) + n
            params = SamplingParams(temperature=temperature, top_p=top_p,
                                    max_tokens=max(r.max_tokens for r in group),
                                    stop_token_ids=list(self.renderer.stop_ids), n=n,
                                    seed=self.seed if self.seed is not None else seed,
                                    seed_offsets=offsets if self.seed is not None else None)
            t0 = time.perf_counter()
            try:
                outs = self.engine.generate(prompts, params)
            except BaseException as e:
                for r in group:
                    r.future.set_exception(GatewayError(500, f"the engine failed: {e}", type="server_error"))
                raise
            call_s = time.perf_counter() - t0
            self.generate_s += call_s
            gen_s = call_s / len(group)
            self.generate_calls += 1
            version = int(getattr(self.engine, "policy_version", 0))
            for i, r in enumerate(group):
                comps = []
                for c in outs[i * n:(i + 1) * n]:
                    if len(c.token_ids) > r.max_tokens:  # a row with a smaller cap than the batch's
                        c = type(c)(c.token_ids[:r.max_tokens], c.logprobs[:r.max_tokens], "length")
                    comps.append(c)
                r.future.set_result((comps, version, gen_s))

    def fail_waiting(self) -> None:
        """Refuse the requests still queued (the session is closing)."""
        with self._cond:
            reqs, self._queue = self._queue, []
        for r in reqs:
            if not r.future.done():
                r.future.set_exception(GatewayError(401, "this run has ended", code="invalid_api_key"))
        _wake(reqs)


class Gateway:
    """The HTTP server on `127.0.0.1:port` (0: a free port), started at construction.
    `serving`: the gateway of `agentrl serve` (a refused key is then spoken of as the key it was
    started with, `--api-key`, not a run's token).

    Raises:
        OSError: the port is taken (naming `127.0.0.1:port` and what to do).
        RuntimeError: the server did not start within 30 s.
    """

    def __init__(self, port: int = 0, *, serving: bool = False):
        self.serving = serving
        self._runs: dict[str, RunState] = {}
        self._open: RunState | None = None  # `agentrl serve` without --api-key: any key, or none
        self._lock = threading.Lock()
        # IPPROTO_TCP named, so that asyncio sets TCP_NODELAY on the accepted connections (it
        # does only for sockets whose proto says TCP): without it Nagle holds a response's
        # body behind its headers for the client's delayed ACK, 40 ms a call on a kept-alive
        # connection; set on the listening socket too (inherited on accept)
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            sock.bind((HOST, port))
        except OSError as e:
            sock.close()
            if e.errno != errno.EADDRINUSE:
                raise
            taken = OSError(f"cannot listen on {HOST}:{port}: the port is in use (another agentrl "
                            "serve, or another program): stop it, or choose another port (--port; "
                            "0 takes a free one)")
            taken.errno = e.errno  # str(taken) is the sentence alone (no "[Errno 98]")
            raise taken from None
        self.port = sock.getsockname()[1]
        self._app = Starlette(routes=[Route("/v1/chat/completions", self._chat, methods=["POST"]),
                                      Route("/v1/models", self._models, methods=["GET"])])
        # proxy_headers off: nothing reads the client's address (and only loopback connects)
        config = uvicorn.Config(self._asgi, interface="asgi3", log_level="warning", access_log=False, lifespan="off",
                                proxy_headers=False)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]},
                                        name="agentrl-gateway", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError(f"the gateway did not start on {HOST}:{self.port}")
            time.sleep(0.005)

    @property
    def url(self) -> str:
        """The OpenAI base URL: `http://127.0.0.1:PORT/v1`."""
        return f"http://{HOST}:{self.port}/v1"

    def open_run(self, session: Session, *, record: bool = True, token: str | None = None) -> RunState:
        """A new run of `session` with a fresh token (or `token`), live until `close_run`."""
        run = RunState(token or secrets.token_urlsafe(24), session,
                       RunRecord(session.renderer, session.max_episode_tokens - 1) if record else None)
        with self._lock:
            self._runs[run.token] = run
            session.runs.append(run)
        return run

    def open_to_all(self, session: Session) -> RunState:
        """`agentrl serve` without an API key: requests with any key or none go to one
        unrecorded run of `session`."""
        self._open = self.open_run(session, record=False, token=f"open-{secrets.token_hex(8)}")
        return self._open

    def close_run(self, run: RunState) -> None:
        """End `run`: its token is refused from now on."""
        run.live = False
        with self._lock:
            self._runs.pop(run.token, None)

    def close(self) -> None:
        """Stop the server (waits up to 5 s)."""
        self._server.should_exit = True
        self._thread.join(timeout=5)

    # -- handlers ---------------------------------------------------------------------------------
    async def _asgi(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        """The ASGI app: `POST /v1/chat/completions` answered directly (`_chat_asgi`: a call
        is the hot path, and Starlette's routing, middleware and request and response objects
        cost about as much CPU as the call's own work); anything else through Starlette
        (`GET /v1/models`, 404, 405, a trailing slash)."""
        if scope["type"] == "http" and scope["method"] == "POST" and scope["path"] == "/v1/chat/completions":
            await self._chat_asgi(scope, receive, send)
        else:
            await self._app(scope, receive, send)

    async def _chat_asgi(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        """`_chat` on the raw ASGI messages: the same checks, answers and JSON (Starlette's
        `JSONResponse` encoding; a streamed answer still goes through its `StreamingResponse`)."""
        auth = ""
        for k, v in scope["headers"]:
            if k == b"authorization":
                auth = v.decode("latin-1")
                break
        status, body, stream = await self._answer(auth, receive_body(receive))
        if stream is not None:
            await StreamingResponse(iter(stream), media_type="text/event-stream")(scope, receive, send)
            return
        data = _JSON.encode(body).encode("utf-8")
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-length", str(len(data)).encode("latin-1")),
                                (b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": data})

    def _auth(self, header: str) -> RunState:
        token = header[7:].strip() if header.lower().startswith("bearer ") else ""
        with self._lock:
            run = self._runs.get(token) if token else None
        if run is not None and run.live:
            return run
        if self._open is not None:
            return self._open
        if self.serving:
            key = "the key this server was started with (agentrl serve --api-key KEY)"
            if not token:
                raise GatewayError(401, f"missing API key: pass {key} as the API key "
                                   "(Authorization: Bearer KEY)", code="invalid_api_key")
            raise GatewayError(401, f"invalid API key: not {key}", code="invalid_api_key")
        if not token:
            raise GatewayError(401, "missing API key: pass the run's token as the API key",
                               code="invalid_api_key")
        raise GatewayError(401, "invalid API key: not the token of a live run", code="invalid_api_key")

    async def _answer(self, auth: str, chunks: AsyncIterator[bytes]
                      ) -> tuple[int, dict[str, Any], list[str] | None]:
        """A chat-completions request with Authorization header `auth` and body `chunks`:
        `(HTTP status, response body, its stream events or None)` (an error: OpenAI's error
        body, not streamed)."""
        run = None
        try:
            run = self._auth(auth)
            s = run.session
            run.pending += 1
            s.in_flight += 1
            try:
                obj, size = await read_body(chunks, s.max_request_bytes)
                req = parse_request(obj)
                if req.model not in s.model_names:
                    raise GatewayError(404, f"model {req.model!r} not found; this gateway serves "
                                       f"{s.model_names}", code="model_not_found", param="model")
                body = await s.call(run, req, size)
            finally:
                run.pending -= 1
                s.in_flight -= 1
                run.last_active = time.monotonic()
        except GatewayError as e:
            if run is not None and e.status != 401:
                run.refused(e)
            return e.status, error_body(e), None
        return 200, body, stream_chunks(body, req.stream_usage) if req.stream else None

    async def _chat(self, request: Request) -> Response:
        """`POST /v1/chat/completions` through Starlette (the ASGI app answers it directly,
        `_chat_asgi`; this route is its twin for a Starlette app)."""
        status, body, stream = await self._answer(request.headers.get("authorization", ""), request.stream())
        if stream is not None:
            return StreamingResponse(iter(stream), media_type="text/event-stream")
        return JSONResponse(body, status_code=status)

    async def _models(self, request: Request) -> Response:
        try:
            run = self._auth(request.headers.get("authorization", ""))
        except GatewayError as e:
            return JSONResponse(error_body(e), status_code=e.status)
        return JSONResponse({"object": "list", "data": [
            {"id": m, "object": "model", "created": 0, "owned_by": "agentrl"}
            for m in run.session.model_names]})


_JSON = json.JSONEncoder(ensure_ascii=False, allow_nan=False, indent=None, separators=(",", ":"))
"""Starlette's `JSONResponse` encoding."""


_shared: Gateway | None = None
_shared_lock = threading.Lock()


def shared_gateway() -> Gateway:
    """The process's gateway on a free port, started at the first call (every batch of agent
    runs in this process shares it; their sessions keep them apart)."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = Gateway()
        return _shared
