#!/usr/bin/env python3
"""gpuguard's alert module: every event leaves through here.

Commands:
  flush        deliver what waits in $GPUGUARD_STATE_DIR/outbox, oldest first
  test         send a test message to every target and print one line each
  render       print the human message for an event read on stdin

Targets come from the environment (set from the config file by the bash
side, never from argv): NOTIFY_URL (one or more URLs, separated by spaces,
commas or semicolons; a "dingtalk+" / "feishu+" / "wecom+" / "slack+" /
"generic+" prefix forces the provider), NOTIFY_TYPE (provider for URLs whose
host says nothing), NOTIFY_SECRET (signing secret; one for all, or one per
URL in the same order), NOTIFY_LANG (zh|en; default from LANG),
NOTIFY_TIMEOUT (s), NOTIFY_RETRIES, NOTIFY_RATE_PER_MIN (0: the provider's
own limit), NOTIFY_MENTION (mobiles or user ids to mention on firing
alerts), ALERTMANAGER_URL, OUTBOX_MAX.

Standard library only: it must run on a bare GPU box.
"""
import base64
import hashlib
import hmac
import json
import os
import random
import re
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

PROVIDER_HOSTS = {
    "oapi.dingtalk.com": "dingtalk",
    "open.feishu.cn": "feishu",
    "open.larksuite.com": "feishu",
    "qyapi.weixin.qq.com": "wecom",
    "hooks.slack.com": "slack",
}
PROVIDERS = ("dingtalk", "feishu", "wecom", "slack", "generic")
# Messages per minute each provider accepts from one robot / webhook.
PROVIDER_RATE = {"dingtalk": 20, "wecom": 20, "feishu": 100, "slack": 60,
                 "generic": 600, "alertmanager": 600}
# Body size limits, in UTF-8 bytes, with a margin for the JSON envelope.
PROVIDER_TEXT_BYTES = {"dingtalk": 18000, "wecom": 3900, "feishu": 18000,
                       "slack": 35000, "generic": 1 << 30}
# Business error codes: retry later (rate limited) versus permanent.
RETRY_CODES = {"dingtalk": {130101}, "wecom": {45009}, "feishu": {11232}}
PERMANENT_RETRY_AFTER = 600.0
MAX_RETRY_AFTER = 300.0
# After a cycle's retries are spent on a target that is down, later cycles
# wait 30 s, 60 s, 120 s ... (at most MAX_RETRY_AFTER) before trying it again,
# so a dead receiver does not eat every watchdog cycle.
DOWN_BACKOFF = 30.0
SECRET_QUERY_KEYS = ("access_token", "key", "token", "sign", "secret")
# The environment in force: os.environ when run as a command; flush() and
# test_alert() take another one (tests), which logging and scrubbing follow.
ENV = os.environ


# ---------------------------------------------------------------- logging --

def log(level, msg):
    """One log line in the format the bash side writes."""
    line = "%s %-5s alert: %s\n" % (time.strftime("%Y-%m-%d %H:%M:%S"),
                                   level.upper(), scrub(msg))
    path = ENV.get("GPUGUARD_LOG")
    try:
        if path:
            with open(path, "a", encoding="utf-8") as f:
                f.write(line)
            return
    except OSError:
        pass
    sys.stderr.write(line)


def secrets():
    """Every secret string known from the environment, longest first."""
    found = set()
    for s in re.split(r"[\s,;]+", ENV.get("NOTIFY_SECRET", "")):
        if len(s) >= 4:
            found.add(s)
    for url in split_urls(ENV.get("NOTIFY_URL", "")) + \
            split_urls(ENV.get("ALERTMANAGER_URL", "")):
        parts = urllib.parse.urlsplit(url.split("+", 1)[-1] if "+" in url.split("://")[0] else url)
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
    return re.sub(r"((?:%s)=)[^&\s\"']+" % "|".join(SECRET_QUERY_KEYS),
                  r"\1***", text)


def mask_url(url):
    """A URL fit for a log line: scheme, host and a masked path."""
    parts = urllib.parse.urlsplit(url)
    return "%s://%s/***" % (parts.scheme, parts.hostname or "?")


# ---------------------------------------------------------------- targets --

def split_urls(value):
    return [u for u in re.split(r"[\s,;]+", value or "") if u]


class Target:
    def __init__(self, url, provider, secret):
        self.url = url
        self.provider = provider
        self.secret = secret
        self.id = hashlib.sha256(url.encode()).hexdigest()[:12]

    def label(self):
        return "%s %s" % (self.provider, mask_url(self.url))


def targets_from_env(env=None):
    env = os.environ if env is None else env
    urls = split_urls(env.get("NOTIFY_URL", ""))
    sec = [s for s in re.split(r"[\s,;]+", env.get("NOTIFY_SECRET", "")) if s]
    default_type = env.get("NOTIFY_TYPE", "") or None
    out = []
    for i, raw in enumerate(urls):
        provider = None
        url = raw
        scheme = raw.split("://", 1)[0]
        if "+" in scheme:
            provider, url = raw.split("+", 1)
            if provider not in PROVIDERS:
                raise ValueError("unknown provider '%s' in NOTIFY_URL" % provider)
        host = (urllib.parse.urlsplit(url).hostname or "").lower()
        provider = provider or PROVIDER_HOSTS.get(host) or default_type or "generic"
        secret = sec[i] if len(sec) == len(urls) else (sec[0] if len(sec) == 1 else "")
        out.append(Target(url, provider, secret))
    for raw in split_urls(env.get("ALERTMANAGER_URL", "")):
        out.append(Target(raw.rstrip("/"), "alertmanager", ""))
    return out


# ---------------------------------------------------------------- signing --

def dingtalk_sign(secret, ts_ms):
    """DingTalk 加签: HMAC-SHA256 keyed by the secret over "ts\\nsecret",
    base64, URL-encoded once."""
    digest = hmac.new(secret.encode("utf-8"),
                      ("%s\n%s" % (ts_ms, secret)).encode("utf-8"),
                      hashlib.sha256).digest()
    return urllib.parse.quote_plus(base64.b64encode(digest))


def feishu_sign(secret, ts_s):
    """Feishu: HMAC-SHA256 keyed by "ts\\nsecret" over the empty message,
    base64, not URL-encoded (it goes in the JSON body)."""
    digest = hmac.new(("%s\n%s" % (ts_s, secret)).encode("utf-8"), b"",
                      hashlib.sha256).digest()
    return base64.b64encode(digest).decode("ascii")


# --------------------------------------------------------------- messages --

def language(env=None):
    env = os.environ if env is None else env
    lang = env.get("NOTIFY_LANG", "")
    if lang in ("zh", "en"):
        return lang
    return "zh" if env.get("LANG", "").lower().startswith("zh") else "en"


def duration(seconds, lang):
    seconds = int(seconds or 0)
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    if lang == "zh":
        return ("%d小时" % h if h else "") + ("%d分" % m if h or m else "") + "%d秒" % s
    return ("%dh " % h if h else "") + ("%dm " % m if h or m else "") + "%ds" % s


def defuse(text):
    """Makes untrusted text (process names) unable to mention anyone on any
    platform: @all, <at ...>, <@id>, <!channel>, @everyone."""
    text = str(text)
    text = text.replace("@", "\uff20")          # fullwidth at sign
    text = text.replace("<", "\u2039").replace(">", "\u203a")
    return text


def fmt_procs(procs, lang, limit=10):
    if not procs:
        return "（进程列表不可见：容器？）" if lang == "zh" else "(process list not visible: container?)"
    items = []
    for p in procs[:limit]:
        name = defuse(os.path.basename(str(p.get("name", "?"))) or "?")
        if len(name) > 48:
            name = name[:47] + "…"
        items.append("%s %s (%s MiB)" % (p.get("pid"), name, p.get("used_memory_mib")))
    more = len(procs) - limit
    if more > 0:
        items.append(("……另有 %d 个" % more) if lang == "zh" else ("... and %d more" % more))
    return ", ".join(items)


def gib(mib):
    try:
        return "%.1f GiB" % (float(mib) / 1024)
    except (TypeError, ValueError):
        return "?"


def render(event, lang):
    """(title, lines) of the human message for one event."""
    kind = event.get("event")
    state = event.get("state", "firing")
    host = defuse(event.get("host", "?"))
    zh = lang == "zh"
    tag = {"firing": "告警" if zh else "ALERT", "reminder": "提醒" if zh else "REMINDER",
           "resolved": "恢复" if zh else "RESOLVED", "test": "测试" if zh else "TEST"}.get(state, state)
    if kind == "gpu_idle":
        gpu = event.get("gpu")
        util = event.get("utilization")
        idle = duration(event.get("idle_seconds"), lang)
        if state == "resolved":
            why = event.get("reason")
            if zh:
                what = {"busy": "已恢复繁忙（利用率 %s%%）" % util, "released": "进程已退出，显存已释放",
                        "gone": "GPU 已不在列表中"}.get(why, why)
                title = "[gpuguard %s] %s GPU %s 不再空闲占用" % (tag, host, gpu)
                return title, ["%s，此前空闲 %s。" % (what, idle)]
            what = {"busy": "busy again (utilization %s%%)" % util, "released": "released: processes gone",
                    "gone": "no longer listed"}.get(why, why)
            title = "[gpuguard %s] %s GPU %s no longer idle" % (tag, host, gpu)
            return title, ["%s after %s idle." % (what, idle)]
        procs = fmt_procs(event.get("processes") or [], lang)
        power = event.get("power_draw_w")
        if zh:
            title = "[gpuguard %s] %s GPU %s 占用但空闲" % (tag, host, gpu)
            lines = ["利用率 %s%%（阈值 %s%%），已持续 %s 个周期（%s）" % (util, event.get("threshold"), event.get("idle_cycles"), idle),
                     "显存 %s / %s MiB%s" % (event.get("memory_used_mib"), event.get("memory_total_mib"),
                                            "，功耗 %s W" % power if power is not None else ""),
                     "进程：%s" % procs,
                     "建议：查看任务日志（数据卡住？NCCL rank 失联？），确认卡死后结束进程，别为空转的 GPU 付费。"]
        else:
            title = "[gpuguard %s] %s GPU %s idle but occupied" % (tag, host, gpu)
            lines = ["Utilization %s%% (threshold %s%%) for %s cycles (%s)" % (util, event.get("threshold"), event.get("idle_cycles"), idle),
                     "Memory %s / %s MiB%s" % (event.get("memory_used_mib"), event.get("memory_total_mib"),
                                              ", power %s W" % power if power is not None else ""),
                     "Processes: %s" % procs,
                     "What to do: check the job's log (stuck data loader? dead NCCL rank?); if it hangs, stop it rather than pay for an idle GPU."]
        if event.get("reason") == "power":
            lines.insert(1, "功耗低于上限的设定比例：可能在自旋等待" if zh else
                         "Power draw is under the set share of its limit: kernels may be spin-waiting")
        return title, lines
    if kind == "gpu_memory_leak":
        pid = event.get("pid")
        name = defuse(os.path.basename(str(event.get("name") or "")))
        slope = event.get("slope_mib_per_hour")
        oom = event.get("projected_oom_hours")
        if state == "resolved":
            title = ("[gpuguard %s] %s PID %s 显存不再增长" if zh else "[gpuguard %s] %s PID %s GPU memory stopped growing") % (tag, host, pid)
            return title, [("当前 %s，斜率 %s MiB/h" if zh else "Now %s, slope %s MiB/h") % (gib(event.get("used_memory_mib")), slope)]
        title = ("[gpuguard %s] %s PID %s %s 疑似显存泄漏" if zh else "[gpuguard %s] %s PID %s %s GPU memory leak suspected") % (tag, host, pid, name)
        oom_text = ("%.1f 小时" % oom if zh else "%.1f h" % oom) if isinstance(oom, (int, float)) else ("未知" if zh else "unknown")
        if zh:
            lines = ["增长 %+.0f MiB/h（窗口 %s），当前 %s，GPU 剩余 %s" % (slope or 0, duration(event.get("window_seconds"), lang), gib(event.get("used_memory_mib")), gib(event.get("free_memory_mib"))),
                     "预计 %s 后 OOM" % oom_text]
            if event.get("loss_plateau") is not None:
                lines.append("loss 已平台期、显存仍在涨：很可能是泄漏" if event["loss_plateau"] else "loss 仍在下降")
            lines.append("建议：检查是否保留了带计算图的张量（如累加 loss 未 .item()），或缓存无限增长；必要时先保存 checkpoint。")
        else:
            lines = ["Growing %+.0f MiB/h (window %s), now %s, GPU free %s" % (slope or 0, duration(event.get("window_seconds"), lang), gib(event.get("used_memory_mib")), gib(event.get("free_memory_mib"))),
                     "Projected OOM in %s" % oom_text]
            if event.get("loss_plateau") is not None:
                lines.append("Loss has plateaued while memory still grows: likely a leak" if event["loss_plateau"] else "Loss is still falling")
            lines.append("What to do: look for tensors kept with their graph (loss summed without .item()) or caches that never shrink; save a checkpoint first.")
        return title, lines
    if kind == "monitor_degraded":
        if state == "resolved":
            return (("[gpuguard %s] %s nvidia-smi 已恢复" if zh else "[gpuguard %s] %s nvidia-smi answers again") % (tag, host),
                    [("此前连续失败 %s 个周期" if zh else "after %s failed cycles") % event.get("failures")])
        return (("[gpuguard %s] %s 无法读取 GPU 状态" if zh else "[gpuguard %s] %s cannot read GPU state") % (tag, host),
                [("nvidia-smi 连续失败 %s 个周期：%s" if zh else "nvidia-smi failed %s cycles in a row: %s") % (event.get("failures"), defuse(event.get("error", ""))),
                 "空闲告警暂停，直到恢复；检查驱动（dmesg 中的 Xid）。" if zh else "Idle alerts are paused until it recovers; check the driver (Xid in dmesg)."])
    if kind == "test":
        return (("[gpuguard %s] %s 告警通道测试" if zh else "[gpuguard %s] %s alert channel test") % (tag, host),
                ["如果你看到这条消息，GPU 告警可以送达。" if zh else "If you can read this, GPU alerts reach you."])
    return "[gpuguard] %s %s" % (host, kind), [defuse(json.dumps(event, ensure_ascii=False))]


def truncate_bytes(text, limit):
    raw = text.encode("utf-8")
    if len(raw) <= limit:
        return text
    cut = raw[:max(0, limit - 20)].decode("utf-8", "ignore")
    return cut + "\n…(truncated)"


def mentions(env=None):
    env = ENV if env is None else env
    return [m for m in re.split(r"[\s,;]+", env.get("NOTIFY_MENTION", "")) if m]


# ----------------------------------------------------------------- bodies --

def chat_body(target, events, lang, now=None):
    """(url, JSON body) for a chat provider: one event, or a digest."""
    now = time.time() if now is None else now
    if len(events) == 1:
        title, lines = render(events[0], lang)
    else:
        hosts = sorted({str(e.get("host", "?")) for e in events})
        title = ("[gpuguard 汇总] %d 条事件（%s）" if lang == "zh" else "[gpuguard digest] %d events (%s)") % (len(events), defuse(", ".join(hosts)))
        lines = []
        for e in events:
            t, body = render(e, lang)
            lines.append(t + ": " + (body[0] if body else ""))
    firing = any(e.get("state") in ("firing", "test") for e in events)
    who = mentions() if firing else []
    limit = PROVIDER_TEXT_BYTES[target.provider]
    url = target.url
    if target.provider == "dingtalk":
        text = "### %s\n\n" % title + "\n".join("- %s" % ln for ln in lines)
        if who:
            text += "\n\n" + " ".join("@%s" % m for m in who)
        body = {"msgtype": "markdown",
                "markdown": {"title": truncate_bytes(title, 200), "text": truncate_bytes(text, limit)},
                "at": {"atMobiles": [m for m in who if m.isdigit()],
                       "atUserIds": [m for m in who if not m.isdigit()], "isAtAll": False}}
        if target.secret:
            ts = str(int(now * 1000))
            sep = "&" if "?" in url else "?"
            url = "%s%stimestamp=%s&sign=%s" % (url, sep, ts, dingtalk_sign(target.secret, ts))
        return url, body
    if target.provider == "feishu":
        text = title + "\n" + "\n".join(lines)
        if who:
            text += "\n" + "".join('<at user_id="%s"></at>' % m for m in who)
        body = {"msg_type": "text", "content": {"text": truncate_bytes(text, limit)}}
        if target.secret:
            ts = str(int(now))
            body = dict({"timestamp": ts, "sign": feishu_sign(target.secret, ts)}, **body)
        return url, body
    if target.provider == "wecom":
        text = "**%s**\n" % title + "\n".join("> %s" % ln for ln in lines)
        if who:
            text += "\n" + " ".join("<@%s>" % m for m in who)
        return url, {"msgtype": "markdown", "markdown": {"content": truncate_bytes(text, limit)}}
    if target.provider == "slack":
        text = "*%s*\n" % title + "\n".join(lines)
        text = text.replace("&", "&amp;").replace("\u2039", "&lt;").replace("\u203a", "&gt;")
        return url, {"text": truncate_bytes(text, limit)}
    # generic: the event JSON itself (a list for a digest), plus the message
    if len(events) == 1:
        body = dict(events[0])
        body["message"] = title + "\n" + "\n".join(lines)
        return url, body
    return url, {"events": events, "message": title + "\n" + "\n".join(lines)}


def iso(ts):
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


ALERTNAMES = {"gpu_idle": "GpuIdleHeld", "gpu_memory_leak": "GpuMemoryLeak",
              "monitor_degraded": "GpuguardMonitorDegraded", "test": "GpuguardTest"}


def alertmanager_alert(event, lang):
    labels = {"alertname": ALERTNAMES.get(event.get("event"), "Gpuguard"),
              "host": str(event.get("host", "")), "severity": "warning"}
    for key in ("gpu", "uuid", "pid"):
        if event.get(key) is not None:
            labels[key] = str(event[key])
    title, lines = render(event, lang)
    annotations = {"summary": title, "description": "\n".join(lines)}
    for key in ("utilization", "idle_seconds", "slope_mib_per_hour", "projected_oom_hours",
                "used_memory_mib", "error"):
        if event.get(key) is not None:
            annotations[key] = str(event[key])
    ts = float(event.get("ts") or time.time())
    alert = {"labels": labels, "annotations": annotations, "startsAt": iso(float(event.get("since") or ts))}
    if event.get("state") in ("resolved", "test"):
        alert["endsAt"] = iso(time.time())
    else:
        # Alertmanager resolves an alert not re-sent within resolve_timeout;
        # the watchdog re-sends at REPEAT_INTERVAL, so keep it open that long.
        repeat = int(ENV.get("REPEAT_INTERVAL") or 3600) or 86400
        alert["endsAt"] = iso(time.time() + 2 * repeat + 300)
    return alert


# -------------------------------------------------------------- transport --

class Outcome:
    SENT, RETRY, PERMANENT = "sent", "retry", "permanent"

    def __init__(self, kind, detail, retry_after=None):
        self.kind = kind
        self.detail = detail
        self.retry_after = retry_after


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
        return Outcome(Outcome.RETRY, "HTTP %d %s" % (status, text[:120]), ra)
    if not 200 <= status < 300:
        return Outcome(Outcome.PERMANENT, "HTTP %d %s" % (status, text[:200]))
    if provider in ("dingtalk", "wecom", "feishu"):
        try:
            data = json.loads(text)
        except ValueError:
            return Outcome(Outcome.RETRY, "unreadable reply %r" % text[:120])
        code = data.get("errcode", data.get("code", data.get("StatusCode")))
        msg = data.get("errmsg", data.get("msg", data.get("StatusMessage", "")))
        if code == 0:
            return Outcome(Outcome.SENT, "ok")
        if code in RETRY_CODES.get(provider, set()):
            return Outcome(Outcome.RETRY, "rate limited: %s %s" % (code, msg), 60.0)
        return Outcome(Outcome.PERMANENT, "error %s: %s" % (code, msg))
    if provider == "slack":
        if text.strip() == "ok":
            return Outcome(Outcome.SENT, "ok")
        return Outcome(Outcome.PERMANENT, "reply %r" % text[:120])
    return Outcome(Outcome.SENT, "HTTP %d" % status)


def post_json(url, body, timeout):
    data = json.dumps(body, ensure_ascii=False).encode("utf-8")
    req = urllib.request.Request(url, data=data, method="POST",
                                 headers={"Content-Type": "application/json; charset=utf-8",
                                          "User-Agent": "gpuguard"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read(65536), dict(resp.headers)
    except urllib.error.HTTPError as e:
        return e.code, e.read(65536) if e.fp else b"", dict(e.headers or {})


def send(target, url, body, env=None, sleep=time.sleep):
    """POSTs with retries and backoff on network errors, 5xx and 429.
    A Retry-After longer than a short wait ends the attempt: the event stays
    queued and that target is not tried again before then."""
    env = os.environ if env is None else env
    timeout = float(env.get("NOTIFY_TIMEOUT") or 5)
    tries = int(env.get("NOTIFY_RETRIES") or 3) + 1
    outcome = None
    for attempt in range(tries):
        try:
            status, reply, headers = post_json(url, body, timeout)
            outcome = classify(target.provider, status, reply, headers)
        except (urllib.error.URLError, OSError, ValueError) as e:
            reason = getattr(e, "reason", e)
            outcome = Outcome(Outcome.RETRY, "network: %s" % reason)
        if outcome.kind != Outcome.RETRY:
            return outcome
        wait = outcome.retry_after
        if wait is not None and wait > 10:
            return outcome
        if attempt + 1 < tries:
            backoff = wait if wait is not None else min(8.0, 0.5 * 2 ** attempt) * random.uniform(0.5, 1.5)
            sleep(backoff)
    return outcome


# ----------------------------------------------------------------- outbox --

class State:
    """Per-target delivery state: recent send times (rate limit), a
    not-before time, and whether a permanent error was reported."""

    def __init__(self, path):
        self.path = path
        try:
            with open(path, encoding="utf-8") as f:
                self.data = json.load(f)
        except (OSError, ValueError):
            self.data = {}

    def target(self, tid):
        return self.data.setdefault(tid, {"sent": [], "not_before": 0, "reported": "", "failures": 0})

    def save(self):
        tmp = self.path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(self.data, f)
        os.replace(tmp, self.path)


def rate_budget(target, tstate, now, env=None):
    env = os.environ if env is None else env
    per_min = int(env.get("NOTIFY_RATE_PER_MIN") or 0) or PROVIDER_RATE[target.provider]
    tstate["sent"] = [t for t in tstate["sent"] if now - t < 60]
    return per_min - len(tstate["sent"])


def outbox_items(outbox):
    try:
        names = sorted(n for n in os.listdir(outbox) if n.endswith(".json"))
    except OSError:
        return []
    return [os.path.join(outbox, n) for n in names]


def read_item(path):
    """(event, set of target ids already delivered)."""
    with open(path, encoding="utf-8") as f:
        event = json.loads(f.readline())
    done = set()
    try:
        with open(path[:-5] + ".sent", encoding="utf-8") as f:
            done = set(f.read().split())
    except OSError:
        pass
    return event, done


def mark_sent(path, tid):
    with open(path[:-5] + ".sent", "a", encoding="utf-8") as f:
        f.write(tid + "\n")


def remove_item(path):
    for p in (path, path[:-5] + ".sent"):
        try:
            os.remove(p)
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
    for path in dropped:
        remove_item(path)
    log("error", "outbox over OUTBOX_MAX=%d: dropped the %d oldest undelivered events (%s .. %s)"
        % (limit, excess, first, last))


def flush(env=None, now=None):
    """Delivers the outbox, oldest first. Per target: stop at the first
    failure so order is kept; merge a burst into one digest; respect the
    provider's rate limit. Returns the number of events still queued."""
    global ENV
    env = ENV = os.environ if env is None else env
    now = time.time() if now is None else now
    state_dir = env.get("GPUGUARD_STATE_DIR") or "."
    outbox = os.path.join(state_dir, "outbox")
    enforce_bound(outbox, int(env.get("OUTBOX_MAX") or 1000))
    try:
        targets = targets_from_env(env)
    except ValueError as e:
        log("error", str(e))
        return len(outbox_items(outbox))
    state = State(os.path.join(state_dir, "alert-state.json"))
    lang = language(env)
    items = []
    for path in outbox_items(outbox):
        try:
            items.append((path,) + read_item(path))
        except (OSError, ValueError):
            log("error", "unreadable outbox file %s moved aside" % os.path.basename(path))
            os.replace(path, path + ".bad")
    for target in targets:
        tstate = state.target(target.id)
        if now < tstate.get("not_before", 0):
            continue
        pending = [(p, e) for p, e, done in items if target.id not in done]
        while pending:
            budget = rate_budget(target, tstate, now, env)
            if budget <= 0:
                log("warn", "%s: rate limit reached; %d events wait" % (target.label(), len(pending)))
                break
            if target.provider == "alertmanager":
                batch = pending[:64]
                url = target.url + "/api/v2/alerts"
                body = [alertmanager_alert(e, lang) for _, e in batch]
            elif target.provider == "generic":
                # Machine consumers get the event schema, one per POST.
                batch = pending[:1]
                url, body = chat_body(target, [e for _, e in batch], lang, now)
            else:
                # A burst (more than one waiting) goes out as one digest.
                batch = pending[:20]
                url, body = chat_body(target, [e for _, e in batch], lang, now)
            outcome = send(target, url, body, env)
            if outcome.kind == Outcome.SENT:
                tstate["sent"].append(now)
                tstate["failures"] = 0
                if tstate.get("reported"):
                    log("info", "%s: delivering again" % target.label())
                tstate["reported"] = ""
                for path, _ in batch:
                    mark_sent(path, target.id)
                pending = pending[len(batch):]
                continue
            wait = outcome.retry_after or 0
            if outcome.kind == Outcome.PERMANENT:
                wait = max(wait, PERMANENT_RETRY_AFTER)
                if tstate.get("reported") != outcome.detail:
                    log("error", "%s rejected the alert: %s; %d events stay queued, retried every %d s until the target is fixed"
                        % (target.label(), outcome.detail, len(pending), PERMANENT_RETRY_AFTER))
                    tstate["reported"] = outcome.detail
            else:
                tstate["failures"] = tstate.get("failures", 0) + 1
                # the exponent is capped: a float overflows past 2**1023, and
                # the pause is capped at MAX_RETRY_AFTER long before that
                wait = max(wait, DOWN_BACKOFF * 2 ** min(tstate["failures"] - 1, 16))
                log("warn", "%s: %s; %d events stay queued (next try in %d s)"
                    % (target.label(), outcome.detail, len(pending), min(wait, MAX_RETRY_AFTER)))
            tstate["not_before"] = now + min(wait, MAX_RETRY_AFTER if outcome.kind == Outcome.RETRY else PERMANENT_RETRY_AFTER)
            break
    ids = {t.id for t in targets}
    left = 0
    for path, _, _ in items:
        try:
            _, done = read_item(path)
        except (OSError, ValueError):
            continue
        if ids <= done:
            remove_item(path)
        else:
            left += 1
    state.save()
    return left


def test_alert(env=None):
    global ENV
    env = ENV = os.environ if env is None else env
    targets = targets_from_env(env)
    if not targets:
        print("no target configured: set NOTIFY_URL or ALERTMANAGER_URL")
        return 1
    event = {"ts": int(time.time()), "host": env.get("GPUGUARD_HOST") or os.uname().nodename,
             "event": "test", "state": "test"}
    lang = language(env)
    failed = 0
    for target in targets:
        if target.provider == "alertmanager":
            url, body = target.url + "/api/v2/alerts", [alertmanager_alert(event, lang)]
        else:
            url, body = chat_body(target, [event], lang)
        outcome = send(target, url, body, env)
        print(scrub("%-8s %s: %s" % (outcome.kind, target.label(), outcome.detail)))
        failed += outcome.kind != Outcome.SENT
    return 1 if failed else 0


def main(argv):
    cmd = argv[1] if len(argv) > 1 else ""
    try:
        if cmd == "flush":
            flush()
            return 0
        if cmd == "test":
            return test_alert()
        if cmd == "render":
            event = json.loads(sys.stdin.readline())
            title, lines = render(event, language())
            print(title)
            print("\n".join(lines))
            return 0
    except ValueError as e:
        print("gpuguard_alert: %s" % scrub(e), file=sys.stderr)
        return 2
    print("usage: gpuguard_alert.py flush|test|render", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
