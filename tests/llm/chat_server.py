"""A small chat-completions server on 127.0.0.1 for tests: scripted failures, counted requests."""
from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class ChatServer:
    def __init__(self, failures: list[tuple[int, dict]] | None = None, fail_after: int | None = None,
                 delays: list[float] | None = None):
        self.failures = list(failures or [])  # (status, headers) answered to the first requests
        self.delays = list(delays or [])  # seconds the first requests wait before their answer
        self.fail_after = fail_after  # answer 400 to every request after this many successes
        self.requests: list[dict] = []
        self.headers: list[dict] = []
        self.successes = 0
        self.lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with server.lock:
                    server.requests.append(body)
                    server.headers.append({k.lower(): v for k, v in self.headers.items()})
                    failure = server.failures.pop(0) if server.failures else None
                    if failure is None and server.fail_after is not None and server.successes >= server.fail_after:
                        failure = (400, {})
                    if failure is None:
                        server.successes += 1
                    delay = server.delays.pop(0) if server.delays else 0.0
                if delay:
                    time.sleep(delay)
                if failure is not None:
                    status, headers = failure
                    payload = json.dumps({"error": {"message": f"scripted {status}", "type": "test"}}).encode()
                    self.send_response(status)
                    for key, value in headers.items():
                        self.send_header(key, value)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                    return
                user = body["messages"][-1]["content"]
                answer = "Rewritten: " + user.splitlines()[-2][:40]  # deterministic, depends on the query
                payload = json.dumps({
                    "id": "x", "object": "chat.completion", "created": 0, "model": body["model"],
                    "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": answer}}],
                    "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
                }).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> "ChatServer":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
