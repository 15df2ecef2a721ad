"""`agentrl serve-judge`: serve a local transformers causal LM through an OpenAI-compatible
chat-completions endpoint on loopback, so RLAIF runs offline (the judge for `JudgeClient`).

Endpoints:
- `POST /v1/chat/completions` with `{"messages": [...], "max_tokens"?: int (256),
  "max_completion_tokens"?: int, "temperature"?: float (0 = greedy), "top_p"?: float,
  "n"?: int (1..8), "stop"?: str | [str], "seed"?: int, "model"?: ignored}`; the prompt is the
  tokenizer's chat template with the generation prompt; the reply has OpenAI's shape (`id`,
  `object: "chat.completion"`, `created`, `model`, `choices[i].message.{role,content}`,
  `choices[i].finish_reason` "stop" | "length", `usage`).
- `GET /v1/models` lists the one model.
A malformed request gets HTTP 400 and `{"error": {"message", "type"}}`; one generation runs at a
time (a lock), requests queue on server threads.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from agentrl.models.tiny import chat_stop_ids, generation_eos_ids, load_model, render_text


class _BadRequest(ValueError):
    pass


class ChatModel:
    """A local causal LM answering chat requests (one generation at a time).

    Args:
        model_path: local Hugging Face model directory with a chat template.
        name: model id reported by the server (default: the directory name).
        max_tokens_cap: the most new tokens one request may ask for.

    Raises:
        FileNotFoundError: `model_path` is not a directory.
    """

    def __init__(self, model_path: str | Path, *, name: str | None = None, max_tokens_cap: int = 2048):
        self.model, self.tokenizer = load_model(model_path)
        self.name = name or Path(model_path).resolve().name
        # the end-of-turn tokens, then the model's own eos ids (Llama-3.1's <|eom_id|>), as vLLM
        self.stop_ids = list(dict.fromkeys(chat_stop_ids(self.tokenizer) + generation_eos_ids(model_path)))
        self.max_tokens_cap = int(max_tokens_cap)
        self._lock = threading.Lock()

    def complete(self, body: dict[str, Any]) -> dict[str, Any]:
        """Answer one chat-completions request body (see the module docstring).

        Raises:
            _BadRequest: malformed body (the server answers HTTP 400).
        """
        import torch
        from transformers import GenerationConfig

        messages = body.get("messages")
        if not isinstance(messages, list) or not messages or not all(
                isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content", ""), str)
                for m in messages):
            raise _BadRequest("'messages' must be a non-empty list of {role: str, content: str}")
        max_tokens = body.get("max_completion_tokens", body.get("max_tokens", 256))
        temperature = body.get("temperature", 0.0)
        top_p = body.get("top_p", 1.0)
        n = body.get("n", 1)
        stop = body.get("stop") or []
        stop = [stop] if isinstance(stop, str) else stop
        if not isinstance(max_tokens, int) or not 1 <= max_tokens <= self.max_tokens_cap:
            raise _BadRequest(f"'max_tokens' must be an int in [1, {self.max_tokens_cap}]")
        if not isinstance(temperature, (int, float)) or temperature < 0:
            raise _BadRequest("'temperature' must be a number >= 0")
        if not isinstance(top_p, (int, float)) or not 0 < top_p <= 1:
            raise _BadRequest("'top_p' must be in (0, 1]")
        if not isinstance(n, int) or not 1 <= n <= 8:
            raise _BadRequest("'n' must be an int in [1, 8]")
        if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
            raise _BadRequest("'stop' must be a string or a list of non-empty strings")


        try:
            text = render_text(self.tokenizer, messages, add_generation_prompt=True)
        except Exception as e:  # noqa: BLE001 - a template error is the request's fault
            raise _BadRequest(f"chat template failed: {e}") from None
        enc = self.tokenizer(text, return_tensors="pt", add_special_tokens=False)
        sample = float(temperature) > 0
        gen = GenerationConfig(max_new_tokens=max_tokens, do_sample=sample,
                               temperature=float(temperature) if sample else None,
                               top_p=float(top_p) if sample else None, top_k=None,
                               eos_token_id=self.stop_ids, pad_token_id=self.tokenizer.pad_token_id)
        prompt_len = int(enc["input_ids"].shape[1])
        choices, completion_tokens = [], 0
        with self._lock, torch.no_grad():
            if body.get("seed") is not None:
                torch.manual_seed(int(body["seed"]))
            for i in range(n):
                out = self.model.generate(**enc, generation_config=gen)  # type: ignore[operator]
                new = [int(t) for t in out[0, prompt_len:]]
                finish = "length"
                if new and new[-1] in self.stop_ids:
                    new, finish = new[:-1], "stop"
                completion_tokens += len(new) + (finish == "stop")
                content = self.tokenizer.decode(new, skip_special_tokens=True)
                for s in stop:
                    if s in content:
                        content, finish = content[: content.index(s)], "stop"
                choices.append({"index": i, "message": {"role": "assistant", "content": content},
                                "finish_reason": finish, "logprobs": None})
        return {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
                "model": self.name, "choices": choices,
                "usage": {"prompt_tokens": prompt_len, "completion_tokens": completion_tokens,
                          "total_tokens": prompt_len + completion_tokens}}


def _handler(chat: ChatModel) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _send(self, code: int, payload: dict[str, Any]) -> None:
            data = json.dumps(payload).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _error(self, code: int, message: str, kind: str) -> None:
            self._send(code, {"error": {"message": message, "type": kind, "code": code}})

        def do_GET(self) -> None:  # noqa: N802 - http.server API
            if self.path.rstrip("/") in ("/v1/models", "/models"):
                self._send(200, {"object": "list", "data": [
                    {"id": chat.name, "object": "model", "created": 0, "owned_by": "agentrl"}]})
            elif self.path.rstrip("/") in ("", "/health"):
                self._send(200, {"status": "ok"})
            else:
                self._error(404, f"no route {self.path}", "not_found")

        def do_POST(self) -> None:  # noqa: N802 - http.server API
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            if self.path.rstrip("/") not in ("/v1/chat/completions", "/chat/completions"):
                self._error(404, f"no route {self.path}", "not_found")
                return
            try:
                body = json.loads(raw or b"null")
                if not isinstance(body, dict):
                    raise _BadRequest("the request body must be a JSON object")
                self._send(200, chat.complete(body))
            except (json.JSONDecodeError, _BadRequest) as e:
                self._error(400, str(e), "invalid_request_error")
            except Exception as e:  # noqa: BLE001 - the server stays up; the client sees a 500
                self._error(500, f"{type(e).__name__}: {e}", "server_error")

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet server
            return

    return Handler


def serve_judge(model_path: str | Path, host: str = "127.0.0.1", port: int = 0, *,
                name: str | None = None) -> tuple[ThreadingHTTPServer, threading.Thread, str]:
    """Load `model_path` and serve it in a background (daemon) thread.

    Args:
        model_path: local causal-LM directory with a chat template.
        host: interface to bind (loopback by default).
        port: TCP port; 0 picks a free one.
        name: model id reported by the server.

    Returns:
        `(server, thread, url)` with `url` = `http://host:port/v1` (give it to `JudgeClient`).
        Stop with `server.shutdown(); server.server_close()`.
    """
    chat = ChatModel(model_path, name=name)
    server = ThreadingHTTPServer((host, port), _handler(chat))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, name="serve-judge", daemon=True)
    thread.start()
    return server, thread, f"http://{host}:{server.server_address[1]}/v1"


def main(model: str, port: int = 8000, host: str = "127.0.0.1", threads: int | None = None) -> None:
    """Entry point of `agentrl serve-judge --model PATH --port N`: serve until interrupted.

    Args:
        threads: torch CPU threads (None: torch's default).
    """
    import torch

    if threads:
        torch.set_num_threads(int(threads))
    server, thread, url = serve_judge(model, host=host, port=port)
    print(f"serving judge {model} at {url} (POST /v1/chat/completions, GET /v1/models); Ctrl-C stops",
          flush=True)
    try:
        while thread.is_alive():
            thread.join(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        server.shutdown()
        server.server_close()
