"""gpuguard's alert module: every event leaves through here.

Commands:
  flush          deliver what waits in $GPUGUARD_STATE_DIR/outbox: one digest
                 per target, then record each delivery
  test           send a test message to every target and print one line each
  check          check every target without sending anything (URL shape,
                 DNS, TCP connect): one tab-separated line per target
  preview [FILE] print each provider's message for recorded events (FILE,
                 "-" for stdin, default the last event of events.jsonl; a
                 line that is not an event, such as one a crash cut, is
                 skipped)
  render         print the message for the events read on stdin

Targets come from the environment only (never argv): NOTIFY_URL (one or more
URLs, separated by spaces, commas or semicolons; a "PROVIDER+", "LANG+" or
"PROVIDER:LANG+" prefix forces the provider (dingtalk, feishu, wecom, slack,
generic) and the language (zh, en)), NOTIFY_TYPE (provider for URLs whose host
says nothing), NOTIFY_SECRET (signing secret; one for all, or one per URL in
the same order), NOTIFY_LANG (zh|en for every target; default: Chinese for
DingTalk, Feishu and WeCom, English for the others), NOTIFY_TIMEOUT (s),
NOTIFY_RETRIES, NOTIFY_RATE_PER_MIN (0: the provider's own limit),
NOTIFY_MENTION (mobiles or user ids mentioned once per firing digest),
ALERTMANAGER_URL, OUTBOX_MAX, REPEAT_INTERVAL, GPU_HOUR_PRICE (e.g. "30",
"¥30", "2.5 USD": the idle cost line). Logging: GPUGUARD_LOG,
GPUGUARD_LOG_LEVEL, GPUGUARD_SYSLOG, as the bash side.

The texts and bodies come from python/gpuguard_render.py; this module
signs and sends them and keeps the outbox. It is the only one that speaks
HTTP.

Delivery is at-least-once with a bound: a send is recorded (an empty marker
file beside the outbox file) right after the receiver accepts it, so a kill
between the two sends that digest once more; a receiver that takes the
request but answers after the timeout is tried once more with a longer
timeout and then counted as delivered, never more than twice.

Standard library only: it must run on a bare GPU box.
"""
import base64
import errno
import fcntl
import hashlib
import hmac
import http.client
import json
import os
import random
import re
import socket
import sys
import threading
import time
import urllib.parse

import gpuguard_render
from gpuguard_files import write_atomic
from gpuguard_secrets import scrub, split_urls, strip_prefix

_PROVIDER_HOSTS = {
    "oapi.dingtalk.com": "dingtalk",
    "open.feishu.cn": "feishu",
    "open.larksuite.com": "feishu",
    "qyapi.weixin.qq.com": "wecom",
    "hooks.slack.com": "slack",
}
_PROVIDERS = ("dingtalk", "feishu", "wecom", "slack", "generic")
# Messages per minute each provider accepts from one robot / webhook.
_PROVIDER_RATE = {"dingtalk": 20, "wecom": 20, "feishu": 100, "slack": 60,
                 "generic": 600, "alertmanager": 600}
# Business error codes: retry later (rate limited) versus permanent.
_RETRY_CODES = {"dingtalk": {130101}, "wecom": {45009}, "feishu": {11232}}
_PERMANENT_RETRY_AFTER = 600.0
_MAX_RETRY_AFTER = 300.0
# After a cycle's retries are spent on a target that is down, later cycles
# wait 30 s, 60 s, 120 s ... (at most _MAX_RETRY_AFTER) before trying it again,
# so a dead receiver does not eat every watchdog cycle.
_DOWN_BACKOFF = 30.0
# A receiver that got the request but did not answer in time is tried once
# more with this many times the timeout (issue 13: <= 2 deliveries).
_MAYBE_TIMEOUT_FACTOR = 3
# The longest one flush waits for its targets (s).
_FLUSH_DEADLINE = 240.0
_LOG_RANK = {"debug": 0, "info": 1, "warn": 2, "error": 3}
_LOG_LOCK = threading.Lock()


# ---------------------------------------------------------------- logging --

def _log(env, level, msg):
    """One log line in the format the bash side writes, filtered by
    GPUGUARD_LOG_LEVEL and copied to syslog when GPUGUARD_SYSLOG=1."""
    minimum = _LOG_RANK.get(env.get("GPUGUARD_LOG_LEVEL") or "info", 1)
    if _LOG_RANK.get(level, 1) < minimum:
        return
    text = scrub(msg, env).replace("\n", " ")
    line = f"{time.strftime('%Y-%m-%d %H:%M:%S')} {level.upper():<5} alert: {text}\n"
    path = env.get("GPUGUARD_LOG")
    with _LOG_LOCK:
        written = False
        if path:
            try:
                # never through a link planted at the log's path (as gg_append)
                fd = _open_nofollow(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
                with os.fdopen(fd, "a", encoding="utf-8", errors="replace") as f:
                    f.write(line)
                written = True
            except (OSError, ValueError):
                pass
        if not written:
            try:
                sys.stderr.write(line)
            except (OSError, ValueError):
                pass
        if env.get("GPUGUARD_SYSLOG") == "1":
            try:
                import syslog
                prio = {"debug": syslog.LOG_DEBUG, "info": syslog.LOG_INFO,
                        "warn": syslog.LOG_WARNING, "error": syslog.LOG_ERR}[level]
                syslog.openlog("gpuguard/alert", 0, syslog.LOG_USER)
                syslog.syslog(prio, text)
            except (ImportError, OSError, KeyError):
                pass


def _mask_url(url):
    """A URL fit for a log line: scheme, host and port (two receivers on one
    host told apart; an IPv6 address keeps its brackets) and a masked path;
    never the user or password."""
    parts = urllib.parse.urlsplit(url)
    return "{}://{}/***".format(parts.scheme, parts.netloc.rsplit("@", 1)[-1] or "?")


def _one_line(exc, env):
    """An exception as one short line (never a traceback)."""
    text = str(exc) or exc.__class__.__name__
    return scrub(text.replace("\n", " "), env)[:200]


# ------------------------------------------------------------------ files --

def _open_nofollow(path, flags, mode=0o600):
    return os.open(path, flags | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), mode)


def _read_bytes(path, limit=1 << 20):
    """Reads a file without following a symlink planted at its path."""
    fd = _open_nofollow(path, os.O_RDONLY)
    with os.fdopen(fd, "rb") as f:
        return f.read(limit)


def _touch_marker(path):
    """Creates an empty marker file: no data block, so it works on a full
    disk; O_EXCL|O_NOFOLLOW: never through a planted link."""
    try:
        fd = _open_nofollow(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    except FileExistsError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    os.close(fd)


def _write_failed(env, state_dir, what, e):
    """Logs a failed write once for a whole outage, shared with the bash
    writers (gg_write_failed): the first to create the empty disk-full
    marker in the state folder says it; the others stay quiet."""
    if not os.path.isdir(state_dir):
        # the folder was removed under a daemon: not a full disk; the
        # daemon makes it again and says so (gg_state_dir_recreate)
        return
    marker = os.path.join(state_dir, "disk-full")
    try:
        fd = _open_nofollow(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        os.close(fd)
    except FileExistsError:
        return
    except OSError:
        pass
    # a permission error is named as one: "disk full?" there sent the
    # reader after the wrong cause
    cause = f"{e.strerror or e}; disk full?"
    if getattr(e, "errno", None) in (errno.EACCES, errno.EPERM):
        cause = f"{e.strerror or e} for uid {os.geteuid()}"
    _log(env, "error", f"cannot write {what} ({cause}): previous files are kept, new events "
        "wait, retried every cycle; one line for the whole outage")


def _write_ok(env, state_dir):
    """Ends an outage that _write_failed (or a bash writer) started."""
    marker = os.path.join(state_dir, "disk-full")
    try:
        if not os.path.islink(marker):
            os.unlink(marker)
            _log(env, "info", f"writing to {state_dir} works again")
    except OSError:
        pass


def _state_dir_problem(folder):
    """Why the state folder must not be used, or ''."""
    try:
        st = os.stat(folder)
    except OSError as e:
        return f"state folder {folder}: {e.strerror}"
    if hasattr(os, "geteuid") and st.st_uid != os.geteuid():
        return f"state folder {folder} is owned by uid {st.st_uid}, not by us (uid {os.geteuid()}): refusing it"
    if st.st_mode & 0o022:
        return f"state folder {folder} is writable by others (mode {st.st_mode & 0o777:o}): refusing it"
    return ""


class _FlushLock:
    """One flush at a time per state folder (daemon, cron and a manual run
    may overlap): a non-blocking flock on state/flush.lock."""

    def __init__(self, folder):
        self.path = os.path.join(folder, "flush.lock")
        self.fd = None
        self.error = ""

    def acquire(self):
        try:
            self.fd = _open_nofollow(self.path, os.O_RDWR | os.O_CREAT)
        except OSError as e:
            if e.errno == errno.ELOOP:
                # O_NOFOLLOW: a link planted there is refused, never followed
                self.error = f"refusing to open {self.path}: it is a symlink (planted? remove it)"
            else:
                self.error = f"cannot open {self.path}: {e.strerror}"
            return False
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(self.fd)
            self.fd = None
            return False
        return True

    def release(self):
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


# ---------------------------------------------------------------- targets --


_URL_MAX = 2048
_AUTHORITY = re.compile(r"(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+)(?::([0-9]{1,5}))?")


def _url_problem(url):
    """Why one target URL (its prefix removed) cannot be used, or "". The
    same rule as config_url_problem in lib/config.sh, which warns when the
    configuration is read (tests/test_config_cli.py runs both on one list)."""
    if len(url) > _URL_MAX:
        return f"longer than {_URL_MAX} characters"
    if re.search(r"[^!-~]", url):
        return "has a space, control or non-ASCII character (a domain goes in its xn-- form)"
    # a scheme is case-insensitive (RFC 3986): HTTPS:// as a chat client
    # copies it is a URL too
    m = re.match(r"https?://([^/?#]*)", url, re.IGNORECASE)
    if not m:
        return "not an http:// or https:// URL"
    host = _AUTHORITY.fullmatch(m.group(1).rsplit("@", 1)[-1])
    if not host:
        return "bad host or port (an IPv6 address goes in [brackets])"
    if host.group(1) and not 1 <= int(host.group(1)) <= 65535:
        return "port out of range 1..65535"
    return ""


def _target_name(key, index, url):
    """A malformed target as a log line may show it: the key, its place in
    the list and scheme://host without user, path or query (tokens)."""
    m = re.match(r"([A-Za-z]{1,10})://([^/?#]*)", url)
    if not m:
        return f"{key} #{index}"
    host = re.sub(r"[^!-~]", "?", m.group(2).rsplit("@", 1)[-1])[:60]
    return f"{key} #{index} ({m.group(1)}://{host}/***)"



class _Target:
    def __init__(self, url, provider, secret, lang=None):
        self.url = url
        self.provider = provider
        self.secret = secret
        self.lang = lang or gpuguard_render.PROVIDER_LANG.get(provider, "en")
        self.id = hashlib.sha256(url.encode()).hexdigest()[:12]

    def label(self):
        return f"{self.provider} {_mask_url(self.url)}"


def _targets_from_env(env, bad=None):
    """The targets of NOTIFY_URL and ALERTMANAGER_URL. A malformed one is
    left out, so it never blocks the others; (name, problem) goes to the
    list `bad` when one is given."""
    bad = [] if bad is None else bad
    urls = split_urls(env.get("NOTIFY_URL", ""))
    sec = [s for s in re.split(r"[\s,;]+", env.get("NOTIFY_SECRET", "")) if s]
    default_type = env.get("NOTIFY_TYPE", "") or None
    global_lang = env.get("NOTIFY_LANG", "") if env.get("NOTIFY_LANG", "") in gpuguard_render.LANGUAGES else None
    out = []

    def parse(raw, allowed):
        prefix, url = strip_prefix(raw)
        provider = lang = None
        for part in [p for p in prefix.split(":") if p]:
            if part in gpuguard_render.LANGUAGES:
                lang = part
            elif part in allowed:
                provider = part
            else:
                raise ValueError(f"unknown provider or language '{part[:20]}' in its prefix")
        problem = _url_problem(url)
        if problem:
            raise ValueError(problem)
        # one spelling of the scheme: HTTPS:// and https:// are one target
        scheme, rest = url.split("://", 1)
        return scheme.lower() + "://" + rest, provider, lang

    for i, raw in enumerate(urls):
        try:
            url, provider, lang = parse(raw, _PROVIDERS)
            host = (urllib.parse.urlsplit(url).hostname or "").lower()
        except ValueError as e:
            bad.append((_target_name("NOTIFY_URL", i + 1, strip_prefix(raw)[1]), _one_line(e, env)))
            continue
        provider = provider or _PROVIDER_HOSTS.get(host) or default_type or "generic"
        secret = sec[i] if len(sec) == len(urls) else (sec[0] if len(sec) == 1 else "")
        out.append(_Target(url, provider, secret, lang or global_lang))
    for i, raw in enumerate(split_urls(env.get("ALERTMANAGER_URL", ""))):
        try:
            url, _, lang = parse(raw, ())
        except ValueError as e:
            bad.append((_target_name("ALERTMANAGER_URL", i + 1, strip_prefix(raw)[1]), _one_line(e, env)))
            continue
        out.append(_Target(_alertmanager_base(url), "alertmanager", "", lang))
    return out


# The API path of Alertmanager's alerts, as its docs give the URL to paste:
# gpuguard adds /api/v2/alerts itself, so a URL that ends in it is taken as
# its base (it posted to /api/v2/alerts/api/v2/alerts, a 404). /api/v1 is
# gone from Alertmanager 0.27 and v2 is there since 0.16: a v1 URL posts to
# v2 too. A route prefix before it (--web.route-prefix) is kept.
_AM_API_PATH = re.compile(r"/api/v[12](?:/alerts)?/*$", re.IGNORECASE)


def _alertmanager_base(url):
    """An ALERTMANAGER_URL as the base that /api/v2/alerts is added to."""
    parts = urllib.parse.urlsplit(url)
    path = _AM_API_PATH.sub("", parts.path).rstrip("/")
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, path, parts.query, parts.fragment))


# ---------------------------------------------------------------- signing --

def _dingtalk_sign(secret, ts_ms):
    """DingTalk 加签: HMAC-SHA256 keyed by the secret over "ts\\nsecret",
    base64, URL-encoded once."""
    digest = hmac.new(secret.encode("utf-8"),
                      (f"{ts_ms}\n{secret}").encode(),
                      hashlib.sha256).digest()
    return urllib.parse.quote_plus(base64.b64encode(digest))


def _feishu_sign(secret, ts_s):
    """Feishu: HMAC-SHA256 keyed by "ts\\nsecret" over the empty message,
    base64, not URL-encoded (it goes in the JSON body)."""
    digest = hmac.new((f"{ts_s}\n{secret}").encode(), b"",
                      hashlib.sha256).digest()
    return base64.b64encode(digest).decode("ascii")


def _chat_request(target, events, lang, now, env):
    """(url, JSON body) of one digest for a chat or generic target: the
    body gpuguard_render.chat_body writes, signed as the platform wants
    when the target has a secret (DingTalk in the URL, Feishu in the body)."""
    now = time.time() if now is None else now
    url = target.url
    body = gpuguard_render.chat_body(target.provider, events, lang, env)
    if target.provider == "dingtalk" and target.secret:
        ts = str(int(now * 1000))
        sep = "&" if "?" in url else "?"
        url = f"{url}{sep}timestamp={ts}&sign={_dingtalk_sign(target.secret, ts)}"
    elif target.provider == "feishu" and target.secret:
        ts = str(int(now))
        body = dict({"timestamp": ts, "sign": _feishu_sign(target.secret, ts)}, **body)
    return url, body


# -------------------------------------------------------------- transport --

class _Outcome:
    SENT, RETRY, PERMANENT, MAYBE = "sent", "retry", "permanent", "maybe"

    def __init__(self, kind, detail, retry_after=None):
        self.kind = kind
        self.detail = detail
        self.retry_after = retry_after


class _NotSent(Exception):
    """The request never reached the receiver (DNS, refused, TLS...), or the
    receiver dropped it without a byte of answer (reset, closed)."""


class _MaybeSent(Exception):
    """The request was sent but no answer came: it may have been delivered."""


def _retry_after_seconds(value):
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        from email.utils import parsedate_to_datetime
        return max(0.0, parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError):
        return None


def _classify(provider, status, body, headers):
    """Reads a response the way each platform means it: HTTP 200 with an
    errcode is not a delivery."""
    text = body.decode("utf-8", "replace") if isinstance(body, bytes) else str(body)
    if status == 429 or status >= 500:
        ra = _retry_after_seconds(headers.get("Retry-After")) if headers else None
        return _Outcome(_Outcome.RETRY, f"HTTP {status} {text[:120]}", ra)
    if not 200 <= status < 300:
        return _Outcome(_Outcome.PERMANENT, f"HTTP {status} {text[:200]}")
    if provider in ("dingtalk", "wecom", "feishu"):
        try:
            data = json.loads(text)
        except ValueError:
            return _Outcome(_Outcome.RETRY, f"unreadable reply {text[:120]!r}")
        if not isinstance(data, dict):
            return _Outcome(_Outcome.RETRY, f"unreadable reply {text[:120]!r}")
        code = data.get("errcode", data.get("code", data.get("StatusCode")))
        msg_text = data.get("errmsg", data.get("msg", data.get("StatusMessage", "")))
        if code == 0:
            return _Outcome(_Outcome.SENT, "ok")
        if code in _RETRY_CODES.get(provider, set()):
            return _Outcome(_Outcome.RETRY, f"rate limited: {code} {msg_text}", 60.0)
        return _Outcome(_Outcome.PERMANENT, f"error {code}: {msg_text}")
    if provider == "slack":
        if text.strip() == "ok":
            return _Outcome(_Outcome.SENT, "ok")
        return _Outcome(_Outcome.PERMANENT, f"reply {text[:120]!r}")
    return _Outcome(_Outcome.SENT, f"HTTP {status}")


def _post_json(url, body, timeout, env, key=None):
    """POSTs JSON; (status, body, headers). Raises NotSent when the request
    never left, MaybeSent when it left and no answer came in time."""
    data = json.dumps(body, ensure_ascii=False).encode("utf-8", "replace")
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise _NotSent("not an http(s) URL")
    cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    try:
        conn = cls(parts.hostname, parts.port, timeout=timeout)
    except (ValueError, OSError) as e:
        raise _NotSent(_one_line(e, env))
    path = (parts.path or "/") + ("?" + parts.query if parts.query else "")
    headers = {"Content-Type": "application/json; charset=utf-8", "User-Agent": "gpuguard",
               "Content-Length": str(len(data))}
    if key:
        headers["Idempotency-Key"] = key
    try:
        try:
            conn.connect()
        except (OSError, http.client.HTTPException, ValueError) as e:
            raise _NotSent(getattr(e, "strerror", None) or _one_line(e, env))
        try:
            conn.request("POST", path, body=data, headers=headers)
        except (OSError, http.client.HTTPException) as e:
            raise _NotSent("sending: %s" % (getattr(e, "strerror", None) or _one_line(e, env)))
        try:
            resp = conn.getresponse()
            return resp.status, resp.read(65536), dict(resp.headers)
        except ConnectionError as e:
            # reset, or closed without a byte of answer (RemoteDisconnected
            # is one): the receiver dropped the request, most likely before
            # processing it; retried like a refused connection. Counting it
            # as maybe-delivered lost events to a receiver that reset twice.
            raise _NotSent("no answer: %s" % (getattr(e, "strerror", None) or _one_line(e, env)))
        except (OSError, http.client.HTTPException) as e:
            # a timeout after the whole request went out: it may have been
            # processed (a slow receiver), so it counts toward the 2 copies
            raise _MaybeSent(f"no answer within {timeout:g} s ({_one_line(e, env)})")
    finally:
        conn.close()


def _send(target, url, body, env, sleep=time.sleep, maybe_before=False, on_maybe=None, key=None):
    """POSTs with retries and backoff on network errors, 5xx and 429.
    A Retry-After longer than a short wait ends the attempt: the event stays
    queued and that target is not tried again before then. A request that
    left whole and timed out waiting for an answer is retried once, with a
    longer timeout; a second one (maybe_before: an earlier flush had one)
    counts as delivered. A connection reset or closed without an answer is
    not a maybe: it is retried (with back-off) until delivered."""
    timeout = float(env.get("NOTIFY_TIMEOUT") or 5)
    tries = int(env.get("NOTIFY_RETRIES") or 3) + 1
    outcome = None
    attempt = 0
    while attempt < tries:
        attempt += 1
        try:
            status, reply, headers = _post_json(url, body, timeout, env, key)
            outcome = _classify(target.provider, status, reply, headers)
        except _NotSent as e:
            outcome = _Outcome(_Outcome.RETRY, f"network: {e}")
        except _MaybeSent as e:
            if maybe_before:
                return _Outcome(_Outcome.MAYBE, f"{e} twice; counted as delivered to stay under 2 copies")
            maybe_before = True
            if on_maybe:
                on_maybe()
            timeout *= _MAYBE_TIMEOUT_FACTOR
            outcome = _Outcome(_Outcome.RETRY, str(e))
            tries = max(tries, attempt + 1)      # the one retry, at once
            continue
        if outcome.kind != _Outcome.RETRY:
            return outcome
        wait = outcome.retry_after
        if wait is not None and wait > 10:
            return outcome
        if attempt < tries:
            backoff = wait if wait is not None else min(8.0, 0.5 * 2 ** (attempt - 1)) * random.uniform(0.5, 1.5)
            sleep(backoff)
    return outcome


# ----------------------------------------------------------------- outbox --

class _State:
    """Per-target delivery state: recent send times (rate limit), a
    not-before time, and whether a permanent error was reported. Targets
    are known by a hash of their URL and a masked label, never the URL."""

    def __init__(self, path, env):
        self.path = path
        self.env = env
        self.data = {}
        try:
            data = json.loads(_read_bytes(path).decode("utf-8", "replace"))
            if isinstance(data, dict):
                self.data = {k: v for k, v in data.items() if isinstance(v, dict)}
        except FileNotFoundError:
            pass
        except OSError as e:
            if e.errno == errno.ELOOP:
                _log(env, "error", f"{path} is a symlink: not read (it is replaced on save)")
        except ValueError:
            _log(env, "warn", f"{path} unreadable: delivery state starts afresh")

    def target(self, target):
        t = self.data.setdefault(target.id, {})
        for key, value in (("sent", []), ("not_before", 0), ("reported", ""), ("failures", 0)):
            t.setdefault(key, value)
        t["label"] = target.label()
        return t

    def save(self):
        for t in self.data.values():
            t["reported"] = scrub(t.get("reported", ""), self.env)
        try:
            write_atomic(self.path, json.dumps(self.data, sort_keys=True), durable=True)
        except OSError as e:
            _write_failed(self.env, os.path.dirname(self.path), self.path, e)
            return False
        _write_ok(self.env, os.path.dirname(self.path))
        return True


def _rate_budget(target, tstate, now, env):
    per_min = int(env.get("NOTIFY_RATE_PER_MIN") or 0) or _PROVIDER_RATE[target.provider]
    tstate["sent"] = [t for t in tstate["sent"] if isinstance(t, (int, float)) and now - t < 60]
    return per_min - len(tstate["sent"])


def _outbox_items(outbox):
    try:
        names = sorted(n for n in os.listdir(outbox) if n.endswith(".json") and not n.startswith("."))
    except OSError:
        return []
    return [os.path.join(outbox, n) for n in names]


_LEADING_ZEROS = re.compile(r'([:\[,]\s*-?)0+(\d)')


def _parse_event(raw):
    """One event from the bytes of an outbox file or an events.jsonl line:
    names that are not UTF-8 (GBK, raw bytes) become U+FFFD; a number
    written with leading zeros (07) is read as 7 rather than the event
    being lost."""
    text = raw.decode("utf-8", "replace").strip().split("\n", 1)[0]
    try:
        event = json.loads(text)
    except ValueError:
        event = json.loads(_LEADING_ZEROS.sub(r"\1\2", text))
    if not isinstance(event, dict):
        raise ValueError("not a JSON object")  # noqa: TRY004 (callers set bad files aside on ValueError)
    return event


def _markers(path, kind, names=None):
    """Target ids with a marker of this kind (done, maybe) for an item;
    names: the outbox listing already read (one listing per pass, not one
    per item, for a full outbox)."""
    folder, base = os.path.split(path)
    prefix = base + "." + kind + "-"
    names = _list_names(folder) if names is None else names
    found = {n[len(prefix):] for n in names if n.startswith(prefix)}
    if kind == "done" and base[:-5] + ".sent" in names:
        # files written by older versions: one target id a line
        try:
            found |= set(_read_bytes(path[:-5] + ".sent").decode("ascii", "replace").split())
        except OSError:
            pass
    return found


def _read_item(path, names=None):
    """(event, set of target ids already delivered)."""
    event = _parse_event(_read_bytes(path))
    return event, _markers(path, "done", names)


def _mark(path, kind, tid, env):
    try:
        _touch_marker(f"{path}.{kind}-{tid}")
        return True
    except OSError as e:
        # an empty marker needs no data block; failing, it is one line an outage
        _write_failed(env, os.path.dirname(os.path.dirname(path)), f"the {kind} marker of {os.path.basename(path)} "
                     "(it may be sent again)", e)
        return False


def _remove_item(path, names=None):
    """The item first (it is then never sent again), then its markers."""
    folder, base = os.path.split(path)
    names = _list_names(folder) if names is None else names
    for p in [path, path[:-5] + ".sent"] + [os.path.join(folder, n) for n in names
                                            if n.startswith(base + ".")]:
        try:
            os.remove(p)
        except OSError:
            pass


def _list_names(folder):
    try:
        return os.listdir(folder)
    except OSError:
        return []


def _remove_orphan_markers(outbox):
    """Markers whose item is gone (a kill between the two removals)."""
    names = set(_list_names(outbox))
    for n in names:
        m = re.match(r"^(.*\.json)\.(done|maybe)-[0-9a-f]+$", n)
        if m and m.group(1) not in names:
            try:
                os.remove(os.path.join(outbox, n))
            except OSError:
                pass


def _enforce_bound(outbox, limit, env):
    items = _outbox_items(outbox)
    excess = len(items) - limit
    if excess <= 0:
        return
    dropped = items[:excess]
    first = os.path.basename(dropped[0])
    last = os.path.basename(dropped[-1])
    names = _list_names(outbox)
    for path in dropped:
        _remove_item(path, names)
    _log(env, "error", f"outbox over OUTBOX_MAX={limit}: dropped the {excess} oldest undelivered events ({first} .. {last})")


def _deliver_target(target, tstate, items, env, now):
    """Sends one target everything it has not had yet, as digests, and
    records each delivery. Returns nothing; errors are one log line."""
    if now < tstate.get("not_before", 0):
        return
    pending = [(p, e) for p, e, done in items if target.id not in done]
    while pending:
        budget = _rate_budget(target, tstate, now, env)
        if budget <= 0:
            per_min = int(env.get("NOTIFY_RATE_PER_MIN") or 0) or _PROVIDER_RATE[target.provider]
            _log(env, "warn", f"{target.label()}: rate limit reached ({per_min} a minute); {len(pending)} events wait")
            return
        batch = pending[:200]
        events = [e for _, e in batch]
        if target.provider == "alertmanager":
            url = target.url + "/api/v2/alerts"
            body = [a for e in events for a in gpuguard_render.alertmanager_alerts(e, target.lang, time.time(), env)]
        else:
            url, body = _chat_request(target, events, target.lang, now, env)
        names = _list_names(os.path.dirname(batch[0][0]))
        maybe_before = any(target.id in _markers(p, "maybe", names) for p, _ in batch)

        def on_maybe(batch=batch):
            for p, _ in batch:
                _mark(p, "maybe", target.id, env)

        outcome = _send(target, url, body, env, maybe_before=maybe_before, on_maybe=on_maybe,
                       key=gpuguard_render.digest_key(events))
        if outcome.kind in (_Outcome.SENT, _Outcome.MAYBE):
            for p, _ in batch:
                _mark(p, "done", target.id, env)
            tstate["sent"].append(now)
            tstate["failures"] = 0
            if outcome.kind == _Outcome.MAYBE:
                _log(env, "warn", f"{target.label()}: {outcome.detail}")
            elif tstate.get("reported"):
                _log(env, "info", f"{target.label()}: delivering again")
            tstate["reported"] = ""
            pending = pending[len(batch):]
            continue
        wait = outcome.retry_after or 0
        if outcome.kind == _Outcome.PERMANENT:
            wait = max(wait, _PERMANENT_RETRY_AFTER)
            detail = scrub(outcome.detail, env)
            if tstate.get("reported") != detail:
                _log(env, "error", f"{target.label()} rejected the alert: {detail}; {len(pending)} events stay queued, "
                    f"retried every {_PERMANENT_RETRY_AFTER:.0f} s until the target is fixed")
                tstate["reported"] = detail
        else:
            tstate["failures"] = tstate.get("failures", 0) + 1
            # the exponent is capped: a float overflows past 2**1023, and
            # the pause is capped at _MAX_RETRY_AFTER long before that
            wait = max(wait, _DOWN_BACKOFF * 2 ** min(tstate["failures"] - 1, 16))
            _log(env, "warn", f"{target.label()}: {outcome.detail}; {len(pending)} events stay queued "
                f"(next try in {min(wait, _MAX_RETRY_AFTER):.0f} s)")
        tstate["not_before"] = now + min(wait, _MAX_RETRY_AFTER if outcome.kind == _Outcome.RETRY
                                         else _PERMANENT_RETRY_AFTER)
        return


def _load_items(outbox, env):
    items = []
    names = _list_names(outbox)
    for path in _outbox_items(outbox):
        try:
            items.append((path, *_read_item(path, names)))
        except FileNotFoundError:
            continue
        except (OSError, ValueError) as e:
            _log(env, "error", f"unreadable outbox file {os.path.basename(path)} moved aside ({_one_line(e, env)})")
            try:
                os.replace(path, path + ".bad")
            except OSError:
                pass
    return items


def flush(env=None, now=None):
    """Delivers the outbox: one digest per target for everything waiting,
    each target on its own thread (a slow or dead one delays no other).
    Returns the number of events still queued."""
    env = os.environ if env is None else env
    state_dir = env.get("GPUGUARD_STATE_DIR") or ""
    if not state_dir:
        _log(env, "error", "GPUGUARD_STATE_DIR is not set: nothing to flush")
        return 0
    outbox = os.path.join(state_dir, "outbox")
    problem = _state_dir_problem(state_dir)
    if problem:
        _log(env, "error", problem)
        return len(_outbox_items(outbox))
    # a malformed target is left out (lib/config.sh said so once)
    bad = []
    targets = _targets_from_env(env, bad)
    for name, problem in bad:
        _log(env, "debug", f"{name} is malformed ({problem}): left out")
    lock = _FlushLock(state_dir)
    if not lock.acquire():
        if lock.error:
            _log(env, "error", lock.error + "; nothing sent")
        else:
            _log(env, "debug", f"another flush holds {lock.path}: it delivers these events")
        return len(_outbox_items(outbox))
    try:
        _enforce_bound(outbox, int(env.get("OUTBOX_MAX") or 1000), env)
        _remove_orphan_markers(outbox)
        state = _State(os.path.join(state_dir, "alert-state.json"), env)
        tstates = {t.id: state.target(t) for t in targets}
        seen = set()
        # events queued while a digest was on its way go out in the same
        # flush (a second pass), so a flush that found the lock taken
        # loses nothing by leaving
        for _ in range(3):
            items = _load_items(outbox, env)
            fresh = [it for it in items if it[0] not in seen]
            if not fresh:
                break
            seen.update(it[0] for it in items)
            _run_targets(targets, tstates, items, env, now)
            ids = {t.id for t in targets}
            names = _list_names(outbox)
            for path, _, _ in items:
                if ids and ids <= _markers(path, "done", names):
                    _remove_item(path, names)
            if not targets:
                break
        state.save()
        return len(_outbox_items(outbox))
    finally:
        lock.release()


def _run_targets(targets, tstates, items, env, now):
    def work(target):
        try:
            _deliver_target(target, tstates[target.id], items, env, time.time() if now is None else now)
        except Exception as e:  # noqa: BLE001 (one target's bug never stops the others)
            _log(env, "error", f"{target.label()}: {e.__class__.__name__}: {_one_line(e, env)}")

    threads = [(t, threading.Thread(target=work, args=(t,), daemon=True)) for t in targets]
    for _, thread in threads:
        thread.start()
    # every request is bounded by its timeout; name resolution is not, so
    # the flush as a whole is: a target still busy then is left behind (its
    # events stay queued) rather than holding up the watchdog's cycle
    deadline = time.time() + _FLUSH_DEADLINE
    for target, thread in threads:
        thread.join(max(0.0, deadline - time.time()))
        if thread.is_alive():
            _log(env, "warn", f"{target.label()}: still sending after {_FLUSH_DEADLINE:.0f} s; its events stay queued")


# ---------------------------------------------------------------- commands --

def _test_event(env):
    return {"ts": int(time.time()), "host": env.get("GPUGUARD_HOST") or os.uname().nodename,
            "event": "test", "state": "test"}


def test_alert(env=None):
    env = os.environ if env is None else env
    bad = []
    targets = _targets_from_env(env, bad)
    for name, problem in bad:
        print(scrub(f"{'FAIL':<8} {name}: malformed, {problem}", env))
    if not targets:
        if not bad:
            print("no target configured: set NOTIFY_URL or ALERTMANAGER_URL")
        return 2 if bad else 1
    event = _test_event(env)
    failed = 0
    for target in targets:
        try:
            if target.provider == "alertmanager":
                url, body = target.url + "/api/v2/alerts", [gpuguard_render.alertmanager_alert(event, target.lang, env=env)]
            else:
                url, body = _chat_request(target, [event], target.lang, None, env)
            outcome = _send(target, url, body, env)
        except Exception as e:  # noqa: BLE001 (one line per target, never a traceback)
            outcome = _Outcome(_Outcome.PERMANENT, _one_line(e, env))
        print(scrub(f"{outcome.kind:<8} {target.label()}: {outcome.detail}", env))
        failed += outcome.kind != _Outcome.SENT
    return 2 if bad else 1 if failed else 0


_URL_SHAPES = {
    "dingtalk": (r"^/robot/send$", "access_token", "https://oapi.dingtalk.com/robot/send?access_token=..."),
    "wecom": (r"^/cgi-bin/webhook/send$", "key", "https://qyapi.weixin.qq.com/cgi-bin/webhook/send?key=..."),
    "feishu": (r"^/open-apis/bot/v2/hook/[\w-]+$", None, "https://open.feishu.cn/open-apis/bot/v2/hook/..."),
    "slack": (r"^/services/[^/]+/[^/]+/[^/]+$", None, "https://hooks.slack.com/services/T.../B.../..."),
}


def _check_target(target, env, timeout=2.0):
    """(level, detail) for one target, sending nothing: URL shape, name
    resolution and a TCP connect, each bounded by the timeout."""
    parts = urllib.parse.urlsplit(target.url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "FAIL", "not an http(s) URL"
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return "FAIL", "bad port in the URL"
    notes = []
    shape = _URL_SHAPES.get(target.provider)
    if shape and _PROVIDER_HOSTS.get(parts.hostname.lower()) == target.provider:
        path_re, query_key, example = shape
        query = dict(urllib.parse.parse_qsl(parts.query))
        if not re.match(path_re, parts.path) or (query_key and not query.get(query_key)):
            return "FAIL", f"URL does not look like a {target.provider} webhook ({example})"
        if parts.scheme != "https":
            notes.append("plain http to a public webhook")
    if target.provider == "dingtalk" and target.secret and not target.secret.startswith("SEC"):
        notes.append("a DingTalk signing secret starts with SEC")
    result = {}

    def resolve():
        try:
            result["addrs"] = socket.getaddrinfo(parts.hostname, port, type=socket.SOCK_STREAM)
        except (OSError, UnicodeError) as e:
            result["error"] = getattr(e, "strerror", None) or _one_line(e, env)

    t = threading.Thread(target=resolve, daemon=True)
    t.start()
    t.join(timeout)
    if t.is_alive():
        return "FAIL", f"name {parts.hostname} does not resolve within {timeout:g} s"
    if "error" in result:
        return "FAIL", "name {} does not resolve: {}".format(parts.hostname, result["error"])
    family, socktype, proto, _, addr = result["addrs"][0]
    start = time.time()
    try:
        with socket.socket(family, socktype, proto) as s:
            s.settimeout(timeout)
            s.connect(addr)
    except OSError as e:
        return "FAIL", f"TCP connect to {parts.hostname} port {port}: {e.strerror or _one_line(e, env)}"
    ms = (time.time() - start) * 1000
    detail = f"reachable (TCP {ms:.0f} ms), language {target.lang}; nothing sent (gpuguard notify --test sends one)"
    if notes:
        return "WARN", "; ".join(notes) + "; " + detail
    return "OK", detail


def check_targets(env=None):
    env = os.environ if env is None else env
    bad = []
    targets = _targets_from_env(env, bad)
    rest = "the other targets still get alerts" if targets else "no target is left to get alerts"
    for name, problem in bad:
        print(scrub(f"FAIL\t{name}\tmalformed: {problem}; {rest}", env))
    failed = 0
    for target in targets:
        try:
            level, detail = _check_target(target, env, min(2.0, float(env.get("NOTIFY_TIMEOUT") or 2)))
        except Exception as e:  # noqa: BLE001 (one line per target, never a traceback)
            level, detail = "FAIL", _one_line(e, env)
        failed += level == "FAIL"
        print(scrub(f"{level}\t{target.label()}\t{detail}", env))
    # a malformed target is a configuration error: exit status 2
    return 2 if bad else 1 if failed else 0


class _SourceError(ValueError):
    """What `notify --preview` was given cannot be read or holds no event:
    one line naming it, exit 2."""


def _recorded_events(source, env):
    """Events to preview: a file or stdin ("-"), one JSON object a line, or
    the last event of events.jsonl; and the numbers of the lines of a file
    or stdin that are not one, skipped."""
    if not source:
        return [_last_recorded_event(env)], []
    if source == "-":
        raw = sys.stdin.buffer.read()
    else:
        try:
            # the user's own file, read as cat reads it: a link (or a
            # process substitution's /dev/fd/N) is followed
            with open(source, "rb") as f:
                raw = f.read(64 << 20)
        except IsADirectoryError:
            raise _SourceError(f"cannot read '{source}': it is a folder") from None
        except OSError as e:
            raise _SourceError(f"cannot read '{source}': {e.strerror or e}") from None
    events, bad = [], []
    for n, line in enumerate(raw.splitlines(), 1):
        if line.strip():
            event = _event_or_none(line)
            if event is None:
                bad.append(n)
            else:
                events.append(event)
    if not events:
        raise _SourceError(f"'{source}' holds no JSON event" + (f" (line {bad[0]})" if bad else ""))
    return events, bad


def _event_or_none(line):
    """_parse_event of one line; None when it is not an event (deep nesting
    too: json raises RecursionError there, not ValueError)."""
    try:
        return _parse_event(line)
    except (ValueError, RecursionError):
        return None


def _last_recorded_event(env):
    """The last line of events.jsonl that is an event: a crash can leave
    the last one cut (or padded with NULs), which had failed the preview."""
    path = os.path.join(env.get("GPUGUARD_STATE_DIR") or ".", "events.jsonl")
    limit = 64 << 20
    try:
        fd = _open_nofollow(path, os.O_RDONLY)
        with os.fdopen(fd, "rb") as f:
            size = os.fstat(fd).st_size
            f.seek(max(0, size - limit))
            lines = f.read(limit).splitlines()
    except OSError as e:
        raise _SourceError(f"no recorded event: {path}: {e.strerror or e}") from None
    if size > limit:
        lines = lines[1:]           # the first line read is a part of one
    for line in reversed(lines):
        event = _event_or_none(line) if line.strip() else None
        if event is not None:
            return event
    raise _SourceError(f"no recorded event: {path} holds no JSON event")


def preview(source, env=None):
    """Prints what each provider would receive, sending nothing."""
    env = os.environ if env is None else env
    events, bad = _recorded_events(source, env)
    if bad:
        print(f"gpuguard: notify --preview: skipped {len(bad)} line(s) of '{source}' that are not JSON events"
              f" (first: line {bad[0]})", file=sys.stderr)
    configured = {}
    for t in _targets_from_env(env):
        configured.setdefault(t.provider, t)
    for provider in _PROVIDERS + ("alertmanager",):
        target = configured.get(provider) or _Target("http://preview.invalid/", provider, "",
                                                    gpuguard_render.language(env))
        print("===== {} ({}){} =====".format(provider, target.lang, "" if provider in configured else " [not configured]"))
        if provider == "alertmanager":
            # one POST of alerts: labels, times and summary a line each
            for a in (a for e in events for a in gpuguard_render.alertmanager_alerts(e, target.lang, env=env)):
                print(json.dumps({"labels": a["labels"], "startsAt": a["startsAt"], "endsAt": a["endsAt"],
                                  "summary": a["annotations"]["summary"]}, ensure_ascii=False))
            print()
            continue
        _, body = _chat_request(target, events, target.lang, None, env)
        text = {"dingtalk": lambda b: b["markdown"]["text"], "feishu": lambda b: b["content"]["text"],
                "wecom": lambda b: b["markdown"]["content"], "slack": lambda b: b["text"],
                "generic": lambda b: b["message"]}[provider](body)
        print(text)
        print()
    return 0


def main(argv):
    cmd = argv[1] if len(argv) > 1 else ""
    # the configuration of this run: gg_python gave the helper exactly the
    # keys it reads (ARCHITECTURE.md, rule 2)
    env = os.environ
    try:
        if cmd == "flush":
            flush(env)
            return 0
        if cmd == "test":
            return test_alert(env)
        if cmd == "check":
            return check_targets(env)
        if cmd == "preview":
            try:
                return preview(argv[2] if len(argv) > 2 else "", env)
            except _SourceError as e:
                # worded as the bash side's check for a missing file
                print(f"gpuguard: notify --preview: {_one_line(e, env)}", file=sys.stderr)
                return 2
        if cmd == "render":
            events, _ = _recorded_events("-", env)
            title, sections = gpuguard_render.render_digest(events, gpuguard_render.language(env) or "en", env)
            print(gpuguard_render.plain_text(title, sections))
            return 0
    except (ValueError, OSError) as e:
        print(f"gpuguard_alert: {_one_line(e, env)}", file=sys.stderr)
        return 2
    except Exception as e:  # noqa: BLE001 (a bug: one line, never a traceback)
        _log(env, "error", f"{os.path.basename(argv[0])} {cmd}: {e.__class__.__name__}: {_one_line(e, env)}")
        return 1
    print("usage: gpuguard_alert.py flush|test|check|preview [FILE|-]|render", file=sys.stderr)
    return 2


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv))
    except KeyboardInterrupt:
        # Ctrl-C: one line and 130 (128 + SIGINT, as a shell reports it),
        # never a 30-line traceback
        print("gpuguard: interrupted", file=sys.stderr)
        sys.exit(130)
