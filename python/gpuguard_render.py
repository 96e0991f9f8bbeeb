"""gpuguard's alert texts: events turned into what a person reads.

Everything here is pure: no file, no network, no clock but the event's
own times (and now, where an event has none). python/gpuguard_alert.py
delivers what these functions return (signing, transport, the outbox).

- the language of a target (Chinese for the Chinese chat tools) and the
  message tables (python/gpuguard_messages_zh.py, _en.py)
- one digest per flush (render_digest): events grouped per host, kind,
  state and job, each group a section (idle, stuck, degraded, leak,
  monitor, test, the ledger's daily digest)
- the body each chat platform takes (chat_body: DingTalk, Feishu, WeCom,
  Slack markdown or text, the generic JSON), unsigned
- Alertmanager's alerts (alertmanager_alerts), labelled as the Prometheus
  rules label theirs

Untrusted text (process names, command lines) is defused (no @mention on
any platform) and its secrets masked (python/gpuguard_secrets.py).

Standard library only: it must run on a bare GPU box.
"""
import hashlib
import json
import math
import os
import re
import time

import gpuguard_ledger
import gpuguard_messages_en
import gpuguard_messages_zh
from gpuguard_secrets import scrub

TABLES = {"en": gpuguard_messages_en.MESSAGES, "zh": gpuguard_messages_zh.MESSAGES}
# The same tables for Ascend NPUs (an event with "vendor": "ascend"): they
# say NPU and npu-smi where the others say GPU and nvidia-smi.
NPU_TABLES = {"en": gpuguard_messages_en.NPU_MESSAGES, "zh": gpuguard_messages_zh.NPU_MESSAGES}
# The language a target gets unless NOTIFY_LANG or its own prefix says
# otherwise: the Chinese platforms get Chinese, whatever LANG the daemon has.
PROVIDER_LANG = {"dingtalk": "zh", "feishu": "zh", "wecom": "zh", "slack": "en",
                 "generic": "en", "alertmanager": "en"}
# Body size limits, in UTF-8 bytes, with a margin for the JSON envelope.
PROVIDER_TEXT_BYTES = {"dingtalk": 18000, "wecom": 3900, "feishu": 18000,
                       "slack": 35000, "generic": 1 << 20}
# Groups shown in one digest; the rest are counted in a last line.
DIGEST_MAX_GROUPS = 40


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


def mask_cmdline(cmd, env, limit=160):
    """The command line as it may be shown: secrets masked (the job info
    should be masked already; this holds for events that are not), cut."""
    cmd = str(cmd)
    cmd = SECRET_ARG.sub(r"\1***", cmd)
    cmd = SECRET_ASSIGN.sub(r"\1***", cmd)
    cmd = URL_CREDS.sub(r"\1***@", cmd)
    cmd = scrub(cmd, env)
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


def job_label(events, lang, env):
    """A short name for the job holding a group's GPUs."""
    jobs = [j for e in events for j in jobs_of(e)]
    if jobs:
        j = jobs[0]
        if j.get("slurm_job"):
            return msg(lang, "job_slurm", id=defuse(j["slurm_job"]))
        if j.get("container"):
            return msg(lang, "job_container", id=defuse(j["container"]))
        if j.get("cmdline"):
            return msg(lang, "job_cmd", cmd=mask_cmdline(j["cmdline"], env, 60))
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


def job_lines(events, lang, env):
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
        more.append(msg(lang, "job_cmdline", cmd=mask_cmdline(first["cmdline"], env)))
    if first.get("cwd"):
        more.append(msg(lang, "job_cwd", cwd=defuse(mask_cmdline(first["cwd"], env, 100))))
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
                 job=job_label(events, lang, env))]
    reasons = {str(e.get("reason")) for e in events}
    if reasons & {"spin", "spinning", "stuck"}:
        lines.append(msg(lang, "idle_spin"))
    elif "power" in reasons:
        lines.append(msg(lang, "idle_power"))
    lines += job_lines(events, lang, env)
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
             msg(lang, "stuck_held", job=job_label(events, lang, env),
                 idle=duration(max((as_int(e.get("idle_seconds")) or 0) for e in events), lang))]
    lines += job_lines(events, lang, env)
    lines.append(msg(lang, "stuck_values", memory=memory_held(events, lang),
                     threshold=span([e.get("idle_power_pct") for e in events]) or unknown))
    lines += uuid_lines(events, lang)
    lines += cost_lines(events, lang, env)
    lines.append(msg(lang, "stuck_hint", pid=first_pid(events)))
    return lines


def stuck_resolved_lines(events, lang, env):
    reason = str(events[0].get("reason") or "")
    key = {"busy": "stuck_busy", "released": "stuck_released"}.get(reason, "stuck_resolved_other")
    return [msg(lang, key, gpus=ranges([e.get("gpu") for e in events]),
                idle=duration(max((as_int(e.get("idle_seconds")) or 0) for e in events), lang),
                job=job_label(events, lang, env), reason=defuse(reason),
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


def idle_resolved_lines(events, lang, env):
    gpus = ranges([e.get("gpu") for e in events])
    idle = duration(max((as_int(e.get("idle_seconds")) or 0) for e in events), lang)
    job = job_label(events, lang, env)
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
            return msg(lang, "what_idle_resolved", gpus=gpus), idle_resolved_lines(group, lang, env)
        return msg(lang, "what_idle", gpus=gpus), idle_group_lines(group, lang, env, digest)
    if kind == "gpu_stuck":
        gpus = ranges([x.get("gpu") for x in group])
        if state == "resolved":
            return msg(lang, "what_stuck_resolved", gpus=gpus), stuck_resolved_lines(group, lang, env)
        return msg(lang, "what_stuck", gpus=gpus), stuck_group_lines(group, lang, env)
    if kind == "gpu_degraded":
        gpus = ranges([x.get("gpu") for x in group])
        if state == "resolved":
            return msg(lang, "what_degraded_resolved", gpus=gpus), degraded_lines(group, lang)
        return msg(lang, "what_degraded", gpus=gpus, fault=fault_text(group, lang)), degraded_lines(group, lang)
    if kind == "gpu_memory_leak":
        return leak_render(e, lang, env)
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


def leak_render(e, lang, env):
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
        name = job_label([e], lang, env)
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
    lines += job_lines([e], lang, env)
    if e.get("loss_plateau") is not None:
        lines.append(msg(lang, "leak_plateau" if e["loss_plateau"] else "leak_falling"))
    lines.append(msg(lang, "leak_hint"))
    return msg(lang, "what_leak_trend" if trend_note else "what_leak", pid=pid, name=name), lines


def render_digest(events, lang, env=None):
    """(title, sections) of one message for all of a flush's events; each
    section is (head, detail lines), one per group (job/GPUs)."""
    env = os.environ if env is None else env
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


def render(event, lang, env=None):
    """(title, lines) of the message for one event."""
    title, sections = render_digest([event], lang, env)
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


def mentions(env):
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


def chat_body(provider, events, lang, env=None):
    """The JSON body of one digest for a chat or generic target, before
    signing (python/gpuguard_alert.py signs it)."""
    env = os.environ if env is None else env
    title, sections = render_digest(events, lang, env)
    who = mentions(env) if any(is_page(e) for e in events) else []
    limit = PROVIDER_TEXT_BYTES[provider]
    text = truncate_bytes(chat_text(provider, title, sections, who), limit, lang)
    if provider == "dingtalk":
        return {"msgtype": "markdown",
                "markdown": {"title": truncate_bytes(title, 200, lang), "text": text},
                "at": {"atMobiles": [m for m in who if m.isdigit()],
                       "atUserIds": [m for m in who if not m.isdigit()], "isAtAll": False}}
    if provider == "feishu":
        return {"msg_type": "text", "content": {"text": text}}
    if provider == "wecom":
        return {"msgtype": "markdown", "markdown": {"content": text}}
    if provider == "slack":
        return {"text": text}
    # generic: the events themselves (machine consumers), with the message
    return {"title": title, "message": text, "lang": lang, "id": digest_key(events), "events": events}


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


def alertmanager_alerts(event, lang="en", now=None, env=None):
    """The Alertmanager alerts for one event: one, or for a resolved leak
    of unknown severity one per name and severity it may have fired as."""
    if event.get("event") == "ledger_digest":
        return []               # a daily report, not an alert
    alert = alertmanager_alert(event, lang, now, env)
    if event.get("event") != "gpu_memory_leak" or state_class(event) != "resolved" or \
            event.get("severity") in SEVERITY_RANK:
        return [alert]
    out = []
    for name, sev in LEAK_RESOLVE_AS:
        labels = dict(alert["labels"], alertname=name, severity=sev)
        out.append(dict(alert, labels=labels))
    return out


def alertmanager_alert(event, lang="en", now=None, env=None):
    env = os.environ if env is None else env
    now = time.time() if now is None else now
    title, lines = render(event, lang, env)
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
        repeat = as_int(env.get("REPEAT_INTERVAL") or 3600) or 86400
        alert["endsAt"] = iso(now + 2 * repeat + 300)
    host = str(event.get("host") or "")
    if re.match(r"^[A-Za-z0-9.-]+$", host):
        alert["generatorURL"] = f"http://{host}/gpuguard"
    return alert
