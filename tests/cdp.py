"""Headless Debian Chromium driven over the DevTools protocol with the
standard library only (a minimal WebSocket client): load a page, collect
console messages and uncaught exceptions, evaluate JavaScript, take a
screenshot. Used by the report's browser test and bench/report_bench.py."""
import base64
import json
import os
import re
import shutil
import socket
import struct
import subprocess
import tempfile
import time
import urllib.request

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--hide-scrollbars", "--mute-audio"]


def available():
    return os.access(CHROMIUM, os.X_OK)


class Browser:
    def __init__(self, width=1100, height=1400):
        self.profile = tempfile.mkdtemp(prefix="gg-chromium-")
        self.proc = subprocess.Popen([CHROMIUM] + FLAGS + ["--user-data-dir=" + self.profile,
                                                           "--window-size=%d,%d" % (width, height),
                                                           "--remote-debugging-address=127.0.0.1",
                                                           "--remote-debugging-port=0", "about:blank"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        port = None
        deadline = time.time() + 60
        while port is None and time.time() < deadline:
            line = self.proc.stderr.readline().decode("utf-8", "replace")
            if not line and self.proc.poll() is not None:
                raise RuntimeError("chromium exited %s" % self.proc.returncode)
            m = re.search(r"DevTools listening on ws://127\.0\.0\.1:(\d+)/", line)
            if m:
                port = int(m.group(1))
        if port is None:
            raise RuntimeError("chromium did not start its DevTools endpoint")
        # keep reading stderr so chromium never blocks on a full pipe
        import threading
        threading.Thread(target=self.proc.stderr.read, daemon=True).start()
        with urllib.request.urlopen("http://127.0.0.1:%d/json/list" % port, timeout=10) as r:
            pages = [t for t in json.load(r) if t.get("type") == "page"]
        url = pages[0]["webSocketDebuggerUrl"]
        self.sock = ws_connect(url)
        self.next_id = 0
        self.events = []
        for domain in ("Page", "Runtime", "Log"):
            self.call(domain + ".enable")

    def call(self, method, **params):
        self.next_id += 1
        mid = self.next_id
        ws_send(self.sock, json.dumps({"id": mid, "method": method, "params": params}))
        while True:
            msg = json.loads(ws_recv(self.sock))
            if msg.get("id") == mid:
                if "error" in msg:
                    raise RuntimeError("%s: %s" % (method, msg["error"]))
                return msg.get("result", {})
            self.events.append(msg)

    def wait_event(self, method, timeout=30):
        for i, e in enumerate(self.events):
            if e.get("method") == method:
                return self.events.pop(i)
        self.sock.settimeout(timeout)
        try:
            while True:
                msg = json.loads(ws_recv(self.sock))
                if msg.get("method") == method:
                    return msg
                self.events.append(msg)
        finally:
            self.sock.settimeout(None)

    def load(self, url):
        self.events = []
        self.call("Page.navigate", url=url)
        self.wait_event("Page.loadEventFired")

    def eval(self, expr):
        r = self.call("Runtime.evaluate", expression=expr, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in r:
            raise RuntimeError("page JS failed: %s" % r["exceptionDetails"])
        return r["result"].get("value")

    def problems(self):
        """Console errors and warnings, uncaught exceptions, log errors."""
        out = []
        for e in self.events:
            m, p = e.get("method"), e.get("params", {})
            if m == "Runtime.exceptionThrown":
                out.append("exception: %s" % p["exceptionDetails"].get("exception", {}).get("description")
                           or p["exceptionDetails"].get("text"))
            elif m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "warning", "assert"):
                out.append("console.%s: %s" % (p["type"], [a.get("value") for a in p.get("args", [])]))
            elif m == "Log.entryAdded" and p["entry"].get("level") in ("error", "warning"):
                out.append("log %s: %s" % (p["entry"]["level"], p["entry"].get("text")))
        return out

    def screenshot(self, path, full_height=None):
        params = {"format": "png"}
        if full_height:
            params.update(captureBeyondViewport=True,
                          clip={"x": 0, "y": 0, "width": 1100, "height": full_height, "scale": 1})
        data = self.call("Page.captureScreenshot", **params)["data"]
        with open(path, "wb") as f:
            f.write(base64.b64decode(data))

    def close(self):
        try:
            self.call("Browser.close")
        except (OSError, RuntimeError, ValueError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.profile, ignore_errors=True)


# ------------------------------------------------------------- websocket --

def ws_connect(url):
    m = re.match(r"ws://([^:/]+):(\d+)(/.*)", url)
    host, port, path = m.group(1), int(m.group(2)), m.group(3)
    sock = socket.create_connection((host, port), timeout=30)
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall(("GET %s HTTP/1.1\r\nHost: %s:%d\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                  "Sec-WebSocket-Key: %s\r\nSec-WebSocket-Version: 13\r\n\r\n" % (path, host, port, key)).encode())
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = sock.recv(1)
        if not chunk:
            raise RuntimeError("websocket handshake failed")
        head += chunk
    if b" 101 " not in head.split(b"\r\n", 1)[0]:
        raise RuntimeError("websocket handshake refused: %r" % head[:200])
    sock.settimeout(None)
    return sock


def ws_send(sock, text):
    data = text.encode()
    n = len(data)
    head = bytes([0x81])
    if n < 126:
        head += bytes([0x80 | n])
    elif n < 65536:
        head += bytes([0x80 | 126]) + struct.pack(">H", n)
    else:
        head += bytes([0x80 | 127]) + struct.pack(">Q", n)
    mask = os.urandom(4)
    sock.sendall(head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(data)))


def recv_exact(sock, n):
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise RuntimeError("websocket closed")
        buf += chunk
    return bytes(buf)


def ws_recv(sock):
    parts = []
    while True:
        b0, b1 = recv_exact(sock, 2)
        n = b1 & 0x7F
        if n == 126:
            n = struct.unpack(">H", recv_exact(sock, 2))[0]
        elif n == 127:
            n = struct.unpack(">Q", recv_exact(sock, 8))[0]
        mask = recv_exact(sock, 4) if b1 & 0x80 else None
        payload = recv_exact(sock, n)
        if mask:
            payload = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        op = b0 & 0x0F
        if op == 9:                      # ping
            continue
        if op == 8:
            raise RuntimeError("websocket closed by chromium")
        parts.append(payload)
        if b0 & 0x80:
            return b"".join(parts).decode("utf-8")
