"""An OpenAI-compatible chat-completions stub on 127.0.0.1, for tests and offline demos.

It is never a model: a *script* maps each request to an assistant message. The default script
solves the bundled Arithmetic example the way an agent should (call ``calculator`` on the
expression, then ``submit`` its result), so a rollout through ``OpenAIPolicy`` shows real
rewards with no model and no network. Standard library only (a threaded ``http.server``).

It speaks ``POST /v1/chat/completions`` (JSON, or SSE ``chat.completion.chunk`` events with
``"stream": true``) and ``GET /v1/models``; it records every request body and the most requests
it saw in flight at once, and injects faults on demand (``fail_next`` 500s, ``rate_limit_next``
429s with ``Retry-After``, a fixed ``delay``).

    python -m openenv_gym.testing.openai_stub --port 8000
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import re
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, cast

__all__ = ["OpenAIStub", "arithmetic_solver", "sometimes_wrong"]

_ids = itertools.count(1)
_COMPUTE = re.compile(r"Compute (.+?)\. ")


def _text(content: Any) -> str:
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return content or ""


def _tool_call(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"id": f"call_{next(_ids)}", "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments)}}


def render_turn(message: dict[str, Any]) -> str:
    """One message as the stub's chat template writes it."""
    body = _text(message.get("content"))
    if message.get("tool_calls"):
        body += json.dumps([c["function"] for c in message["tool_calls"]], sort_keys=True)
    return f"<|{message.get('role', 'assistant')}|>{body}<|end|>"


def render_prompt(messages: list[dict[str, Any]]) -> str:
    """The prompt the stub's "model" sees: every message, then the assistant's turn marker."""
    return "".join(render_turn(m) for m in messages) + "<|assistant|>"


def arithmetic_solver(request: dict[str, Any]) -> dict[str, Any]:
    """Solve ``openenv/Arithmetic-v0``: calculator on the expression, then submit the result."""
    names = {t.get("function", {}).get("name") for t in request.get("tools") or ()}
    messages = request.get("messages") or [{}]
    last = messages[-1]
    if {"calculator", "submit"} <= names:
        if last.get("role") == "tool" and last.get("name") == "calculator":
            return {"role": "assistant", "content": None, "tool_calls": [_tool_call("submit", {"answer": _text(last["content"])})]}
        match = _COMPUTE.search(_text(last.get("content")))
        if last.get("role") == "user" and match:
            return {"role": "assistant", "content": None,
                    "tool_calls": [_tool_call("calculator", {"expression": match.group(1)})]}
    return {"role": "assistant", "content": "I have nothing to add."}



def sometimes_wrong(miss: float = 0.5, seed: int = 0) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """A stub script that solves Arithmetic but submits ``answer + 1`` with probability ``miss``
    (groups then get mixed rewards). The stub answers from several threads, hence the lock around
    the shared random stream."""
    rng, lock = random.Random(seed), threading.Lock()

    def script(request: dict[str, Any]) -> dict[str, Any]:
        message = arithmetic_solver(request)
        call = (message.get("tool_calls") or [{}])[0].get("function", {})
        if call.get("name") == "submit":
            with lock:
                wrong = rng.random() < miss
            if wrong:
                answer = json.loads(call["arguments"])["answer"]
                call["arguments"] = json.dumps({"answer": str(int(answer) + 1)})
        return message

    return script

class OpenAIStub:
    """The stub server. Use as a context manager, or ``start()``/``stop()``.

    Args:
        script: maps a request body to the assistant message to answer (default: the solver).
        host, port: where to listen (port 0: a free port; see ``url``).
    """

    def __init__(self, script: Callable[[dict[str, Any]], dict[str, Any]] | None = None, *,
                 host: str = "127.0.0.1", port: int = 0, model: str = "stub"):
        self.script = script or arithmetic_solver
        self.model = model
        self.requests: list[dict[str, Any]] = []
        self.fail_next = 0
        self.rate_limit_next = 0
        self.delay = 0.0
        self.max_in_flight = 0
        self._in_flight = 0
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer((host, port), self._handler())
        self._server.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = cast(tuple[str, int], self._server.server_address[:2])  # an AF_INET server's address
        return f"http://{host}:{port}/v1"

    def start(self) -> OpenAIStub:
        self._thread = threading.Thread(target=self._server.serve_forever, name="openai-stub", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(5)

    def __enter__(self) -> OpenAIStub:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def _fault(self) -> tuple[int, dict[str, str], dict[str, Any]] | None:
        with self._lock:
            if self.fail_next > 0:
                self.fail_next -= 1
                return 500, {}, {"error": {"message": "injected failure", "type": "server_error"}}
            if self.rate_limit_next > 0:
                self.rate_limit_next -= 1
                return 429, {"Retry-After": "0.1"}, {"error": {"message": "injected rate limit", "type": "rate_limit"}}
        return None

    def _completion(self, body: dict[str, Any]) -> dict[str, Any]:
        message = self.script(body)
        choice: dict[str, Any] = {"index": 0, "message": message,
                                  "finish_reason": "tool_calls" if message.get("tool_calls") else "stop"}
        out: dict[str, Any] = {
            "id": f"chatcmpl-{next(_ids)}", "object": "chat.completion", "created": int(time.time()),
            "model": body.get("model", self.model), "choices": [choice],
            "usage": {"prompt_tokens": sum(len(_text(m.get("content"))) for m in body.get("messages", [])) // 4,
                      "completion_tokens": 8, "total_tokens": 0},
        }
        # What vLLM returns for training (``return_token_ids``, ``logprobs``), from a byte-level
        # "tokenizer": the ids are the UTF-8 bytes of a plain chat rendering, so a turn's prompt
        # ids start with the previous turn's prompt and completion ids, as a real template's do.
        completion = list(render_turn(message).removeprefix("<|assistant|>").encode())
        if body.get("return_token_ids"):
            out["prompt_token_ids"] = list(render_prompt(body.get("messages", [])).encode())
            choice["token_ids"] = completion
        if body.get("logprobs"):
            choice["logprobs"] = {"content": [{"token": f"token_id:{t}", "logprob": -0.25, "bytes": [t],
                                               "top_logprobs": []} for t in completion]}
        return out

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        stub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:  # keep test output clean
                pass

            def _send(self, code: int, payload: Any, headers: dict[str, str] | None = None) -> None:
                data = json.dumps(payload).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                if self.path.rstrip("/") == "/v1/models":
                    self._send(200, {"object": "list", "data": [{"id": stub.model, "object": "model"}]})
                else:
                    self._send(404, {"error": {"message": f"no route {self.path}"}})

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                try:
                    body = json.loads(self.rfile.read(length) or b"{}")
                except json.JSONDecodeError:
                    self._send(400, {"error": {"message": "the body is not JSON"}})
                    return
                if self.path.rstrip("/") != "/v1/chat/completions":
                    self._send(404, {"error": {"message": f"no route {self.path}"}})
                    return
                with stub._lock:
                    stub.requests.append(body)
                    stub._in_flight += 1
                    stub.max_in_flight = max(stub.max_in_flight, stub._in_flight)
                try:
                    if stub.delay:
                        time.sleep(stub.delay)
                    fault = stub._fault()
                    if fault is not None:
                        self._send(fault[0], fault[2], fault[1])
                    elif body.get("stream"):
                        self._stream(stub._completion(body))
                    else:
                        self._send(200, stub._completion(body))
                finally:
                    with stub._lock:
                        stub._in_flight -= 1

            def _stream(self, completion: dict[str, Any]) -> None:
                message = completion["choices"][0]["message"]
                base = {k: completion[k] for k in ("id", "created", "model")}
                deltas: list[dict[str, Any]] = [{"role": "assistant", "content": ""}]
                if message.get("content"):
                    deltas.append({"content": message["content"]})
                for n, call in enumerate(message.get("tool_calls") or ()):
                    deltas.append({"tool_calls": [{"index": n, "id": call["id"], "type": "function",
                                                   "function": {"name": call["function"]["name"], "arguments": ""}}]})
                    deltas.append({"tool_calls": [{"index": n, "function": {"arguments": call["function"]["arguments"]}}]})
                events = [{**base, "object": "chat.completion.chunk",
                           "choices": [{"index": 0, "delta": d, "finish_reason": None}]} for d in deltas]
                events.append({**base, "object": "chat.completion.chunk",
                               "choices": [{"index": 0, "delta": {}, "finish_reason": completion["choices"][0]["finish_reason"]}]})
                payload = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
                data = payload.encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        return Handler


def main() -> None:
    parser = argparse.ArgumentParser(description="An OpenAI-compatible stub that solves openenv/Arithmetic-v0.")
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args()
    with OpenAIStub(port=args.port) as stub:
        print(f"serving {stub.url} (Ctrl-C to stop)", flush=True)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":
    main()
