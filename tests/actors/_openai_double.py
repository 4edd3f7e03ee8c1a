"""A small local HTTP server that speaks the OpenAI chat-completions API (a test double of an external model
endpoint). Replies are scripted by the task name in the first user message and the number of assistant
messages so far; every request body is recorded."""

from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class ChatCompletionsDouble:
    """scripts: {task name: [reply, ...]}; a reply is a string (assistant text) or a dict: {"tool_calls":
    [(name, arguments), ...], "content": str} for structured function calls, {"status": 500} for an error
    (each such entry is used once, then the script moves on), or {"status": 400, "always": True}."""

    def __init__(self, scripts: dict):
        self.scripts = scripts
        self.requests: list[dict] = []
        self.errors_sent: dict[str, int] = {}
        self._lock = threading.Lock()
        double = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                status, reply = double.answer(self.path, body, self.headers.get("Authorization"))
                data = json.dumps(reply).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()

    def answer(self, path: str, body: dict, auth: str | None):
        with self._lock:
            self.requests.append({"path": path, "body": body, "auth": auth})
        if path != "/v1/chat/completions":
            return 404, {"error": {"message": f"no route {path}"}}
        user = next(m["content"] for m in body["messages"] if m["role"] == "user")
        name = re.match(r"Task \S+: (.+?) \(solution format", user).group(1)
        turn = sum(m["role"] == "assistant" for m in body["messages"])
        script = self.scripts[name]
        with self._lock:
            errors = self.errors_sent.get(name, 0)
            step = script[min(turn + errors, len(script) - 1)]
            if isinstance(step, dict) and "status" in step:
                if not step.get("always"):
                    self.errors_sent[name] = errors + 1
                return step["status"], {"error": {"message": "scripted failure", "code": step["status"]}}
        message: dict = {"role": "assistant", "content": step if isinstance(step, str) else step.get("content")}
        if isinstance(step, dict) and step.get("tool_calls"):
            message["tool_calls"] = [{"id": f"call_{i}", "type": "function",
                                      "function": {"name": n, "arguments": json.dumps(a)}}
                                     for i, (n, a) in enumerate(step["tool_calls"])]
        return 200, {"id": "cmpl-test", "object": "chat.completion", "model": body["model"],
                     "choices": [{"index": 0, "message": message,
                                  "finish_reason": "tool_calls" if message.get("tool_calls") else "stop"}],
                     "usage": {"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120}}
