"""A misbehaving webhook receiver for the fault suite: per request it
answers 200, answers 200 too late (after the sender's timeout), answers 500,
or resets the connection, following a seeded random mix or a fixed mode.
Every request whose body it read is kept with what it did, so a test can
count what a chat group would have shown (200 and late 200) per event."""
import json
import random
import socket
import struct
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Receiver:
    def __init__(self, mix=None, seed=14, late_s=2.0):
        # mode -> weight; "ok" alone is a well-behaved receiver
        self.mix = mix or {"ok": 1}
        self.rng = random.Random(seed)
        self.late_s = late_s
        self.lock = threading.Lock()
        self.requests = []

    def pick(self):
        with self.lock:
            modes = list(self.mix)
            return self.rng.choices(modes, weights=[self.mix[m] for m in modes])[0]

    def shown(self):
        """Events a chat group would show: bodies answered 200 (in time or late)."""
        out = []
        with self.lock:
            reqs = list(self.requests)
        for mode, body in reqs:
            if mode not in ("ok", "late"):
                continue
            if isinstance(body, dict) and isinstance(body.get("events"), list):
                out.extend(body["events"])
            elif isinstance(body, dict):
                out.append(body)
        return out


def make_handler(rx):
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            try:
                body = json.loads(raw.decode("utf-8", "replace"))
            except ValueError:
                body = None
            mode = rx.pick()
            with rx.lock:
                rx.requests.append((mode, body))
            if mode == "reset":
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                self.connection.close()
                self.close_connection = True
                return
            if mode == "late":
                time.sleep(rx.late_s)
            status = 500 if mode == "500" else 200
            data = b"{}" if status == 200 else b"internal error"
            try:
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            except OSError:
                pass

        def log_message(self, *args):
            pass

    return Handler


def serve(**kwargs):
    """Starts a receiver in a thread; returns (server, receiver, url)."""
    rx = Receiver(**kwargs)
    server = ThreadingHTTPServer(("127.0.0.1", 0), make_handler(rx))
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, rx, "http://127.0.0.1:%d" % server.server_address[1]
