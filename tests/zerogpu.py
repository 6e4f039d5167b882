"""A loopback stand-in for ZeroGPU's device scheduler (the API that SPACES_ZERO_DEVICE_API_URL names):
`/startup-report`, `/allow` and `/release` answer 200; `/schedule` grants GPU 0 at once, saying it is
idle after the first grant so spaces reuses its warm workers. It records every call it answers."""
from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse


class Scheduler:
    def __init__(self):
        self.calls: list[tuple[str, dict]] = []
        self._lock = threading.Lock()
        scheduler = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                url = urlparse(self.path)
                with scheduler._lock:
                    first = not any(path == "/schedule" for path, _ in scheduler.calls)
                    scheduler.calls.append((url.path, {k: v[0] for k, v in parse_qs(url.query).items()}))
                if url.path == "/schedule":
                    body = json.dumps({"idle": not first, "nvidiaIndex": 0, "nvidiaUUID": "GPU-stand-in",
                                       "allowToken": f"token-{len(scheduler.calls)}"}).encode()
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                elif url.path in ("/startup-report", "/allow", "/release"):
                    self.send_response(200)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                else:
                    self.send_response(404)
                    self.send_header("Content-Length", "0")
                    self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def count(self, path: str) -> int:
        with self._lock:
            return sum(p == path for p, _ in self.calls)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
