"""A webhook receiver on a free 127.0.0.1 port, for the events-out tests: keeps each verified event, in order."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from flows.webhooks import SIGNATURE_HEADER, verify_signature


class HookReceiver:
    """Keeps each body signed with `secret` (204); answers 401 to another signature and 503 while `down`, or once
    it has taken `down_after` events (an outage part-way through a delivery)."""

    def __init__(self, secret: str, down_after: int | None = None) -> None:
        self.got: list[dict] = []
        self.refused = 0
        self.down = False
        self.down_after = down_after
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if receiver.down or (receiver.down_after is not None and len(receiver.got) >= receiver.down_after):
                    receiver.refused += 1
                    self.send_response(503)
                elif not verify_signature(secret.encode(), self.headers[SIGNATURE_HEADER], body):
                    self.send_response(401)
                else:
                    event = json.loads(body)
                    assert self.headers["Unmask-Event-Id"] == event["id"]
                    receiver.got.append(event)
                    self.send_response(204)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/unmask"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
