"""gpuguard's alert module: every event leaves through here.

Commands:
  flush          deliver what waits in $GPUGUARD_STATE_DIR/outbox: one digest
                 per target, then record each delivery
  test           send a test message to every target and print one line each
  check          check every target without sending anything (URL shape,
                 DNS, TCP connect): one tab-separated line per target
  preview [FILE] print each provider's message for recorded events (FILE,
                 "-" for stdin, default the last line of events.jsonl)
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
import math
import os
import random
import re
import socket
import sys
import threading
import time
import urllib.parse

import gpuguard_ledger
import gpuguard_messages_en
import gpuguard_messages_zh
from gpuguard_files import write_atomic

TABLES = {"en": gpuguard_messages_en.MESSAGES, "zh": gpuguard_messages_zh.MESSAGES}
# The same tables for Ascend NPUs (an event with "vendor": "ascend"): they
# say NPU and npu-smi where the others say GPU and nvidia-smi.
NPU_TABLES = {"en": gpuguard_messages_en.NPU_MESSAGES, "zh": gpuguard_messages_zh.NPU_MESSAGES}
PROVIDER_HOSTS = {
    "oapi.dingtalk.com": "dingtalk",
    "open.feishu.cn": "feishu",
    "open.larksuite.com": "feishu",
    "qyapi.weixin.qq.com": "wecom",
    "hooks.slack.com": "slack",
}
PROVIDERS = ("dingtalk", "feishu", "wecom", "slack", "generic")
# The language a target gets unless NOTIFY_LANG or its own prefix says
# otherwise: the Chinese platforms get Chinese, whatever LANG the daemon has.
PROVIDER_LANG = {"dingtalk": "zh", "feishu": "zh", "wecom": "zh", "slack": "en",
                 "generic": "en", "alertmanager": "en"}
# Messages per minute each provider accepts from one robot / webhook.
PROVIDER_RATE = {"dingtalk": 20, "wecom": 20, "feishu": 100, "slack": 60,
                 "generic": 600, "alertmanager": 600}
# Body size limits, in UTF-8 bytes, with a margin for the JSON envelope.
PROVIDER_TEXT_BYTES = {"dingtalk": 18000, "wecom": 3900, "feishu": 18000,
                       "slack": 35000, "generic": 1 << 20}
# Business error codes: retry later (rate limited) versus permanent.
RETRY_CODES = {"dingtalk": {130101}, "wecom": {45009}, "feishu": {11232}}
PERMANENT_RETRY_AFTER = 600.0
MAX_RETRY_AFTER = 300.0
# After a cycle's retries are spent on a target that is down, later cycles
# wait 30 s, 60 s, 120 s ... (at most MAX_RETRY_AFTER) before trying it again,
# so a dead receiver does not eat every watchdog cycle.
DOWN_BACKOFF = 30.0
# A receiver that got the request but did not answer in time is tried once
# more with this many times the timeout (issue 13: <= 2 deliveries).
MAYBE_TIMEOUT_FACTOR = 3
# The longest one flush waits for its targets (s).
FLUSH_DEADLINE = 240.0
# Groups shown in one digest; the rest are counted in a last line.
DIGEST_MAX_GROUPS = 40
SECRET_QUERY_KEYS = ("access_token", "key", "token", "sign", "secret")
LOG_RANK = {"debug": 0, "info": 1, "warn": 2, "error": 3}
# The environment in force: os.environ when run as a command; flush() and
# test_alert() take another one (tests), which logging and scrubbing follow.
ENV = os.environ
LOG_LOCK = threading.Lock()


# ---------------------------------------------------------------- logging --

def log(level, msg):
    """One log line in the format the bash side writes, filtered by
    GPUGUARD_LOG_LEVEL and copied to syslog when GPUGUARD_SYSLOG=1."""
    minimum = LOG_RANK.get(ENV.get("GPUGUARD_LOG_LEVEL") or "info", 1)
    if LOG_RANK.get(level, 1) < minimum:
        return
    text = scrub(msg).replace("\n", " ")
    line = f"{time.strftime('%Y-%m-%d %H:%M:%S')} {level.upper():<5} alert: {text}\n"
    path = ENV.get("GPUGUARD_LOG")
    with LOG_LOCK:
        written = False
        if path:
            try:
                # never through a link planted at the log's path (as gg_append)
                fd = open_nofollow(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
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
        if ENV.get("GPUGUARD_SYSLOG") == "1":
            try:
                import syslog
                prio = {"debug": syslog.LOG_DEBUG, "info": syslog.LOG_INFO,
                        "warn": syslog.LOG_WARNING, "error": syslog.LOG_ERR}[level]
                syslog.openlog("gpuguard/alert", 0, syslog.LOG_USER)
                syslog.syslog(prio, text)
            except (ImportError, OSError, KeyError):
                pass


def secrets():
    """Every secret string known from the environment, longest first."""
    found = set()
    for s in re.split(r"[\s,;]+", ENV.get("NOTIFY_SECRET", "")):
        if len(s) >= 4:
            found.add(s)
    for url in split_urls(ENV.get("NOTIFY_URL", "")) + \
            split_urls(ENV.get("ALERTMANAGER_URL", "")):
        try:
            parts = urllib.parse.urlsplit(strip_prefix(url)[1])
        except ValueError:
            # a malformed target: mask every long piece of its user, path
            # and query (all of it when it has no scheme://host to show)
            m = re.match(r"[^:/?#]*://([^/?#]*)(.*)", url, re.DOTALL)
            rest = (m.group(1).rpartition("@")[0] + "/" + m.group(2)) if m else url
            found.update(p for p in re.split(r"[/?&=#@:;\[\]]+", rest) if len(p) >= 4)
            if not m and len(url) >= 4:
                found.add(url)
            continue
        for key, value in urllib.parse.parse_qsl(parts.query):
            if key.lower() in SECRET_QUERY_KEYS and len(value) >= 4:
                found.add(value)
        for seg in parts.path.split("/"):
            if len(seg) >= 16:
                found.add(seg)
        if parts.password:
            found.add(parts.password)
    return sorted(found, key=len, reverse=True)


def scrub(text):
    """Masks every known secret, and any token-looking query value."""
    text = str(text)
    for s in secrets():
        text = text.replace(s, "***")
        text = text.replace(urllib.parse.quote(s, safe=""), "***")
    return re.sub(r"((?:{})=)[^&\s\"']+".format("|".join(SECRET_QUERY_KEYS)),
                  r"\1***", text)


def mask_url(url):
    """A URL fit for a log line: scheme, host and a masked path."""
    parts = urllib.parse.urlsplit(url)
    return "{}://{}/***".format(parts.scheme, parts.hostname or "?")


def one_line(exc):
    """An exception as one short line (never a traceback)."""
    text = str(exc) or exc.__class__.__name__
    return scrub(text.replace("\n", " "))[:200]


# ------------------------------------------------------------------ files --

def open_nofollow(path, flags, mode=0o600):
    return os.open(path, flags | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), mode)


def read_bytes(path, limit=1 << 20):
    """Reads a file without following a symlink planted at its path."""
    fd = open_nofollow(path, os.O_RDONLY)
    with os.fdopen(fd, "rb") as f:
        return f.read(limit)


def touch_marker(path):
    """Creates an empty marker file: no data block, so it works on a full
    disk; O_EXCL|O_NOFOLLOW: never through a planted link."""
    try:
        fd = open_nofollow(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    except FileExistsError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    os.close(fd)


def write_failed(state_dir, what, e):
    """Logs a failed write once for a whole outage, shared with the bash
    writers (gg_write_failed): the first to create the empty disk-full
    marker in the state folder says it; the others stay quiet."""
    marker = os.path.join(state_dir, "disk-full")
    try:
        fd = open_nofollow(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        os.close(fd)
    except FileExistsError:
        return
    except OSError:
        pass
    log("error", f"cannot write {what} ({e.strerror or e}; disk full?): previous files are kept, new events "
        "wait, retried every cycle; one line for the whole outage")


def write_ok(state_dir):
    """Ends an outage that write_failed (or a bash writer) started."""
    marker = os.path.join(state_dir, "disk-full")
    try:
        if not os.path.islink(marker):
            os.unlink(marker)
            log("info", f"writing to {state_dir} works again")
    except OSError:
        pass


def state_dir_problem(folder):
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


class FlushLock:
    """One flush at a time per state folder (daemon, cron and a manual run
    may overlap): a non-blocking flock on state/flush.lock."""

    def __init__(self, folder):
        self.path = os.path.join(folder, "flush.lock")
        self.fd = None
        self.error = ""

    def acquire(self):
        try:
            self.fd = open_nofollow(self.path, os.O_RDWR | os.O_CREAT)
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

def split_urls(value):
    # ASCII separators only, as lib/config.sh splits: a full-width space
    # stays in its URL and makes that one target malformed
    return [u for u in re.split(r"[ \t\n\r\f\v,;]+", value or "") if u]


URL_MAX = 2048
_AUTHORITY = re.compile(r"(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+)(?::([0-9]{1,5}))?")


def url_problem(url):
    """Why one target URL (its prefix removed) cannot be used, or "". The
    same rule as config_url_problem in lib/config.sh, which warns when the
    configuration is read (tests/test_config_cli.py runs both on one list)."""
    if len(url) > URL_MAX:
        return f"longer than {URL_MAX} characters"
    if re.search(r"[^!-~]", url):
        return "has a space, control or non-ASCII character (a domain goes in its xn-- form)"
    m = re.match(r"https?://([^/?#]*)", url)
    if not m:
        return "not an http:// or https:// URL"
    host = _AUTHORITY.fullmatch(m.group(1).rsplit("@", 1)[-1])
    if not host:
        return "bad host or port (an IPv6 address goes in [brackets])"
    if host.group(1) and not 1 <= int(host.group(1)) <= 65535:
        return "port out of range 1..65535"
    return ""


def target_name(key, index, url):
    """A malformed target as a log line may show it: the key, its place in
    the list and scheme://host without user, path or query (tokens)."""
    m = re.match(r"([a-z]{1,10})://([^/?#]*)", url)
    if not m:
        return f"{key} #{index}"
    host = re.sub(r"[^!-~]", "?", m.group(2).rsplit("@", 1)[-1])[:60]
    return f"{key} #{index} ({m.group(1)}://{host}/***)"


def strip_prefix(raw):
    """("provider:lang" prefix or "", URL) of one NOTIFY_URL entry."""
    head = raw.split("://", 1)[0]
    if "+" in head:
        prefix, url = raw.split("+", 1)
        return prefix, url
    return "", raw


class Target:
    def __init__(self, url, provider, secret, lang=None):
        self.url = url
        self.provider = provider
        self.secret = secret
        self.lang = lang or PROVIDER_LANG.get(provider, "en")
        self.id = hashlib.sha256(url.encode()).hexdigest()[:12]

    def label(self):
        return f"{self.provider} {mask_url(self.url)}"


def targets_from_env(env=None, bad=None):
    """The targets of NOTIFY_URL and ALERTMANAGER_URL. A malformed one is
    left out, so it never blocks the others; (name, problem) goes to the
    list `bad` when one is given."""
    env = os.environ if env is None else env
    bad = [] if bad is None else bad
    urls = split_urls(env.get("NOTIFY_URL", ""))
    sec = [s for s in re.split(r"[\s,;]+", env.get("NOTIFY_SECRET", "")) if s]
    default_type = env.get("NOTIFY_TYPE", "") or None
    global_lang = env.get("NOTIFY_LANG", "") if env.get("NOTIFY_LANG", "") in TABLES else None
    out = []

    def parse(raw, allowed):
        prefix, url = strip_prefix(raw)
        provider = lang = None
        for part in [p for p in prefix.split(":") if p]:
            if part in TABLES:
                lang = part
            elif part in allowed:
                provider = part
            else:
                raise ValueError(f"unknown provider or language '{part[:20]}' in its prefix")
        problem = url_problem(url)
        if problem:
            raise ValueError(problem)
        return url, provider, lang

    for i, raw in enumerate(urls):
        try:
            url, provider, lang = parse(raw, PROVIDERS)
            host = (urllib.parse.urlsplit(url).hostname or "").lower()
        except ValueError as e:
            bad.append((target_name("NOTIFY_URL", i + 1, strip_prefix(raw)[1]), one_line(e)))
            continue
        provider = provider or PROVIDER_HOSTS.get(host) or default_type or "generic"
        secret = sec[i] if len(sec) == len(urls) else (sec[0] if len(sec) == 1 else "")
        out.append(Target(url, provider, secret, lang or global_lang))
    for i, raw in enumerate(split_urls(env.get("ALERTMANAGER_URL", ""))):
        try:
            url, _, lang = parse(raw, ())
        except ValueError as e:
            bad.append((target_name("ALERTMANAGER_URL", i + 1, strip_prefix(raw)[1]), one_line(e)))
            continue
        out.append(Target(url.rstrip("/"), "alertmanager", "", lang))
    return out


# ---------------------------------------------------------------- signing --

def dingtalk_sign(secret, ts_ms):
    """DingTalk 加签: HMAC-SHA256 keyed by the secret over "ts\\nsecret",
    base64, URL-encoded once."""
    digest = hmac.new(secret.encode("utf-8"),
                      (f"{ts_ms}\n{secret}").encode(),
                      hashlib.sha256).digest()
    return urllib.parse.quote_plus(base64.b64encode(digest))


def feishu_sign(secret, ts_s):
    """Feishu: HMAC-SHA256 keyed by "ts\\nsecret" over the empty message,
    base64, not URL-encoded (it goes in the JSON body)."""
    digest = hmac.new((f"{ts_s}\n{secret}").encode(), b"",
                      hashlib.sha256).digest()
    return base64.b64encode(digest).decode("ascii")


# --------------------------------------------------------------- messages --

def language(env=None):
    """The language for every target when NOTIFY_LANG says one, else None
    (each target then speaks its provider's default). LANG is not read: a
    daemon under LANG=C still writes Chinese to a DingTalk group."""
    env = os.environ if env is None else env
    lang = env.get("NOTIFY_LANG", "")
    return lang if lang in TABLES else None


def msg(lang, key, **fields):
    if lang.endswith("-npu"):
        return NPU_TABLES[lang[:-4]][key].format(**fields)
    return TABLES[lang][key].format(**fields)


def duration(seconds, lang):
    try:
        seconds = max(0, int(float(seconds or 0)))
    except (TypeError, ValueError):
        return msg(lang, "unknown")
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    if h:
        return msg(lang, "dur_hm", h=h, m=m)
    if m:
        return msg(lang, "dur_m", m=m)
    return msg(lang, "dur_s", s=s)


def defuse(text):
    """Makes untrusted text (process names, command lines) unable to mention
    anyone on any platform: @all, <at ...>, <@id>, <!channel>, @everyone."""
    text = str(text)
    text = text.replace("@", "\uff20")          # fullwidth at sign
    text = text.replace("<", "\u2039").replace(">", "\u203a")
    return text


SECRET_ARG = re.compile(
    r"(?i)(--?(?:[\w-]*(?:token|secret|password|passwd|api[-_]?key|apikey|credential)s?)[= ])(\S+)")
SECRET_ASSIGN = re.compile(r"(?i)\b([\w.-]*(?:token|secret|password|passwd|api[-_]?key|apikey)s?=)([^\s&]+)")
URL_CREDS = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/\s:@]+:[^/\s@]+@")


def mask_cmdline(cmd, limit=160):
    """The command line as it may be shown: secrets masked (the job info
    should be masked already; this holds for events that are not), cut."""
    cmd = str(cmd)
    cmd = SECRET_ARG.sub(r"\1***", cmd)
    cmd = SECRET_ASSIGN.sub(r"\1***", cmd)
    cmd = URL_CREDS.sub(r"\1***@", cmd)
    cmd = scrub(cmd)
    if len(cmd) > limit:
        cmd = cmd[:limit - 1] + "…"
    return defuse(cmd)


def gib(mib, lang):
    try:
        return msg(lang, "gib", v=float(mib) / 1024)
    except (TypeError, ValueError):
        return msg(lang, "unknown")


def as_int(value):
    try:
        return int(float(value))
    except (TypeError, ValueError):
        return None


def ranges(numbers):
    """"0-3,5,7" for [0, 1, 2, 3, 5, 7]; "?" for unknown indices."""
    converted = [as_int(x) for x in numbers]
    known = sorted({n for n in converted if n is not None})
    out = []
    for n in known:
        if out and out[-1][1] == n - 1:
            out[-1][1] = n
        else:
            out.append([n, n])
    text = ",".join(str(a) if a == b else f"{a}-{b}" for a, b in out)
    if None in converted:
        text = (text + ",?") if text else "?"
    return text


def span(values, unit=""):
    """"6%" or "0-6%" over a group's values; None when none is known."""
    nums = [float(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
    if not nums:
        return None
    lo, hi = min(nums), max(nums)
    fmt = (lambda x: str(int(x))) if all(n == int(n) for n in nums) else (lambda x: f"{x:.0f}")
    return (fmt(lo) if lo == hi else f"{fmt(lo)}-{fmt(hi)}") + unit


def jobs_of(event):
    """The holding jobs of an event (ARCHITECTURE.md, rule 5: a "job" object or a list of them)."""
    j = event.get("jobs")
    if j is None:
        j = event.get("job")
    if isinstance(j, dict):
        j = [j]
    return [x for x in j if isinstance(x, dict)] if isinstance(j, list) else []


def procs_of(event):
    p = event.get("processes")
    return [x for x in p if isinstance(x, dict)] if isinstance(p, list) else []


def proc_name(p):
    return os.path.basename(str(p.get("name") or "?")) or "?"


RANK_ARG = re.compile(r"\s--local[-_]rank[= ]\d+")


def job_key(event):
    """What "the same job" means when grouping GPUs into one digest line:
    the Slurm job, else the container, else user + command + folder (the
    ranks of one torchrun), else the process names."""
    jobs = jobs_of(event)
    if jobs:
        j = jobs[0]
        for key in ("slurm_job", "container"):
            if j.get(key):
                return (key, str(j[key]))
        # ranks launched by the older torch.distributed.launch differ only
        # in --local_rank=N: still one job
        cmd = RANK_ARG.sub("", str(j.get("cmdline")))
        return ("job", str(j.get("user")), cmd, str(j.get("cwd")))
    procs = procs_of(event)
    if procs:
        return ("procs",) + tuple(sorted({proc_name(p) for p in procs}))
    return ("none",)


def job_label(events, lang):
    """A short name for the job holding a group's GPUs."""
    jobs = [j for e in events for j in jobs_of(e)]
    if jobs:
        j = jobs[0]
        if j.get("slurm_job"):
            return msg(lang, "job_slurm", id=defuse(j["slurm_job"]))
        if j.get("container"):
            return msg(lang, "job_container", id=defuse(j["container"]))
        if j.get("cmdline"):
            return msg(lang, "job_cmd", cmd=mask_cmdline(j["cmdline"], 60))
        if j.get("pid") is not None:
            return msg(lang, "job_pid", pid=defuse(j["pid"]))
    procs = [p for e in events for p in procs_of(e)]
    if procs:
        names = sorted({defuse(proc_name(p))[:48] for p in procs})
        pids = ranges([p.get("pid") for p in procs])
        return "{} ({})".format(", ".join(names[:3]), msg(lang, "job_pids", pids=pids))
    return msg(lang, "job_unknown")


def when(ts):
    try:
        return time.strftime("%Y-%m-%d %H:%M", time.localtime(float(ts)))
    except (TypeError, ValueError, OverflowError, OSError):
        return None


def job_lines(events, lang):
    """Who and what: user, PIDs, start and elapsed, command, folder."""
    jobs = [j for e in events for j in jobs_of(e)]
    procs = [p for e in events for p in procs_of(e)]
    first = jobs[0] if jobs else {}
    parts = []
    users = sorted({str(j["user"]) for j in jobs if j.get("user")})
    if users:
        parts.append(msg(lang, "job_user", user=defuse(", ".join(users))))
    pids = []
    for j in jobs:
        pids += [p for p in (j.get("pids") or []) if as_int(p) is not None] if isinstance(j.get("pids"), list) else []
        if as_int(j.get("pid")) is not None:
            pids.append(j.get("pid"))
    if pids:
        parts.append(msg(lang, "job_pids", pids=ranges(pids)))
    ranks = sorted({as_int(j.get("rank")) for j in jobs if as_int(j.get("rank")) is not None})
    if ranks:
        parts.append(msg(lang, "job_rank", rank=ranges(ranks)))
    start = when(first.get("start_ts")) if first.get("start_ts") is not None else None
    if start:
        elapsed = first.get("elapsed_s")
        parts.append(msg(lang, "job_started", start=start,
                         elapsed=duration(elapsed, lang) if elapsed is not None else msg(lang, "unknown")))
    lines = [" · ".join(parts)] if parts else []
    more = []
    if first.get("cmdline"):
        more.append(msg(lang, "job_cmdline", cmd=mask_cmdline(first["cmdline"])))
    if first.get("cwd"):
        more.append(msg(lang, "job_cwd", cwd=defuse(mask_cmdline(first["cwd"], 100))))
    if more:
        lines.append(" · ".join(more))
    # the processes nvidia-smi listed, with name and memory, unless a job
    # read from /proc names what runs (a job with only a PID, "visible":
    # false in a container or after the process went, tells less than them)
    if procs and not any(j.get("cmdline") for j in jobs):
        items = ["{} {} ({} MiB)".format(p.get("pid"), defuse(proc_name(p))[:48], p.get("used_memory_mib"))
                 for p in procs[:10]]
        if len(procs) > 10:
            items.append(msg(lang, "more", n=len(procs) - 10))
        lines.append(msg(lang, "procs", procs=", ".join(items)))
    return lines


def parse_price(value):
    """(number, currency) from "30", "¥30", "2.5 USD"; None when unset/bad."""
    text = str(value or "").strip()
    m = re.match(r"^([^\d.\s]*)\s*(\d+(?:\.\d+)?)\s*([^\d\s]*)$", text)
    if not text or not m:
        return None
    price = float(m.group(2))
    if price <= 0 or price > 1e6:
        return None
    return price, (m.group(1) or m.group(3) or "")


def money(amount, currency, lang):
    currency = currency or msg(lang, "currency")
    number = f"{amount:.0f}" if amount >= 100 else f"{amount:.2f}"
    if not currency:
        return number
    return (f"{currency} {number}") if not currency.isalpha() else (f"{number} {currency}")


def idle_group_lines(events, lang, env, digest):
    """The lines for GPUs of one job going idle (firing/reminder)."""
    gpus = ranges([e.get("gpu") for e in events])
    idle_s = max((as_int(e.get("idle_seconds")) or 0) for e in events)
    lines = [msg(lang, "idle_head", gpus=gpus, model=gpu_model(events), idle=duration(idle_s, lang),
                 job=job_label(events, lang))]
    reasons = {str(e.get("reason")) for e in events}
    if reasons & {"spin", "spinning", "stuck"}:
        lines.append(msg(lang, "idle_spin"))
    elif "power" in reasons:
        lines.append(msg(lang, "idle_power"))
    lines += job_lines(events, lang)
    unknown = msg(lang, "unknown")
    memory = memory_held(events, lang)
    threshold = span([e.get("threshold") for e in events]) or unknown
    lines.append(msg(lang, "idle_values", util=span([e.get("utilization") for e in events], "%") or unknown,
                     threshold=threshold, power=span([e.get("power_draw_w") for e in events], " W") or unknown,
                     memory=memory))
    lines += uuid_lines(events, lang)
    lines += cost_lines(events, lang, env)
    lines.append(msg(lang, "idle_hint", pid=first_pid(events)))
    return lines


def cost_lines(events, lang, env):
    """What the idle (or stuck) time of a group has cost so far, when a
    GPU-hour price is set; the event's currency (GPU_PRICE_CURRENCY) is
    used when the price itself names none."""
    price = parse_price(next((e.get("gpu_hour_price") for e in events if e.get("gpu_hour_price")), None)
                        or env.get("GPU_HOUR_PRICE"))
    if not price:
        return []
    currency = price[1] or next((defuse(e["currency"])[:8] for e in events
                                 if isinstance(e.get("currency"), str) and e["currency"]), "")
    gpu_hours = sum((as_int(e.get("idle_seconds")) or 0) for e in events) / 3600.0
    return [msg(lang, "idle_cost", cost=money(gpu_hours * price[0], currency, lang),
                gpu_hours=f"{gpu_hours:.1f}", price=money(price[0], currency, lang))]


def first_pid(events):
    """A PID of the group's job for the hints ("PID" when none is known)."""
    pids = [p.get("pid") for e in events for p in procs_of(e)] + \
        [j.get("pid") for e in events for j in jobs_of(e)]
    return next((p for p in pids if as_int(p) is not None), "PID")


def gpu_model(events):
    names = sorted({str(e["gpu_name"]) for e in events if e.get("gpu_name")})
    return " ({})".format(defuse(", ".join(names))) if names else ""


def uuid_lines(events, lang):
    uuids = [str(e["uuid"]) for e in events if e.get("uuid")]
    if not uuids:
        return []
    shown = uuids if len(uuids) <= 2 else [u[:12] + "…" for u in uuids]
    return [msg(lang, "idle_uuids", uuids=defuse(", ".join(shown)))]


def memory_held(events, lang):
    used = [e.get("memory_used_mib") for e in events]
    if all(isinstance(u, (int, float)) for u in used) and len(set(used)) == 1 and len(used) > 1:
        return msg(lang, "mem_each", n=len(used), each=gib(used[0], lang))
    if any(isinstance(u, (int, float)) for u in used):
        return gib(sum(u for u in used if isinstance(u, (int, float))), lang)
    return msg(lang, "unknown")


def number(value):
    """A finite number from an event field, else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return value if math.isfinite(value) else None


def stuck_group_lines(events, lang, env):
    """The lines for GPUs of one job stuck spinning (firing/reminder):
    busy at the idle floor's power, for how long, who, the cost, a hint."""
    unknown = msg(lang, "unknown")
    pcts = []
    for e in events:
        power, limit = number(e.get("power_draw_w")), number(e.get("power_limit_w"))
        if power is not None and limit:
            pcts.append(round(power * 100.0 / limit))
    cycles = span([e.get("spin_cycles") for e in events]) or span([e.get("idle_cycles") for e in events])
    lines = [msg(lang, "stuck_head", gpus=ranges([e.get("gpu") for e in events]), model=gpu_model(events),
                 util=span([e.get("utilization") for e in events], " %") or unknown,
                 power=span([e.get("power_draw_w") for e in events], " W") or unknown,
                 pct=span(pcts, " %") or unknown,
                 limit=span([e.get("power_limit_w") for e in events], " W") or unknown,
                 cycles=cycles or unknown),
             msg(lang, "stuck_held", job=job_label(events, lang),
                 idle=duration(max((as_int(e.get("idle_seconds")) or 0) for e in events), lang))]
    lines += job_lines(events, lang)
    lines.append(msg(lang, "stuck_values", memory=memory_held(events, lang),
                     threshold=span([e.get("idle_power_pct") for e in events]) or unknown))
    lines += uuid_lines(events, lang)
    lines += cost_lines(events, lang, env)
    lines.append(msg(lang, "stuck_hint", pid=first_pid(events)))
    return lines


def stuck_resolved_lines(events, lang):
    reason = str(events[0].get("reason") or "")
    key = {"busy": "stuck_busy", "released": "stuck_released"}.get(reason, "stuck_resolved_other")
    return [msg(lang, key, gpus=ranges([e.get("gpu") for e in events]),
                idle=duration(max((as_int(e.get("idle_seconds")) or 0) for e in events), lang),
                job=job_label(events, lang), reason=defuse(reason),
                power=span([e.get("power_draw_w") for e in events], " W") or msg(lang, "unknown"))]


def degraded_lines(events, lang):
    """A GPU whose line nvidia-smi prints as a device fault: which GPU
    (index, model, UUID), which fault, what to check."""
    gpus = ranges([e.get("gpu") for e in events])
    cycles = span([e.get("faulted_cycles") for e in events]) or msg(lang, "unknown")
    if state_class(events[0]) == "resolved":
        key = "degraded_gone" if events[0].get("reason") == "gone" else "degraded_resolved"
        return [msg(lang, key, gpus=gpus, model=gpu_model(events), cycles=cycles)] + uuid_lines(events, lang)
    index = next((str(as_int(e.get("gpu"))) for e in events if as_int(e.get("gpu")) is not None), "N")
    lines = [msg(lang, "degraded_head", gpus=gpus, model=gpu_model(events), fault=fault_text(events, lang),
                 cycles=cycles)]
    lines += uuid_lines(events, lang)
    lines.append(msg(lang, "degraded_hint", index=index if len(events) == 1 else gpus))
    return lines


def fault_text(events, lang):
    faults = sorted({str(e["fault"]) for e in events if e.get("fault")})
    return defuse(", ".join(faults))[:120] if faults else msg(lang, "unknown")


def idle_resolved_lines(events, lang):
    gpus = ranges([e.get("gpu") for e in events])
    idle = duration(max((as_int(e.get("idle_seconds")) or 0) for e in events), lang)
    job = job_label(events, lang)
    reason = str(events[0].get("reason") or "")
    util = span([e.get("utilization") for e in events], "%") or msg(lang, "unknown")
    key = {"busy": "idle_busy", "released": "idle_released", "gone": "idle_gone"}.get(reason, "idle_resolved_other")
    return [msg(lang, key, gpus=gpus, idle=idle, job=job, util=util, reason=defuse(reason))]


def state_class(event):
    s = event.get("state", "firing")
    return "firing" if s in ("firing", "reminder") else s


def group_events(events):
    """Groups a flush's events for one digest: per host, kind, state and job
    (idle: the GPUs of one job together), in order of first appearance."""
    groups = {}
    for e in events:
        kind = e.get("event")
        if kind in ("gpu_idle", "gpu_stuck"):
            extra = job_key(e) + ((str(e.get("reason")),) if state_class(e) == "resolved" else ())
        elif kind == "gpu_degraded":
            # faulted GPUs together, per fault (one line: "GPU 2,5: GPU requires reset")
            extra = (str(e.get("fault")) if state_class(e) == "firing" else str(e.get("reason")),)
        elif kind == "gpu_memory_leak":
            extra = (str(e.get("pid")),)
        elif kind == "monitor_degraded":
            extra = ()
        else:
            extra = (id(e),)
        key = (str(e.get("host", "?")), kind, state_class(e), e.get("vendor", "nvidia")) + extra
        groups.setdefault(key, []).append(e)
    # a later event about the same GPU/PID replaces an earlier one of the
    # same group (a reminder after a firing in one flush)
    out = []
    for evs in groups.values():
        seen = {}
        for e in evs:
            seen[(e.get("uuid"), e.get("gpu"), e.get("pid"))] = e
        out.append(list(seen.values()))
    # critical first (a faulted GPU, a leak hours from OOM), trend notes last
    firing = sorted((g for g in out if state_class(g[0]) == "firing"),
                    key=lambda g: -SEVERITY_RANK.get(severity(g[0]), 1))
    return firing + [g for g in out if state_class(g[0]) != "firing"]


SEVERITY_RANK = {"info": 0, "warning": 1, "critical": 2}


def severity(event):
    """critical, warning or info: the event's own (the leak detector's
    severity by projected time to OOM; gpu_degraded), else the kind's."""
    value = event.get("severity")
    if value in SEVERITY_RANK:
        return value
    return SEVERITY.get(event.get("event"), "warning")


def is_page(event):
    """A firing event that pages (an @mention): a trend note does not."""
    return state_class(event) in ("firing", "test") and severity(event) != "info"


def group_render(group, lang, env, digest=False):
    """(what, lines) for one group: the short subject and its lines."""
    e = group[0]
    kind = e.get("event")
    state = state_class(e)
    if kind == "gpu_idle":
        gpus = ranges([x.get("gpu") for x in group])
        if state == "resolved":
            return msg(lang, "what_idle_resolved", gpus=gpus), idle_resolved_lines(group, lang)
        return msg(lang, "what_idle", gpus=gpus), idle_group_lines(group, lang, env, digest)
    if kind == "gpu_stuck":
        gpus = ranges([x.get("gpu") for x in group])
        if state == "resolved":
            return msg(lang, "what_stuck_resolved", gpus=gpus), stuck_resolved_lines(group, lang)
        return msg(lang, "what_stuck", gpus=gpus), stuck_group_lines(group, lang, env)
    if kind == "gpu_degraded":
        gpus = ranges([x.get("gpu") for x in group])
        if state == "resolved":
            return msg(lang, "what_degraded_resolved", gpus=gpus), degraded_lines(group, lang)
        return msg(lang, "what_degraded", gpus=gpus, fault=fault_text(group, lang)), degraded_lines(group, lang)
    if kind == "gpu_memory_leak":
        return leak_render(e, lang)
    if kind == "monitor_degraded":
        if state == "resolved":
            return msg(lang, "what_monitor_resolved"), [msg(lang, "monitor_resolved", failures=e.get("failures"))]
        return msg(lang, "what_monitor"), [
            msg(lang, "monitor_failed", failures=e.get("failures"), error=defuse(e.get("error", ""))),
            msg(lang, "monitor_hint")]
    if kind == "test":
        return msg(lang, "what_test"), [msg(lang, "test_body")]
    if kind == "ledger_digest":
        return ledger_render(e, lang, digest)
    return msg(lang, "what_other", kind=defuse(kind)), [defuse(json.dumps(e, ensure_ascii=False))[:500]]


def ledger_render(e, lang, digest=False):
    """(what, lines) of the daily ledger digest (a ledger_digest event
    from lib/ledger.sh): python/gpuguard_ledger.py renders it, the same
    text as `gpuguard ledger`. Beside alerts in one post, its first line
    (the section's head) names the day."""
    what, lines = gpuguard_ledger.render_lines(e, lang)
    if digest:
        lines = [msg(lang, "ledger_in_digest", what=what, head=lines[0])] + lines[1:]
    return what, lines


TRENDS = {"steady": "trend_steady", "accelerating": "trend_accelerating", "steps": "trend_steps",
          "steady (phase-aware)": "trend_phase", "decelerating": "trend_decelerating"}


def oom_clock(event, seconds):
    """The wall-clock time of a projected OOM: "14:05", with the date when
    it is not today."""
    base = number(event.get("ts"))
    base = time.time() if base is None else base
    try:
        at = time.localtime(base + seconds)
        same_day = time.localtime(base)[:3] == at[:3]
        return time.strftime("%H:%M" if same_day else "%Y-%m-%d %H:%M", at)
    except (OverflowError, OSError, ValueError):
        return None


def leak_render(e, lang):
    """(what, lines) for one gpu_memory_leak event: the rate, since when,
    the projected OOM as a duration and a clock time, the detector's
    verdict and confidence, the leaking rank of a tree, who. The
    detector's fields are optional: older events have only the slope,
    window and projection."""
    unknown = msg(lang, "unknown")
    pid = defuse(e.get("pid"))
    name = defuse(os.path.basename(str(e.get("name") or "")))
    if any(j.get("cmdline") or j.get("slurm_job") or j.get("container") for j in jobs_of(e)):
        # the watcher's record of the series: named as an idle alert's job
        name = job_label([e], lang)
    slope = number(e.get("slope_mib_per_hour"))
    slope_text = f"{slope:+.0f}" if slope is not None else unknown
    if state_class(e) == "resolved":
        return msg(lang, "what_leak_resolved", pid=pid), [
            msg(lang, "leak_resolved", used=gib(e.get("used_memory_mib"), lang), slope=slope_text)]
    # the detector's projection is free / slope rounded to 0.1 h: recomputed
    # when both are known, so a fast leak reads "in 1 min 21 s", not "in 0 s"
    oom = number(e.get("projected_oom_hours"))
    free = number(e.get("free_memory_mib"))
    if free is not None and free >= 0 and slope is not None and slope > 0:
        oom = free / slope
    oom_s = round(oom * 3600) if oom is not None and oom >= 0 else None
    oom_text = duration(oom_s, lang) if oom_s is not None else unknown
    lines = [msg(lang, "leak_values", slope=slope_text, window=duration(e.get("window_seconds"), lang),
                 used=gib(e.get("used_memory_mib"), lang), free=gib(e.get("free_memory_mib"), lang))]
    since = number(e.get("since_ts"))
    if since is not None and when(since):
        ts = number(e.get("ts"))
        lines.append(msg(lang, "leak_since", since=when(since),
                         ago=duration((ts if ts is not None else time.time()) - since, lang)))
    trend_note = severity(e) == "info"
    if trend_note:
        lines.append(msg(lang, "leak_trend_note", oom=oom_text))
    else:
        clock = oom_clock(e, oom_s) if oom_s is not None else None
        lines.append(msg(lang, "leak_oom_at", oom=oom_text, clock=clock) if clock
                     else msg(lang, "leak_oom", oom=oom_text))
    trend = e.get("trend")
    confidence = number(e.get("confidence"))
    if trend or confidence is not None:
        trend_text = msg(lang, TRENDS[trend]) if trend in TRENDS else (defuse(trend)[:40] if trend else unknown)
        lines.append(msg(lang, "leak_verdict", trend=trend_text,
                         confidence=f"{confidence * 100:.0f} %" if confidence is not None else unknown))
    leaking = e.get("leaking_pid")
    if as_int(leaking) is not None and str(leaking) != str(e.get("pid")):
        rank = e.get("rank")
        if rank is not None and str(rank) != "":
            lines.append(msg(lang, "leak_rank", rank=defuse(rank)[:16], pid=as_int(leaking), root=pid))
        else:
            lines.append(msg(lang, "leak_member", pid=as_int(leaking), root=pid))
    lines += job_lines([e], lang)
    if e.get("loss_plateau") is not None:
        lines.append(msg(lang, "leak_plateau" if e["loss_plateau"] else "leak_falling"))
    lines.append(msg(lang, "leak_hint"))
    return msg(lang, "what_leak_trend" if trend_note else "what_leak", pid=pid, name=name), lines


def render_digest(events, lang, env=None):
    """(title, sections) of one message for all of a flush's events; each
    section is (head, detail lines), one per group (job/GPUs)."""
    env = ENV if env is None else env
    groups = group_events(events)
    hosts = sorted({str(e.get("host", "?")) for e in events})
    host = defuse(", ".join(hosts))
    sections = []
    for g in groups[:DIGEST_MAX_GROUPS]:
        # an NPU group reads in the NPU wording of its language
        glang = lang + "-npu" if g[0].get("vendor") == "ascend" else lang
        what, lines = group_render(g, glang, env, digest=len(groups) > 1)
        sections.append((g, what, lines))
    states = [state_class(g[0]) for g in groups]
    lead = "firing" if "firing" in states else ("test" if "test" in states else "resolved")
    tag = msg(lang, "tag_" + lead) if lead in ("firing", "resolved", "test") else lead
    if all(e.get("state") == "reminder" for g in groups for e in g):
        tag = msg(lang, "tag_reminder")
    firing = [e for g in groups for e in g if state_class(e) == "firing"]
    if all(e.get("event") == "ledger_digest" for e in events):
        tag = msg(lang, "tag_ledger")
    elif any(severity(e) == "critical" for e in firing):
        tag = msg(lang, "tag_critical")
    elif firing and all(severity(e) == "info" for e in firing):
        # only trend notes: not an alert
        tag = msg(lang, "tag_note")
    if len(groups) == 1:
        title = msg(lang, "title_one", tag=tag, host=host, what=sections[0][1])
        lines = sections[0][2]
        return title, ([(lines[0], lines[1:])] if lines else [])
    summary = []
    if states.count("firing"):
        summary.append(msg(lang, "summary_firing", n=states.count("firing")))
    if states.count("resolved"):
        summary.append(msg(lang, "summary_resolved", n=states.count("resolved")))
    title = msg(lang, "title_digest", tag=tag, host=host, n=len(groups), summary=", ".join(summary) or len(groups))
    out = []
    # sections say their state when they differ (firing and resolved, or
    # a critical alert beside a plain one or a trend note)
    mixed = len({section_tag(g, lang) for g, _, _ in sections}) > 1
    for g, what, lines in sections:
        head = lines[0] if lines else what
        if mixed:
            head = f"[{section_tag(g, lang)}] {head}"
        out.append((head, lines[1:]))
    if len(groups) > DIGEST_MAX_GROUPS:
        out.append((msg(lang, "digest_more", n=len(groups) - DIGEST_MAX_GROUPS), []))
    return title, out


def section_tag(group, lang):
    """The tag of one section of a mixed digest: a firing critical event
    says CRITICAL, a trend note NOTE."""
    state = state_class(group[0])
    if state == "firing" and severity(group[0]) in ("critical", "info"):
        return msg(lang, "tag_critical" if severity(group[0]) == "critical" else "tag_note")
    return msg(lang, "tag_" + state) if state in ("firing", "resolved", "test") else defuse(state)


def render(event, lang):
    """(title, lines) of the message for one event."""
    title, sections = render_digest([event], lang)
    lines = []
    for head, details in sections:
        lines.append(head)
        lines += details
    return title, lines


def truncate_bytes(text, limit, lang="en"):
    raw = text.encode("utf-8")
    if len(raw) <= limit:
        return text
    tail = "\n" + msg(lang, "truncated")
    cut = raw[:max(0, limit - len(tail.encode("utf-8")))].decode("utf-8", "ignore")
    return cut + tail


def mentions(env=None):
    env = ENV if env is None else env
    return [m for m in re.split(r"[\s,;]+", env.get("NOTIFY_MENTION", "")) if m]


# ----------------------------------------------------------------- bodies --

def plain_text(title, sections):
    out = [title]
    for head, details in sections:
        out.append(head)
        out += ["  " + d for d in details]
    return "\n".join(out)


def chat_text(provider, title, sections, who):
    """The message text as each platform formats it."""
    if provider == "dingtalk":
        text = f"### {title}\n\n" + "\n\n".join(
            f"**{h}**\n" + "".join(f"\n- {d}" for d in ds) for h, ds in sections)
        if who:
            text += "\n\n" + " ".join(f"@{m}" for m in who)
        return text
    if provider == "wecom":
        text = f"**{title}**\n" + "\n".join(
            f"**{h}**" + "".join(f"\n> {d}" for d in ds) for h, ds in sections)
        if who:
            text += "\n" + " ".join(f"<@{m}>" for m in who)
        return text
    if provider == "slack":
        text = f"*{title}*\n" + "\n".join(
            f"*{h}*" + "".join(f"\n• {d}" for d in ds) for h, ds in sections)
        text = text.replace("&", "&amp;").replace("\u2039", "&lt;").replace("\u203a", "&gt;")
        if who:
            text += "\n" + " ".join(f"<@{m}>" for m in who)
        return text
    text = plain_text(title, sections)
    if provider == "feishu" and who:
        text += "\n" + "".join(f'<at user_id="{m}"></at>' for m in who)
    return text


def digest_key(events):
    """A stable id for one digest: receivers that honour Idempotency-Key
    drop a resend after a timeout or a kill."""
    h = hashlib.sha256()
    for e in events:
        h.update(json.dumps(e, sort_keys=True, ensure_ascii=False).encode("utf-8", "replace"))
    return h.hexdigest()[:32]


def chat_body(target, events, lang=None, now=None, env=None):
    """(url, JSON body) of one digest for a chat or generic target."""
    env = ENV if env is None else env
    lang = lang or target.lang
    now = time.time() if now is None else now
    title, sections = render_digest(events, lang, env)
    who = mentions(env) if any(is_page(e) for e in events) else []
    limit = PROVIDER_TEXT_BYTES[target.provider]
    url = target.url
    text = truncate_bytes(chat_text(target.provider, title, sections, who), limit, lang)
    if target.provider == "dingtalk":
        body = {"msgtype": "markdown",
                "markdown": {"title": truncate_bytes(title, 200, lang), "text": text},
                "at": {"atMobiles": [m for m in who if m.isdigit()],
                       "atUserIds": [m for m in who if not m.isdigit()], "isAtAll": False}}
        if target.secret:
            ts = str(int(now * 1000))
            sep = "&" if "?" in url else "?"
            url = f"{url}{sep}timestamp={ts}&sign={dingtalk_sign(target.secret, ts)}"
        return url, body
    if target.provider == "feishu":
        body = {"msg_type": "text", "content": {"text": text}}
        if target.secret:
            ts = str(int(now))
            body = dict({"timestamp": ts, "sign": feishu_sign(target.secret, ts)}, **body)
        return url, body
    if target.provider == "wecom":
        return url, {"msgtype": "markdown", "markdown": {"content": text}}
    if target.provider == "slack":
        return url, {"text": text}
    # generic: the events themselves (machine consumers), with the message
    return url, {"title": title, "message": text, "lang": lang, "id": digest_key(events),
                 "events": events}


def iso(ts):
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


# The alert names and labels of etc/prometheus/gpuguard.rules.yml, so that a
# silence or an inhibition written for one holds for the other: instance is
# the host name (the rules strip the scrape port), job is "gpuguard".
ALERTNAMES = {"gpu_idle": "GpuIdleHeld", "gpu_stuck": "GpuStuckSpinning", "gpu_degraded": "GpuDegraded",
              "gpu_memory_leak": "GpuMemoryLeakDetected",
              "monitor_degraded": "GpuguardMonitorDown", "test": "GpuguardTest"}
# A leak event from the detector (it carries a severity by projected time
# to OOM) is the rules' GpuMemoryLeak (warning/critical) or, beyond the
# warning horizon, GpuMemoryLeakTrend (info: a trend note); an older event
# without one keeps GpuMemoryLeakDetected.
LEAK_ALERTNAMES = {"critical": "GpuMemoryLeak", "warning": "GpuMemoryLeak", "info": "GpuMemoryLeakTrend"}
SEVERITY = {"monitor_degraded": "critical", "gpu_degraded": "critical"}
# vendor: as the metrics' label (nvidia, or ascend for an NPU), so that a
# rule's alert and gpuguard's own one carry the same labels
LABEL_KEYS = {"gpu_idle": ("gpu", "uuid", "vendor"), "gpu_stuck": ("gpu", "uuid", "vendor"),
              "gpu_degraded": ("gpu", "uuid", "vendor"), "gpu_memory_leak": ("pid", "name")}


def alertmanager_labels(event):
    kind = event.get("event")
    name = ALERTNAMES.get(kind, "Gpuguard")
    if kind == "gpu_memory_leak" and event.get("severity") in LEAK_ALERTNAMES:
        name = LEAK_ALERTNAMES[event["severity"]]
    labels = {"alertname": name, "instance": str(event.get("host", "")),
              "job": "gpuguard", "severity": severity(event)}
    for key in LABEL_KEYS.get(kind, ("gpu", "uuid", "pid")):
        value = event.get(key, "nvidia" if key == "vendor" else None)
        if key == "name" and value is not None:
            value = os.path.basename(str(value))
        if value is not None and value != "":
            labels[key] = str(value)
    return labels


# The (alertname, severity) a leak may have fired under: a resolved leak
# event without a severity (the detector does not repeat it on resolving)
# resolves each, since Alertmanager knows an alert by all of its labels;
# one that never fired is kept as resolved and notifies no one.
LEAK_RESOLVE_AS = (("GpuMemoryLeak", "critical"), ("GpuMemoryLeak", "warning"),
                   ("GpuMemoryLeakTrend", "info"), ("GpuMemoryLeakDetected", "warning"))


def alertmanager_alerts(event, lang="en", now=None):
    """The Alertmanager alerts for one event: one, or for a resolved leak
    of unknown severity one per name and severity it may have fired as."""
    if event.get("event") == "ledger_digest":
        return []               # a daily report, not an alert
    alert = alertmanager_alert(event, lang, now)
    if event.get("event") != "gpu_memory_leak" or state_class(event) != "resolved" or \
            event.get("severity") in SEVERITY_RANK:
        return [alert]
    out = []
    for name, sev in LEAK_RESOLVE_AS:
        labels = dict(alert["labels"], alertname=name, severity=sev)
        out.append(dict(alert, labels=labels))
    return out


def alertmanager_alert(event, lang="en", now=None):
    now = time.time() if now is None else now
    title, lines = render(event, lang)
    annotations = {"summary": title, "description": "\n".join(lines)}
    for key in ("utilization", "power_draw_w", "power_limit_w", "spin_cycles", "idle_seconds", "fault",
                "slope_mib_per_hour", "since_ts", "projected_oom_hours", "confidence", "trend", "leaking_pid",
                "rank", "used_memory_mib", "error", "reason"):
        if event.get(key) is not None:
            annotations[key] = str(event[key])
    ts = as_int(event.get("ts")) or now
    idle_s = as_int(event.get("idle_seconds")) or 0
    since = as_int(event.get("since")) or (ts - idle_s if event.get("event") in ("gpu_idle", "gpu_stuck") else ts)
    alert = {"labels": alertmanager_labels(event), "annotations": annotations, "startsAt": iso(since)}
    if event.get("state") in ("resolved", "test"):
        alert["endsAt"] = iso(max(now, since))
    else:
        # Alertmanager resolves an alert not re-sent within resolve_timeout;
        # the watchdog re-sends at REPEAT_INTERVAL, so keep it open that long.
        repeat = as_int(ENV.get("REPEAT_INTERVAL") or 3600) or 86400
        alert["endsAt"] = iso(now + 2 * repeat + 300)
    host = str(event.get("host") or "")
    if re.match(r"^[A-Za-z0-9.-]+$", host):
        alert["generatorURL"] = f"http://{host}/gpuguard"
    return alert


# -------------------------------------------------------------- transport --

class Outcome:
    SENT, RETRY, PERMANENT, MAYBE = "sent", "retry", "permanent", "maybe"

    def __init__(self, kind, detail, retry_after=None):
        self.kind = kind
        self.detail = detail
        self.retry_after = retry_after


class NotSent(Exception):
    """The request never reached the receiver (DNS, refused, TLS...), or the
    receiver dropped it without a byte of answer (reset, closed)."""


class MaybeSent(Exception):
    """The request was sent but no answer came: it may have been delivered."""


def retry_after_seconds(value):
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


def classify(provider, status, body, headers):
    """Reads a response the way each platform means it: HTTP 200 with an
    errcode is not a delivery."""
    text = body.decode("utf-8", "replace") if isinstance(body, bytes) else str(body)
    if status == 429 or status >= 500:
        ra = retry_after_seconds(headers.get("Retry-After")) if headers else None
        return Outcome(Outcome.RETRY, f"HTTP {status} {text[:120]}", ra)
    if not 200 <= status < 300:
        return Outcome(Outcome.PERMANENT, f"HTTP {status} {text[:200]}")
    if provider in ("dingtalk", "wecom", "feishu"):
        try:
            data = json.loads(text)
        except ValueError:
            return Outcome(Outcome.RETRY, f"unreadable reply {text[:120]!r}")
        if not isinstance(data, dict):
            return Outcome(Outcome.RETRY, f"unreadable reply {text[:120]!r}")
        code = data.get("errcode", data.get("code", data.get("StatusCode")))
        msg_text = data.get("errmsg", data.get("msg", data.get("StatusMessage", "")))
        if code == 0:
            return Outcome(Outcome.SENT, "ok")
        if code in RETRY_CODES.get(provider, set()):
            return Outcome(Outcome.RETRY, f"rate limited: {code} {msg_text}", 60.0)
        return Outcome(Outcome.PERMANENT, f"error {code}: {msg_text}")
    if provider == "slack":
        if text.strip() == "ok":
            return Outcome(Outcome.SENT, "ok")
        return Outcome(Outcome.PERMANENT, f"reply {text[:120]!r}")
    return Outcome(Outcome.SENT, f"HTTP {status}")


def post_json(url, body, timeout, key=None):
    """POSTs JSON; (status, body, headers). Raises NotSent when the request
    never left, MaybeSent when it left and no answer came in time."""
    data = json.dumps(body, ensure_ascii=False).encode("utf-8", "replace")
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise NotSent("not an http(s) URL")
    cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    try:
        conn = cls(parts.hostname, parts.port, timeout=timeout)
    except (ValueError, OSError) as e:
        raise NotSent(one_line(e))
    path = (parts.path or "/") + ("?" + parts.query if parts.query else "")
    headers = {"Content-Type": "application/json; charset=utf-8", "User-Agent": "gpuguard",
               "Content-Length": str(len(data))}
    if key:
        headers["Idempotency-Key"] = key
    try:
        try:
            conn.connect()
        except (OSError, http.client.HTTPException, ValueError) as e:
            raise NotSent(getattr(e, "strerror", None) or one_line(e))
        try:
            conn.request("POST", path, body=data, headers=headers)
        except (OSError, http.client.HTTPException) as e:
            raise NotSent("sending: %s" % (getattr(e, "strerror", None) or one_line(e)))
        try:
            resp = conn.getresponse()
            return resp.status, resp.read(65536), dict(resp.headers)
        except ConnectionError as e:
            # reset, or closed without a byte of answer (RemoteDisconnected
            # is one): the receiver dropped the request, most likely before
            # processing it; retried like a refused connection. Counting it
            # as maybe-delivered lost events to a receiver that reset twice.
            raise NotSent("no answer: %s" % (getattr(e, "strerror", None) or one_line(e)))
        except (OSError, http.client.HTTPException) as e:
            # a timeout after the whole request went out: it may have been
            # processed (a slow receiver), so it counts toward the 2 copies
            raise MaybeSent(f"no answer within {timeout:g} s ({one_line(e)})")
    finally:
        conn.close()


def send(target, url, body, env=None, sleep=time.sleep, maybe_before=False, on_maybe=None, key=None):
    """POSTs with retries and backoff on network errors, 5xx and 429.
    A Retry-After longer than a short wait ends the attempt: the event stays
    queued and that target is not tried again before then. A request that
    left whole and timed out waiting for an answer is retried once, with a
    longer timeout; a second one (maybe_before: an earlier flush had one)
    counts as delivered. A connection reset or closed without an answer is
    not a maybe: it is retried (with back-off) until delivered."""
    env = os.environ if env is None else env
    timeout = float(env.get("NOTIFY_TIMEOUT") or 5)
    tries = int(env.get("NOTIFY_RETRIES") or 3) + 1
    outcome = None
    attempt = 0
    while attempt < tries:
        attempt += 1
        try:
            status, reply, headers = post_json(url, body, timeout, key)
            outcome = classify(target.provider, status, reply, headers)
        except NotSent as e:
            outcome = Outcome(Outcome.RETRY, f"network: {e}")
        except MaybeSent as e:
            if maybe_before:
                return Outcome(Outcome.MAYBE, f"{e} twice; counted as delivered to stay under 2 copies")
            maybe_before = True
            if on_maybe:
                on_maybe()
            timeout *= MAYBE_TIMEOUT_FACTOR
            outcome = Outcome(Outcome.RETRY, str(e))
            tries = max(tries, attempt + 1)      # the one retry, at once
            continue
        if outcome.kind != Outcome.RETRY:
            return outcome
        wait = outcome.retry_after
        if wait is not None and wait > 10:
            return outcome
        if attempt < tries:
            backoff = wait if wait is not None else min(8.0, 0.5 * 2 ** (attempt - 1)) * random.uniform(0.5, 1.5)
            sleep(backoff)
    return outcome


# ----------------------------------------------------------------- outbox --

class State:
    """Per-target delivery state: recent send times (rate limit), a
    not-before time, and whether a permanent error was reported. Targets
    are known by a hash of their URL and a masked label, never the URL."""

    def __init__(self, path):
        self.path = path
        self.data = {}
        try:
            data = json.loads(read_bytes(path).decode("utf-8", "replace"))
            if isinstance(data, dict):
                self.data = {k: v for k, v in data.items() if isinstance(v, dict)}
        except FileNotFoundError:
            pass
        except OSError as e:
            if e.errno == errno.ELOOP:
                log("error", f"{path} is a symlink: not read (it is replaced on save)")
        except ValueError:
            log("warn", f"{path} unreadable: delivery state starts afresh")

    def target(self, target):
        t = self.data.setdefault(target.id, {})
        for key, value in (("sent", []), ("not_before", 0), ("reported", ""), ("failures", 0)):
            t.setdefault(key, value)
        t["label"] = target.label()
        return t

    def save(self):
        for t in self.data.values():
            t["reported"] = scrub(t.get("reported", ""))
        try:
            write_atomic(self.path, json.dumps(self.data, sort_keys=True), durable=True)
        except OSError as e:
            write_failed(os.path.dirname(self.path), self.path, e)
            return False
        write_ok(os.path.dirname(self.path))
        return True


def rate_budget(target, tstate, now, env=None):
    env = os.environ if env is None else env
    per_min = int(env.get("NOTIFY_RATE_PER_MIN") or 0) or PROVIDER_RATE[target.provider]
    tstate["sent"] = [t for t in tstate["sent"] if isinstance(t, (int, float)) and now - t < 60]
    return per_min - len(tstate["sent"])


def outbox_items(outbox):
    try:
        names = sorted(n for n in os.listdir(outbox) if n.endswith(".json") and not n.startswith("."))
    except OSError:
        return []
    return [os.path.join(outbox, n) for n in names]


LEADING_ZEROS = re.compile(r'([:\[,]\s*-?)0+(\d)')


def parse_event(raw):
    """One event from the bytes of an outbox file or an events.jsonl line:
    names that are not UTF-8 (GBK, raw bytes) become U+FFFD; a number
    written with leading zeros (07) is read as 7 rather than the event
    being lost."""
    text = raw.decode("utf-8", "replace").strip().split("\n", 1)[0]
    try:
        event = json.loads(text)
    except ValueError:
        event = json.loads(LEADING_ZEROS.sub(r"\1\2", text))
    if not isinstance(event, dict):
        raise ValueError("not a JSON object")  # noqa: TRY004 (callers set bad files aside on ValueError)
    return event


def markers(path, kind, names=None):
    """Target ids with a marker of this kind (done, maybe) for an item;
    names: the outbox listing already read (one listing per pass, not one
    per item, for a full outbox)."""
    folder, base = os.path.split(path)
    prefix = base + "." + kind + "-"
    names = list_names(folder) if names is None else names
    found = {n[len(prefix):] for n in names if n.startswith(prefix)}
    if kind == "done" and base[:-5] + ".sent" in names:
        # files written by older versions: one target id a line
        try:
            found |= set(read_bytes(path[:-5] + ".sent").decode("ascii", "replace").split())
        except OSError:
            pass
    return found


def read_item(path, names=None):
    """(event, set of target ids already delivered)."""
    event = parse_event(read_bytes(path))
    return event, markers(path, "done", names)


def mark(path, kind, tid):
    try:
        touch_marker(f"{path}.{kind}-{tid}")
        return True
    except OSError as e:
        # an empty marker needs no data block; failing, it is one line an outage
        write_failed(os.path.dirname(os.path.dirname(path)), f"the {kind} marker of {os.path.basename(path)} "
                     "(it may be sent again)", e)
        return False


def remove_item(path, names=None):
    """The item first (it is then never sent again), then its markers."""
    folder, base = os.path.split(path)
    names = list_names(folder) if names is None else names
    for p in [path, path[:-5] + ".sent"] + [os.path.join(folder, n) for n in names
                                            if n.startswith(base + ".")]:
        try:
            os.remove(p)
        except OSError:
            pass


def list_names(folder):
    try:
        return os.listdir(folder)
    except OSError:
        return []


def remove_orphan_markers(outbox):
    """Markers whose item is gone (a kill between the two removals)."""
    names = set(list_names(outbox))
    for n in names:
        m = re.match(r"^(.*\.json)\.(done|maybe)-[0-9a-f]+$", n)
        if m and m.group(1) not in names:
            try:
                os.remove(os.path.join(outbox, n))
            except OSError:
                pass


def enforce_bound(outbox, limit):
    items = outbox_items(outbox)
    excess = len(items) - limit
    if excess <= 0:
        return
    dropped = items[:excess]
    first = os.path.basename(dropped[0])
    last = os.path.basename(dropped[-1])
    names = list_names(outbox)
    for path in dropped:
        remove_item(path, names)
    log("error", f"outbox over OUTBOX_MAX={limit}: dropped the {excess} oldest undelivered events ({first} .. {last})")


def deliver_target(target, tstate, items, env, now):
    """Sends one target everything it has not had yet, as digests, and
    records each delivery. Returns nothing; errors are one log line."""
    if now < tstate.get("not_before", 0):
        return
    pending = [(p, e) for p, e, done in items if target.id not in done]
    while pending:
        budget = rate_budget(target, tstate, now, env)
        if budget <= 0:
            per_min = int(env.get("NOTIFY_RATE_PER_MIN") or 0) or PROVIDER_RATE[target.provider]
            log("warn", f"{target.label()}: rate limit reached ({per_min} a minute); {len(pending)} events wait")
            return
        batch = pending[:200]
        events = [e for _, e in batch]
        if target.provider == "alertmanager":
            url = target.url + "/api/v2/alerts"
            body = [a for e in events for a in alertmanager_alerts(e, target.lang, now=time.time())]
        else:
            url, body = chat_body(target, events, target.lang, now, env)
        names = list_names(os.path.dirname(batch[0][0]))
        maybe_before = any(target.id in markers(p, "maybe", names) for p, _ in batch)

        def on_maybe(batch=batch):
            for p, _ in batch:
                mark(p, "maybe", target.id)

        outcome = send(target, url, body, env, maybe_before=maybe_before, on_maybe=on_maybe,
                       key=digest_key(events))
        if outcome.kind in (Outcome.SENT, Outcome.MAYBE):
            for p, _ in batch:
                mark(p, "done", target.id)
            tstate["sent"].append(now)
            tstate["failures"] = 0
            if outcome.kind == Outcome.MAYBE:
                log("warn", f"{target.label()}: {outcome.detail}")
            elif tstate.get("reported"):
                log("info", f"{target.label()}: delivering again")
            tstate["reported"] = ""
            pending = pending[len(batch):]
            continue
        wait = outcome.retry_after or 0
        if outcome.kind == Outcome.PERMANENT:
            wait = max(wait, PERMANENT_RETRY_AFTER)
            detail = scrub(outcome.detail)
            if tstate.get("reported") != detail:
                log("error", f"{target.label()} rejected the alert: {detail}; {len(pending)} events stay queued, "
                    f"retried every {PERMANENT_RETRY_AFTER:.0f} s until the target is fixed")
                tstate["reported"] = detail
        else:
            tstate["failures"] = tstate.get("failures", 0) + 1
            # the exponent is capped: a float overflows past 2**1023, and
            # the pause is capped at MAX_RETRY_AFTER long before that
            wait = max(wait, DOWN_BACKOFF * 2 ** min(tstate["failures"] - 1, 16))
            log("warn", f"{target.label()}: {outcome.detail}; {len(pending)} events stay queued "
                f"(next try in {min(wait, MAX_RETRY_AFTER):.0f} s)")
        tstate["not_before"] = now + min(wait, MAX_RETRY_AFTER if outcome.kind == Outcome.RETRY
                                         else PERMANENT_RETRY_AFTER)
        return


def load_items(outbox):
    items = []
    names = list_names(outbox)
    for path in outbox_items(outbox):
        try:
            items.append((path, *read_item(path, names)))
        except FileNotFoundError:
            continue
        except (OSError, ValueError) as e:
            log("error", f"unreadable outbox file {os.path.basename(path)} moved aside ({one_line(e)})")
            try:
                os.replace(path, path + ".bad")
            except OSError:
                pass
    return items


def flush(env=None, now=None):
    """Delivers the outbox: one digest per target for everything waiting,
    each target on its own thread (a slow or dead one delays no other).
    Returns the number of events still queued."""
    global ENV
    env = ENV = os.environ if env is None else env
    state_dir = env.get("GPUGUARD_STATE_DIR") or ""
    if not state_dir:
        log("error", "GPUGUARD_STATE_DIR is not set: nothing to flush")
        return 0
    outbox = os.path.join(state_dir, "outbox")
    problem = state_dir_problem(state_dir)
    if problem:
        log("error", problem)
        return len(outbox_items(outbox))
    # a malformed target is left out (lib/config.sh said so once)
    bad = []
    targets = targets_from_env(env, bad)
    for name, problem in bad:
        log("debug", f"{name} is malformed ({problem}): left out")
    lock = FlushLock(state_dir)
    if not lock.acquire():
        if lock.error:
            log("error", lock.error + "; nothing sent")
        else:
            log("debug", f"another flush holds {lock.path}: it delivers these events")
        return len(outbox_items(outbox))
    try:
        enforce_bound(outbox, int(env.get("OUTBOX_MAX") or 1000))
        remove_orphan_markers(outbox)
        state = State(os.path.join(state_dir, "alert-state.json"))
        tstates = {t.id: state.target(t) for t in targets}
        seen = set()
        # events queued while a digest was on its way go out in the same
        # flush (a second pass), so a flush that found the lock taken
        # loses nothing by leaving
        for _ in range(3):
            items = load_items(outbox)
            fresh = [it for it in items if it[0] not in seen]
            if not fresh:
                break
            seen.update(it[0] for it in items)
            run_targets(targets, tstates, items, env, now)
            ids = {t.id for t in targets}
            names = list_names(outbox)
            for path, _, _ in items:
                if ids and ids <= markers(path, "done", names):
                    remove_item(path, names)
            if not targets:
                break
        state.save()
        return len(outbox_items(outbox))
    finally:
        lock.release()


def run_targets(targets, tstates, items, env, now):
    def work(target):
        try:
            deliver_target(target, tstates[target.id], items, env, time.time() if now is None else now)
        except Exception as e:  # noqa: BLE001 (one target's bug never stops the others)
            log("error", f"{target.label()}: {e.__class__.__name__}: {one_line(e)}")

    threads = [(t, threading.Thread(target=work, args=(t,), daemon=True)) for t in targets]
    for _, thread in threads:
        thread.start()
    # every request is bounded by its timeout; name resolution is not, so
    # the flush as a whole is: a target still busy then is left behind (its
    # events stay queued) rather than holding up the watchdog's cycle
    deadline = time.time() + FLUSH_DEADLINE
    for target, thread in threads:
        thread.join(max(0.0, deadline - time.time()))
        if thread.is_alive():
            log("warn", f"{target.label()}: still sending after {FLUSH_DEADLINE:.0f} s; its events stay queued")


# ---------------------------------------------------------------- commands --

def test_event(env):
    return {"ts": int(time.time()), "host": env.get("GPUGUARD_HOST") or os.uname().nodename,
            "event": "test", "state": "test"}


def test_alert(env=None):
    global ENV
    env = ENV = os.environ if env is None else env
    bad = []
    targets = targets_from_env(env, bad)
    for name, problem in bad:
        print(scrub(f"{'FAIL':<8} {name}: malformed, {problem}"))
    if not targets:
        if not bad:
            print("no target configured: set NOTIFY_URL or ALERTMANAGER_URL")
        return 2 if bad else 1
    event = test_event(env)
    failed = 0
    for target in targets:
        try:
            if target.provider == "alertmanager":
                url, body = target.url + "/api/v2/alerts", [alertmanager_alert(event, target.lang)]
            else:
                url, body = chat_body(target, [event], target.lang, env=env)
            outcome = send(target, url, body, env)
        except Exception as e:  # noqa: BLE001 (one line per target, never a traceback)
            outcome = Outcome(Outcome.PERMANENT, one_line(e))
        print(scrub(f"{outcome.kind:<8} {target.label()}: {outcome.detail}"))
        failed += outcome.kind != Outcome.SENT
    return 2 if bad else 1 if failed else 0


URL_SHAPES = {
    "dingtalk": (r"^/robot/send$", "access_token", "https://oapi.dingtalk.com/robot/send?access_token=..."),
    "wecom": (r"^/cgi-bin/webhook/send$", "key", "https://qyapi.weixin.qq.com/cgi-bin/webhook/send?key=..."),
    "feishu": (r"^/open-apis/bot/v2/hook/[\w-]+$", None, "https://open.feishu.cn/open-apis/bot/v2/hook/..."),
    "slack": (r"^/services/[^/]+/[^/]+/[^/]+$", None, "https://hooks.slack.com/services/T.../B.../..."),
}


def check_target(target, timeout=2.0):
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
    shape = URL_SHAPES.get(target.provider)
    if shape and PROVIDER_HOSTS.get(parts.hostname.lower()) == target.provider:
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
            result["error"] = getattr(e, "strerror", None) or one_line(e)

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
        return "FAIL", f"TCP connect to {parts.hostname} port {port}: {e.strerror or one_line(e)}"
    ms = (time.time() - start) * 1000
    detail = f"reachable (TCP {ms:.0f} ms), language {target.lang}; nothing sent (gpuguard notify --test sends one)"
    if notes:
        return "WARN", "; ".join(notes) + "; " + detail
    return "OK", detail


def check_targets(env=None):
    global ENV
    env = ENV = os.environ if env is None else env
    bad = []
    targets = targets_from_env(env, bad)
    for name, problem in bad:
        print(scrub(f"FAIL\t{name}\tmalformed: {problem}; the other targets still get alerts"))
    failed = 0
    for target in targets:
        try:
            level, detail = check_target(target, min(2.0, float(env.get("NOTIFY_TIMEOUT") or 2)))
        except Exception as e:  # noqa: BLE001 (one line per target, never a traceback)
            level, detail = "FAIL", one_line(e)
        failed += level == "FAIL"
        print(scrub(f"{level}\t{target.label()}\t{detail}"))
    # a malformed target is a configuration error: exit status 2
    return 2 if bad else 1 if failed else 0


def recorded_events(source, env):
    """Events to preview: a file or stdin ("-"), one JSON object a line, or
    the last line of events.jsonl."""
    if source == "-":
        raw = sys.stdin.buffer.read()
        lines = raw.splitlines()
    elif source:
        lines = read_bytes(source, 64 << 20).splitlines()
    else:
        path = os.path.join(env.get("GPUGUARD_STATE_DIR") or ".", "events.jsonl")
        try:
            lines = read_bytes(path, 64 << 20).splitlines()[-1:]
        except OSError as e:
            raise ValueError(f"no recorded event: {path}: {e.strerror}")
    events = [parse_event(ln) for ln in lines if ln.strip()]
    if not events:
        raise ValueError("no event to preview")
    return events


def preview(source, env=None):
    """Prints what each provider would receive, sending nothing."""
    global ENV
    env = ENV = os.environ if env is None else env
    events = recorded_events(source, env)
    configured = {}
    for t in targets_from_env(env):
        configured.setdefault(t.provider, t)
    for provider in PROVIDERS + ("alertmanager",):
        target = configured.get(provider) or Target("http://preview.invalid/", provider, "",
                                                    language(env))
        print("===== {} ({}){} =====".format(provider, target.lang, "" if provider in configured else " [not configured]"))
        if provider == "alertmanager":
            # one POST of alerts: labels, times and summary a line each
            for a in (a for e in events for a in alertmanager_alerts(e, target.lang)):
                print(json.dumps({"labels": a["labels"], "startsAt": a["startsAt"], "endsAt": a["endsAt"],
                                  "summary": a["annotations"]["summary"]}, ensure_ascii=False))
            print()
            continue
        _, body = chat_body(target, events, target.lang, env=env)
        text = {"dingtalk": lambda b: b["markdown"]["text"], "feishu": lambda b: b["content"]["text"],
                "wecom": lambda b: b["markdown"]["content"], "slack": lambda b: b["text"],
                "generic": lambda b: b["message"]}[provider](body)
        print(text)
        print()
    return 0


def main(argv):
    cmd = argv[1] if len(argv) > 1 else ""
    try:
        if cmd == "flush":
            flush()
            return 0
        if cmd == "test":
            return test_alert()
        if cmd == "check":
            return check_targets()
        if cmd == "preview":
            return preview(argv[2] if len(argv) > 2 else "")
        if cmd == "render":
            events = recorded_events("-", os.environ)
            title, sections = render_digest(events, language() or "en")
            print(plain_text(title, sections))
            return 0
    except (ValueError, OSError) as e:
        print(f"gpuguard_alert: {one_line(e)}", file=sys.stderr)
        return 2
    except Exception as e:  # noqa: BLE001 (a bug: one line, never a traceback)
        log("error", f"{os.path.basename(argv[0])} {cmd}: {e.__class__.__name__}: {one_line(e)}")
        return 1
    print("usage: gpuguard_alert.py flush|test|check|preview [FILE|-]|render", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
