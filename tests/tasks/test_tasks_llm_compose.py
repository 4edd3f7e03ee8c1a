"""The LLM composer against a tiny local OpenAI-compatible HTTP server (a test double for the model)."""

import http.server
import json
import threading

import pytest

from tasks.compose import ComposeError
from tasks.llm_compose import LLMComposer, LLMComposerConfig, extract_code
from tasks.validate import check_runtime


class _Server:
    def __init__(self, replies):
        self.replies = list(replies)
        self.requests = []
        outer = self

        class H(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests.append((self.path, dict(self.headers), body))
                status, payload = outer.replies.pop(0)
                data = json.dumps(payload).encode() if not isinstance(payload, bytes) else payload
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *a):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def _reply(text):
    return 200, {"choices": [{"message": {"role": "assistant", "content": text}}]}


@pytest.fixture
def server():
    servers = []

    def make(replies):
        s = _Server(replies)
        servers.append(s)
        return s

    yield make
    for s in servers:
        s.close()


def test_llm_composer_builds_a_task_from_the_reply(server, good_source):
    s = server([_reply("Here it is:\n```python\n" + good_source + "```\nDone.")])
    comp = LLMComposer(LLMComposerConfig(base_url=s.url, model="tiny", api_key="k123"))
    t = comp.compose(5, category="matmul", depth=3)
    path, headers, body = s.requests[0]
    assert path == "/v1/chat/completions" and headers["Authorization"] == "Bearer k123"
    assert body["model"] == "tiny"
    prompt = body["messages"][-1]["content"]
    assert all(op in prompt for op in t.operators) and len(t.operators) == 3
    assert t.category == "matmul" and t.provenance["composer"] == "llm"
    assert t.shape_params == {"batch_size": 4, "dim": 32}
    assert check_runtime(t.reference, t.id).output_shapes == [[4, 32]]


def test_llm_composer_errors(server, good_source):
    s = server([
        _reply("I cannot do that."),
        _reply("```python\nimport torch\nclass Model: pass\n```"),
        (500, {"error": "overloaded"}),
        (200, b"not json"),
        (200, {"choices": []}),
    ])
    comp = LLMComposer(LLMComposerConfig(base_url=s.url, model="tiny"))
    for match in ("no python code block", "no_get_inputs", "HTTP 500", "not JSON", "no choices"):
        with pytest.raises(ComposeError, match=match):
            comp.compose(1)
    dead = LLMComposer(LLMComposerConfig(base_url="http://127.0.0.1:9/v1", model="m", timeout_s=2))
    with pytest.raises(ComposeError, match="request failed"):
        dead.compose(0)
    with pytest.raises(ValueError, match="base_url"):
        LLMComposerConfig(base_url="localhost:8000", model="m")


def test_extract_code():
    assert extract_code("```py\nx = 1\n```") == "x = 1\n"
    assert extract_code("no code") is None
