#!/usr/bin/env python3
"""A local webhook receiver for gpuguard's demo and tests (127.0.0.1 only).

It answers like each chat platform does, by path:
  /dingtalk...  {"errcode":0,"errmsg":"ok"}; with --secret, checks the
                timestamp/sign query (310000 "sign not match" when wrong)
  /feishu...    {"code":0,"msg":"success",...}; with --secret, checks the
                timestamp/sign body fields (19021 when wrong)
  /wecom...     {"errcode":0,"errmsg":"ok"}
  /slack...     plain "ok"
  /api/v2/alerts  Alertmanager: 200, empty body
  anything else 200 {} (generic webhook)
Every request is appended to --record as one JSON line: method, path, query,
body (parsed JSON when it is JSON). --script FILE gives canned replies
(a JSON list of {"status", "body", "headers", "delay"}) used first, in order.
Misbehaving receivers for the fault tests: --delay S answers every request
S seconds late (a receiver slower than the client's timeout: the request
was taken, the answer comes too late); --mode close drops the connection
without an answer, --mode garbage answers bytes that are not HTTP.
The signature checks are written here on their own, not imported from
gpuguard, so a wrong recipe in gpuguard cannot agree with itself.
"""
import argparse
import base64
import hashlib
import hmac
import json
import sys
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def ding_expected(secret, ts):
    mac = hmac.new(secret.encode(), (ts + "\n" + secret).encode(), hashlib.sha256)
    return base64.b64encode(mac.digest()).decode()


def feishu_expected(secret, ts):
    mac = hmac.new((ts + "\n" + secret).encode(), b"", hashlib.sha256)
    return base64.b64encode(mac.digest()).decode()


class Sink:
    def __init__(self, record=None, secret=None, script=None, quiet=False, delay=0.0, mode=None):
        self.record = record
        self.delay = float(delay or 0)
        self.mode = mode
        self.secret = secret
        self.script = list(script or [])
        self.quiet = quiet
        self.requests = []
        self.lock = threading.Lock()

    def reply_for(self, path, query, body):
        with self.lock:
            if self.script:
                return self.script.pop(0)
        if path.startswith("/dingtalk"):
            if self.secret:
                ts = query.get("timestamp", [""])[0]
                sign = query.get("sign", [""])[0]
                if not ts or sign != ding_expected(self.secret, ts):
                    return {"status": 200, "body": {"errcode": 310000, "errmsg": "sign not match"}}
            return {"status": 200, "body": {"errcode": 0, "errmsg": "ok"}}
        if path.startswith("/feishu"):
            if self.secret:
                ts = str((body or {}).get("timestamp", ""))
                if not ts or (body or {}).get("sign") != feishu_expected(self.secret, ts):
                    return {"status": 200, "body": {"code": 19021, "msg": "sign match fail or timestamp is not within one hour from current time"}}
            return {"status": 200, "body": {"StatusCode": 0, "StatusMessage": "success", "code": 0, "data": {}, "msg": "success"}}
        if path.startswith("/wecom"):
            return {"status": 200, "body": {"errcode": 0, "errmsg": "ok"}}
        if path.startswith("/slack"):
            return {"status": 200, "body": "ok"}
        if path.startswith("/api/v2/alerts"):
            return {"status": 200, "body": ""}
        return {"status": 200, "body": {}}


def make_handler(sink):
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length)
            parts = urllib.parse.urlsplit(self.path)
            query = urllib.parse.parse_qs(parts.query)
            try:
                body = json.loads(raw.decode("utf-8"))
            except ValueError:
                body = raw.decode("utf-8", "replace")
            reply = sink.reply_for(parts.path, query, body)
            entry = {"time": time.time(), "method": "POST", "path": parts.path,
                     "query": {k: v[0] for k, v in query.items()}, "body": body,
                     "content_type": self.headers.get("Content-Type"),
                     "reply_status": reply.get("status", 200)}
            with sink.lock:
                sink.requests.append(entry)
                if sink.record:
                    with open(sink.record, "a", encoding="utf-8") as f:
                        f.write(json.dumps(entry, ensure_ascii=False) + "\n")
            if not sink.quiet:
                summary = body.get("message", "").split("\n")[0] if isinstance(body, dict) else ""
                print("sink: POST %s -> %s %s" % (parts.path, reply.get("status", 200), summary), flush=True)
            if reply.get("delay") or sink.delay:
                time.sleep(float(reply.get("delay") or sink.delay))
            if sink.mode == "close" or reply.get("close"):
                self.close_connection = True
                self.wfile.flush()
                self.connection.shutdown(2)
                return
            if sink.mode == "garbage":
                self.wfile.write(b"\x00\xffnot http at all\r\n\r\n")
                self.close_connection = True
                return
            payload = reply.get("body", "")
            data = payload.encode() if isinstance(payload, str) else json.dumps(payload).encode()
            self.send_response(int(reply.get("status", 200)))
            for key, value in (reply.get("headers") or {}).items():
                self.send_header(key, str(value))
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    return Handler


class QuietServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):
        # a client that gave up (timeout) before a slow answer: expected here
        if not isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            super().handle_error(request, client_address)


def serve(port=0, sock=None, **kwargs):
    """Starts a sink in a thread; returns (server, sink). For tests. `sock`:
    a socket already bound (a port the test kept while the receiver was
    down), on which the sink listens."""
    sink = Sink(**kwargs)
    if sock is None:
        server = QuietServer(("127.0.0.1", port), make_handler(sink))
    else:
        server = QuietServer(sock.getsockname(), make_handler(sink), bind_and_activate=False)
        server.socket.close()
        server.socket = sock
        server.server_activate()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, sink


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--port-file")
    ap.add_argument("--record")
    ap.add_argument("--secret-file", help="file holding the signing secret to check")
    ap.add_argument("--script")
    ap.add_argument("--quiet", action="store_true")
    ap.add_argument("--delay", type=float, default=0.0, help="answer every request this late (s)")
    ap.add_argument("--mode", choices=("close", "garbage"), help="misbehave: drop the connection or answer garbage")
    ap.add_argument("--seconds", type=float, default=600, help="stop after this long")
    args = ap.parse_args()
    secret = None
    if args.secret_file:
        with open(args.secret_file, encoding="utf-8") as f:
            secret = f.read().strip()
    script = None
    if args.script:
        with open(args.script, encoding="utf-8") as f:
            script = json.load(f)
    server, _ = serve(args.port, record=args.record, secret=secret, script=script, quiet=args.quiet,
                      delay=args.delay, mode=args.mode)
    if args.port_file:
        with open(args.port_file + ".tmp", "w") as f:
            f.write(str(server.server_address[1]))
        import os
        os.replace(args.port_file + ".tmp", args.port_file)
    else:
        print(server.server_address[1], flush=True)
    try:
        time.sleep(args.seconds)
    except KeyboardInterrupt:
        pass
    server.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
