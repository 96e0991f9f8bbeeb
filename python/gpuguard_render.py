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

_TABLES = {"en": gpuguard_messages_en.MESSAGES, "zh": gpuguard_messages_zh.MESSAGES}
# The languages a target may speak (NOTIFY_LANG, a "LANG+" prefix).
LANGUAGES = tuple(_TABLES)
# The same tables for Ascend NPUs (an event with "vendor": "ascend"): they
# say NPU and npu-smi where the others say GPU and nvidia-smi.
_NPU_TABLES = {"en": gpuguard_messages_en.NPU_MESSAGES, "zh": gpuguard_messages_zh.NPU_MESSAGES}
# The language a target gets unless NOTIFY_LANG or its own prefix says
# otherwise: the Chinese platforms get Chinese, whatever LANG the daemon has.
PROVIDER_LANG = {"dingtalk": "zh", "feishu": "zh", "wecom": "zh", "slack": "en",
                 "generic": "en", "alertmanager": "en"}
# Body size limits, in UTF-8 bytes, with a margin for the JSON envelope.
_PROVIDER_TEXT_BYTES = {"dingtalk": 18000, "wecom": 3900, "feishu": 18000,
                       "slack": 35000, "generic": 1 << 20}
# Groups shown in one digest; the rest are counted in a last line.
_DIGEST_MAX_GROUPS = 40


# --------------------------------------------------------------- messages --

def language(env=None):
    """The language for every target when NOTIFY_LANG says one, else None
    (each target then speaks its provider's default). LANG is not read: a
    daemon under LANG=C still writes Chinese to a DingTalk group."""
    env = os.environ if env is None else env
    lang = env.get("NOTIFY_LANG", "")
    return lang if lang in _TABLES else None


def _msg(lang, key, **fields):
    if lang.endswith("-npu"):
        return _NPU_TABLES[lang[:-4]][key].format(**fields)
    return _TABLES[lang][key].format(**fields)


def _duration(seconds, lang):
    try:
        seconds = max(0, int(float(seconds or 0)))
    except (TypeError, ValueError):
        return _msg(lang, "unknown")
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    if h:
        return _msg(lang, "dur_hm", h=h, m=m)
    if m:
        return _msg(lang, "dur_m", m=m)
    return _msg(lang, "dur_s", s=s)


def _defuse(text):
    """Makes untrusted text (process names, command lines) unable to mention
    anyone on any platform: @all, <at ...>, <@id>, <!channel>, @everyone."""
    text = str(text)
    text = text.replace("@", "\uff20")          # fullwidth at sign
    text = text.replace("<", "\u2039").replace(">", "\u203a")
    return text


_SECRET_ARG = re.compile(
    r"(?i)(--?(?:[\w-]*(?:token|secret|password|passwd|api[-_]?key|apikey|credential|jwt|cookie)s?)[= ])(\S+)")
_SECRET_ASSIGN = re.compile(r"(?i)\b([\w.-]*(?:token|secret|password|passwd|api[-_]?key|apikey)s?=)([^\s&]+)")
_URL_CREDS = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/\s:@]+:[^/\s@]+@")


def _mask_cmdline(cmd, env, limit=160):
    """The command line as it may be shown: secrets masked (the job info
    should be masked already; this holds for events that are not), cut."""
    cmd = str(cmd)
    cmd = _SECRET_ARG.sub(r"\1***", cmd)
    cmd = _SECRET_ASSIGN.sub(r"\1***", cmd)
    cmd = _URL_CREDS.sub(r"\1***@", cmd)
    cmd = scrub(cmd, env)
    if len(cmd) > limit:
        cmd = cmd[:limit - 1] + "…"
    return _defuse(cmd)


def _gib(mib, lang):
    try:
        return _msg(lang, "gib", v=float(mib) / 1024)
    except (TypeError, ValueError):
        return _msg(lang, "unknown")


def _as_int(value):
    try:
        return int(float(value))
    except (TypeError, ValueError):
        return None


def _ranges(numbers):
    """"0-3,5,7" for [0, 1, 2, 3, 5, 7]; "?" for unknown indices."""
    converted = [_as_int(x) for x in numbers]
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


def _span(values, unit=""):
    """"6%" or "0-6%" over a group's values; None when none is known."""
    nums = [float(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
    if not nums:
        return None
    lo, hi = min(nums), max(nums)
    fmt = (lambda x: str(int(x))) if all(n == int(n) for n in nums) else (lambda x: f"{x:.0f}")
    return (fmt(lo) if lo == hi else f"{fmt(lo)}-{fmt(hi)}") + unit


def _jobs_of(event):
    """The holding jobs of an event (ARCHITECTURE.md, rule 5: a "job" object or a list of them)."""
    j = event.get("jobs")
    if j is None:
        j = event.get("job")
    if isinstance(j, dict):
        j = [j]
    return [x for x in j if isinstance(x, dict)] if isinstance(j, list) else []


def _main_job(event):
    """The job an event names (its "job": the one holding the most memory
    when several share the GPU), else the first of its jobs; None when none."""
    j = event.get("job")
    if isinstance(j, dict):
        return j
    jobs = _jobs_of(event)
    return jobs[0] if jobs else None


def _other_jobs(events):
    """The jobs of a group's GPUs besides the ones its events name, each once."""
    mains = [_main_job(e) for e in events]
    out = []
    for e in events:
        for j in _jobs_of(e):
            if j in mains or j in out:
                continue
            if _as_int(j.get("pid")) is not None and any(_as_int(m.get("pid")) == _as_int(j.get("pid"))
                                                         for m in mains + out if m):
                continue
            out.append(j)
    return out


def _with_incident_job(event):
    """A resolved event whose GPU holds no job now, seen with the job its
    incident's alerts named ("incident_job", else "incident_job_pid"): a job
    that ended and freed the GPU is named, not taken for a hidden one."""
    if _state_class(event) != "resolved" or _jobs_of(event) or _procs_of(event):
        return event
    job = event.get("incident_job")
    if not isinstance(job, dict) and _as_int(event.get("incident_job_pid")) is not None:
        job = {"pid": event["incident_job_pid"]}
    return dict(event, job=job, jobs=None) if isinstance(job, dict) else event


def _procs_of(event):
    p = event.get("processes")
    return [x for x in p if isinstance(x, dict)] if isinstance(p, list) else []


def _proc_name(p):
    return os.path.basename(str(p.get("name") or "?")) or "?"


_RANK_ARG = re.compile(r"\s--local[-_]rank[= ]\d+")


def _job_key(event):
    """What "the same job" means when grouping GPUs into one digest line:
    the Slurm job, else the container, else user + command + folder (the
    ranks of one torchrun), else the PID of a job known by nothing more,
    else the process names."""
    j = _main_job(event)
    if j:
        for key in ("slurm_job", "container"):
            if j.get(key):
                return (key, str(j[key]))
        # a job this namespace cannot see (a container's host PID) has no
        # user, command or folder to tell it from another: its PID is all
        # that says which job it is, so two of them stay two groups
        if not j.get("cmdline"):
            return ("pid", str(j.get("pid")))
        # ranks launched by the older torch.distributed.launch differ only
        # in --local_rank=N: still one job
        cmd = _RANK_ARG.sub("", str(j.get("cmdline")))
        return ("job", str(j.get("user")), cmd, str(j.get("cwd")))
    procs = _procs_of(event)
    if procs:
        return ("procs",) + tuple(sorted({_proc_name(p) for p in procs}))
    return ("none",)


def _job_label(events, lang, env):
    """A short name for the job holding a group's GPUs: the one its events
    name, not whichever of several sharing a GPU was listed first."""
    main = next((j for j in (_main_job(e) for e in events) if j), None)
    label = _one_job_label(main, lang, env) if main else None
    if label:
        return label
    procs = [p for e in events for p in _procs_of(e)]
    if procs:
        names = sorted({_defuse(_proc_name(p))[:48] for p in procs})
        pids = _ranges([p.get("pid") for p in procs])
        return "{} ({})".format(", ".join(names[:3]), _msg(lang, "job_pids", pids=pids))
    return _msg(lang, "job_unknown")


def _one_job_label(j, lang, env):
    """A short name for one job object (Slurm job, container, command or
    PID); None when it carries none of them."""
    if j.get("slurm_job"):
        return _msg(lang, "job_slurm", id=_defuse(j["slurm_job"]))
    if j.get("container"):
        return _msg(lang, "job_container", id=_defuse(j["container"]))
    if j.get("cmdline"):
        return _msg(lang, "job_cmd", cmd=_mask_cmdline(_short_cmdline(j["cmdline"]), env, 60))
    if j.get("pid") is not None:
        return _msg(lang, "job_pid", pid=_defuse(j["pid"]))
    return None


def _short_cmdline(cmd):
    """A command line as a headline names a job, as `gpuguard status` does
    (lib/doctor.sh): the folders of the interpreter and of the script
    dropped. Sixty characters of "/home/u/miniconda3/envs/sft/bin/python
    /home/u/..." named no job; "python torchrun --nproc-per-node 8
    sft.py --run exp7" does. The message's command line stays whole."""
    words = str(cmd).split(" ")
    for i in range(min(2, len(words))):
        w = words[i]
        if "/" in w and not w.startswith("-") and "=" not in w and "'" not in w:
            words[i] = w.rstrip("/").rsplit("/", 1)[-1] or w
    return " ".join(words)


def _when(ts):
    try:
        return time.strftime("%Y-%m-%d %H:%M", time.localtime(float(ts)))
    except (TypeError, ValueError, OverflowError, OSError):
        return None


def _job_pids(j):
    """The PIDs of one job object: its GPU processes ("pids") and its top process."""
    pids = [p for p in j.get("pids") if _as_int(p) is not None] if isinstance(j.get("pids"), list) else []
    if _as_int(j.get("pid")) is not None:
        pids.append(j.get("pid"))
    return pids


def _job_lines(events, lang, env):
    """Who and what: user, PIDs, start and elapsed, command, folder of the
    job the group's events name; then a line for each other job on its GPUs."""
    jobs = [j for e in events for j in _jobs_of(e)]
    named = [j for j in (_main_job(e) for e in events) if j]
    procs = [p for e in events for p in _procs_of(e)]
    first = named[0] if named else {}
    parts = []
    users = sorted({str(j["user"]) for j in named if j.get("user")})
    if users:
        parts.append(_msg(lang, "job_user", user=_defuse(", ".join(users))))
    pids = [p for j in named for p in _job_pids(j)]
    if pids:
        parts.append(_msg(lang, "job_pids", pids=_ranges(pids)))
    ranks = sorted({_as_int(j.get("rank")) for j in named if _as_int(j.get("rank")) is not None})
    if ranks:
        parts.append(_msg(lang, "job_rank", rank=_ranges(ranks)))
    start = _when(first.get("start_ts")) if first.get("start_ts") is not None else None
    if start:
        elapsed = first.get("elapsed_s")
        parts.append(_msg(lang, "job_started", start=start,
                         elapsed=_duration(elapsed, lang) if elapsed is not None else _msg(lang, "unknown")))
    lines = [" · ".join(parts)] if parts else []
    more = []
    if first.get("cmdline"):
        more.append(_msg(lang, "job_cmdline", cmd=_mask_cmdline(first["cmdline"], env)))
    if first.get("cwd"):
        more.append(_msg(lang, "job_cwd", cwd=_defuse(_mask_cmdline(first["cwd"], env, 100))))
    if more:
        lines.append(" · ".join(more))
    others = _other_jobs(events)
    lines += [_other_job_line(j, lang, env) for j in others[:5]]
    if len(others) > 5:
        lines.append(_msg(lang, "more", n=len(others) - 5))
    # the processes nvidia-smi listed, with name and memory, unless a job
    # read from /proc names what runs (a job with only a PID, "visible":
    # false in a container or after the process went, tells less than them)
    if procs and not any(j.get("cmdline") for j in jobs):
        items = ["{} {} ({} MiB)".format(p.get("pid"), _defuse(_proc_name(p))[:48], p.get("used_memory_mib"))
                 for p in procs[:10]]
        if len(procs) > 10:
            items.append(_msg(lang, "more", n=len(procs) - 10))
        lines.append(_msg(lang, "procs", procs=", ".join(items)))
    return lines


def _other_job_line(j, lang, env):
    """One line for a job sharing the GPU with the named one: its Slurm job
    or container, user, PIDs, memory and whole command, so two jobs started
    from the same folder by the same interpreter can still be told apart."""
    parts = []
    for key, msg in (("slurm_job", "job_slurm"), ("container", "job_container")):
        if j.get(key):
            parts.append(_msg(lang, msg, id=_defuse(j[key])))
    if j.get("user"):
        parts.append(_msg(lang, "job_user", user=_defuse(j["user"])))
    if _job_pids(j):
        parts.append(_msg(lang, "job_pids", pids=_ranges(_job_pids(j))))
    if _number(j.get("used_memory_mib")) is not None:
        parts.append(_gib(j["used_memory_mib"], lang))
    if j.get("cmdline"):
        parts.append(_msg(lang, "job_cmdline", cmd=_mask_cmdline(j["cmdline"], env)))
    return _msg(lang, "job_other", details=" · ".join(parts) or _msg(lang, "unknown"))


def _parse_price(value):
    """(number, currency) from "30", "¥30", "2.5 USD"; None when unset/bad."""
    text = str(value or "").strip()
    m = re.match(r"^([^\d.\s]*)\s*(\d+(?:\.\d+)?)\s*([^\d\s]*)$", text)
    if not text or not m:
        return None
    price = float(m.group(2))
    if price <= 0 or price > 1e6:
        return None
    return price, (m.group(1) or m.group(3) or "")


def _money(amount, currency, lang):
    currency = currency or _msg(lang, "currency")
    shown = f"{amount:.0f}" if amount >= 100 else f"{amount:.2f}"
    if not currency:
        return shown
    return (f"{currency} {shown}") if not currency.isalpha() else (f"{shown} {currency}")


def _idle_group_lines(events, lang, env, digest):
    """The lines for GPUs of one job going idle (firing/reminder)."""
    gpus = _ranges([e.get("gpu") for e in events])
    idle_s = max((_as_int(e.get("idle_seconds")) or 0) for e in events)
    lines = [_msg(lang, "idle_head", gpus=gpus, model=_gpu_model(events), idle=_duration(idle_s, lang),
                 job=_job_label(events, lang, env))]
    reasons = {str(e.get("reason")) for e in events}
    if reasons & {"spin", "spinning", "stuck"}:
        lines.append(_msg(lang, "idle_spin"))
    elif "power" in reasons:
        lines.append(_msg(lang, "idle_power"))
    lines += _job_lines(events, lang, env)
    unknown = _msg(lang, "unknown")
    memory = _memory_held(events, lang)
    threshold = _span([e.get("threshold") for e in events]) or unknown
    lines.append(_msg(lang, "idle_values", util=_span([e.get("utilization") for e in events], "%") or unknown,
                     threshold=threshold, power=_span([e.get("power_draw_w") for e in events], " W") or unknown,
                     memory=memory))
    lines += _uuid_lines(events, lang)
    lines += _cost_lines(events, lang, env)
    lines.append(_msg(lang, "idle_hint", pid=_first_pid(events)))
    return lines


def _cost_lines(events, lang, env):
    """What the idle (or stuck) time of a group has cost so far, when a
    GPU-hour price is set; the event's currency (GPU_PRICE_CURRENCY) is
    used when the price itself names none."""
    price = _parse_price(next((e.get("gpu_hour_price") for e in events if e.get("gpu_hour_price")), None)
                        or env.get("GPU_HOUR_PRICE"))
    if not price:
        return []
    currency = price[1] or next((_defuse(e["currency"])[:8] for e in events
                                 if isinstance(e.get("currency"), str) and e["currency"]), "")
    gpu_hours = sum((_as_int(e.get("idle_seconds")) or 0) for e in events) / 3600.0
    return [_msg(lang, "idle_cost", cost=_money(gpu_hours * price[0], currency, lang),
                gpu_hours=f"{gpu_hours:.1f}", price=_money(price[0], currency, lang))]


def _first_pid(events):
    """A PID of the job the group's events name, for the hints: one of its
    GPU processes, else its top process, else a listed GPU process ("PID"
    when none is known)."""
    named = [j for j in (_main_job(e) for e in events) if j]
    pids = [p for j in named for p in _job_pids(j)] + [p.get("pid") for e in events for p in _procs_of(e)]
    return next((p for p in pids if _as_int(p) is not None), "PID")


def _gpu_model(events):
    names = sorted({str(e["gpu_name"]) for e in events if e.get("gpu_name")})
    return " ({})".format(_defuse(", ".join(names))) if names else ""


def _uuid_lines(events, lang):
    uuids = [str(e["uuid"]) for e in events if e.get("uuid")]
    if not uuids:
        return []
    shown = uuids if len(uuids) <= 2 else [u[:12] + "…" for u in uuids]
    return [_msg(lang, "idle_uuids", uuids=_defuse(", ".join(shown)))]


def _memory_held(events, lang):
    used = [e.get("memory_used_mib") for e in events]
    if all(isinstance(u, (int, float)) for u in used) and len(set(used)) == 1 and len(used) > 1:
        return _msg(lang, "mem_each", n=len(used), each=_gib(used[0], lang))
    if any(isinstance(u, (int, float)) for u in used):
        return _gib(sum(u for u in used if isinstance(u, (int, float))), lang)
    return _msg(lang, "unknown")


def _number(value):
    """A finite number from an event field, else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return value if math.isfinite(value) else None


def _stuck_group_lines(events, lang, env):
    """The lines for GPUs of one job stuck spinning (firing/reminder):
    busy at the idle floor's power, for how long, who, the cost, a hint."""
    unknown = _msg(lang, "unknown")
    pcts = []
    for e in events:
        power, limit = _number(e.get("power_draw_w")), _number(e.get("power_limit_w"))
        if power is not None and limit:
            pcts.append(round(power * 100.0 / limit))
    cycles = _span([e.get("spin_cycles") for e in events]) or _span([e.get("idle_cycles") for e in events])
    lines = [_msg(lang, "stuck_head", gpus=_ranges([e.get("gpu") for e in events]), model=_gpu_model(events),
                 util=_span([e.get("utilization") for e in events], " %") or unknown,
                 power=_span([e.get("power_draw_w") for e in events], " W") or unknown,
                 pct=_span(pcts, " %") or unknown,
                 limit=_span([e.get("power_limit_w") for e in events], " W") or unknown,
                 cycles=cycles or unknown),
             _msg(lang, "stuck_held", job=_job_label(events, lang, env),
                 idle=_duration(max((_as_int(e.get("idle_seconds")) or 0) for e in events), lang))]
    lines += _job_lines(events, lang, env)
    lines.append(_msg(lang, "stuck_values", memory=_memory_held(events, lang),
                     threshold=_span([e.get("idle_power_pct") for e in events]) or unknown))
    lines += _uuid_lines(events, lang)
    lines += _cost_lines(events, lang, env)
    lines.append(_msg(lang, "stuck_hint", pid=_first_pid(events)))
    return lines


def _stuck_resolved_lines(events, lang, env):
    reason = str(events[0].get("reason") or "")
    key = {"busy": "stuck_busy", "released": "stuck_released"}.get(reason, "stuck_resolved_other")
    return [_msg(lang, key, gpus=_ranges([e.get("gpu") for e in events]),
                idle=_duration(max((_as_int(e.get("idle_seconds")) or 0) for e in events), lang),
                job=_job_label([_with_incident_job(e) for e in events], lang, env), reason=_defuse(reason),
                power=_span([e.get("power_draw_w") for e in events], " W") or _msg(lang, "unknown"))]


def _degraded_lines(events, lang):
    """A GPU whose line nvidia-smi prints as a device fault: which GPU
    (index, model, UUID), which fault, what to check."""
    gpus = _ranges([e.get("gpu") for e in events])
    cycles = _span([e.get("faulted_cycles") for e in events]) or _msg(lang, "unknown")
    if _state_class(events[0]) == "resolved":
        key = "degraded_gone" if events[0].get("reason") == "gone" else "degraded_resolved"
        return [_msg(lang, key, gpus=gpus, model=_gpu_model(events), cycles=cycles)] + _uuid_lines(events, lang)
    index = next((str(_as_int(e.get("gpu"))) for e in events if _as_int(e.get("gpu")) is not None), "N")
    lines = [_msg(lang, "degraded_head", gpus=gpus, model=_gpu_model(events), fault=_fault_text(events, lang),
                 cycles=cycles)]
    lines += _uuid_lines(events, lang)
    lines.append(_msg(lang, "degraded_hint", index=index if len(events) == 1 else gpus))
    return lines


def _fault_text(events, lang):
    faults = sorted({str(e["fault"]) for e in events if e.get("fault")})
    return _defuse(", ".join(faults))[:120] if faults else _msg(lang, "unknown")


def _idle_resolved_lines(events, lang, env):
    gpus = _ranges([e.get("gpu") for e in events])
    idle = _duration(max((_as_int(e.get("idle_seconds")) or 0) for e in events), lang)
    job = _job_label([_with_incident_job(e) for e in events], lang, env)
    reason = str(events[0].get("reason") or "")
    util = _span([e.get("utilization") for e in events], "%") or _msg(lang, "unknown")
    key = {"busy": "idle_busy", "released": "idle_released", "gone": "idle_gone"}.get(reason, "idle_resolved_other")
    return [_msg(lang, key, gpus=gpus, idle=idle, job=job, util=util, reason=_defuse(reason))]


def _state_class(event):
    s = event.get("state", "firing")
    return "firing" if s in ("firing", "reminder") else s


def _group_events(events):
    """Groups a flush's events for one digest: per host, kind, state and job
    (idle: the GPUs of one job together), in order of first appearance."""
    groups = {}
    for e in events:
        kind = e.get("event")
        if kind in ("gpu_idle", "gpu_stuck"):
            extra = _job_key(_with_incident_job(e)) + ((str(e.get("reason")),) if _state_class(e) == "resolved" else ())
        elif kind == "gpu_degraded":
            # faulted GPUs together, per fault (one line: "GPU 2,5: GPU requires reset")
            extra = (str(e.get("fault")) if _state_class(e) == "firing" else str(e.get("reason")),)
        elif kind == "gpu_memory_leak":
            extra = (str(e.get("pid")),)
        elif kind == "monitor_degraded":
            extra = ()
        else:
            extra = (id(e),)
        key = (str(e.get("host", "?")), kind, _state_class(e), e.get("vendor", "nvidia")) + extra
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
    firing = sorted((g for g in out if _state_class(g[0]) == "firing"),
                    key=lambda g: -_SEVERITY_RANK.get(_severity(g[0]), 1))
    return firing + [g for g in out if _state_class(g[0]) != "firing"]


_SEVERITY_RANK = {"info": 0, "warning": 1, "critical": 2}


def _severity(event):
    """critical, warning or info: the event's own (the leak detector's
    severity by projected time to OOM; gpu_degraded), else the kind's."""
    value = event.get("severity")
    if value in _SEVERITY_RANK:
        return value
    return _SEVERITY.get(event.get("event"), "warning")


def _is_page(event):
    """A firing event that pages (an @mention): a trend note does not."""
    return _state_class(event) in ("firing", "test") and _severity(event) != "info"


def _group_render(group, lang, env, digest=False):
    """(what, lines) for one group: the short subject and its lines."""
    e = group[0]
    kind = e.get("event")
    state = _state_class(e)
    if kind == "gpu_idle":
        gpus = _ranges([x.get("gpu") for x in group])
        if state == "resolved":
            return _msg(lang, "what_idle_resolved", gpus=gpus), _idle_resolved_lines(group, lang, env)
        return _msg(lang, "what_idle", gpus=gpus), _idle_group_lines(group, lang, env, digest)
    if kind == "gpu_stuck":
        gpus = _ranges([x.get("gpu") for x in group])
        if state == "resolved":
            return _msg(lang, "what_stuck_resolved", gpus=gpus), _stuck_resolved_lines(group, lang, env)
        return _msg(lang, "what_stuck", gpus=gpus), _stuck_group_lines(group, lang, env)
    if kind == "gpu_degraded":
        gpus = _ranges([x.get("gpu") for x in group])
        if state == "resolved":
            return _msg(lang, "what_degraded_resolved", gpus=gpus), _degraded_lines(group, lang)
        return _msg(lang, "what_degraded", gpus=gpus, fault=_fault_text(group, lang)), _degraded_lines(group, lang)
    if kind == "gpu_memory_leak":
        return _leak_render(e, lang, env)
    if kind == "monitor_degraded":
        if state == "resolved":
            return _msg(lang, "what_monitor_resolved"), [_msg(lang, "monitor_resolved", failures=e.get("failures"))]
        return _msg(lang, "what_monitor"), [
            _msg(lang, "monitor_failed", failures=e.get("failures"), error=_defuse(e.get("error", ""))),
            _msg(lang, "monitor_hint")]
    if kind == "test":
        return _msg(lang, "what_test"), [_msg(lang, "test_body")]
    if kind == "ledger_digest":
        return _ledger_render(e, lang, digest)
    return _msg(lang, "what_other", kind=_defuse(kind)), [_defuse(json.dumps(e, ensure_ascii=False))[:500]]


def _ledger_render(e, lang, digest=False):
    """(what, lines) of the daily ledger digest (a ledger_digest event
    from lib/ledger.sh): python/gpuguard_ledger.py renders it, the same
    text as `gpuguard ledger`. Beside alerts in one post, its first line
    (the section's head) names the day."""
    what, lines = gpuguard_ledger.render_lines(e, lang)
    if digest:
        lines = [_msg(lang, "ledger_in_digest", what=what, head=lines[0])] + lines[1:]
    return what, lines


_TRENDS = {"steady": "trend_steady", "accelerating": "trend_accelerating", "steps": "trend_steps",
          "steady (phase-aware)": "trend_phase", "decelerating": "trend_decelerating"}


def _oom_clock(event, seconds):
    """The wall-clock time of a projected OOM: "14:05", with the date when
    it is not today."""
    base = _number(event.get("ts"))
    base = time.time() if base is None else base
    try:
        at = time.localtime(base + seconds)
        same_day = time.localtime(base)[:3] == at[:3]
        return time.strftime("%H:%M" if same_day else "%Y-%m-%d %H:%M", at)
    except (OverflowError, OSError, ValueError):
        return None


def _peers(rising):
    """(how many ranks grow, how many ranks) from a tree's `ranks_rising`,
    or None for a single process, an older event or a malformed pair."""
    if not isinstance(rising, list) or len(rising) != 2:
        return None
    k, n = _as_int(rising[0]), _as_int(rising[1])
    if k is None or n is None or n < 2 or not 1 <= k <= n:
        return None
    return k, n


def _peer_lines(peers, lang):
    """What the ranks of a tree say about its alert: one rank growing
    alone (a leak's signature), all in step (more often data shapes), or
    some of them."""
    if peers is None:
        return []
    k, n = peers
    if k == 1:
        return [_msg(lang, "leak_peers_flat", peers=n - 1)]
    if k == n:
        return [_msg(lang, "leak_ranks_in_step", n=n)]
    return [_msg(lang, "leak_ranks_some", k=k, n=n)]


def _leak_render(e, lang, env):
    """(what, lines) for one gpu_memory_leak event: the rate, since when,
    the projected OOM as a duration and a clock time, the detector's
    verdict and confidence, the leaking rank of a tree, who. The
    detector's fields are optional: older events have only the slope,
    window and projection."""
    unknown = _msg(lang, "unknown")
    pid = _defuse(e.get("pid"))
    name = _defuse(os.path.basename(str(e.get("name") or "")))
    if any(j.get("cmdline") or j.get("slurm_job") or j.get("container") for j in _jobs_of(e)):
        # the watcher's record of the series: named as an idle alert's job
        name = _job_label([e], lang, env)
    slope = _number(e.get("slope_mib_per_hour"))
    slope_text = f"{slope:+.0f}" if slope is not None else unknown
    if _state_class(e) == "resolved":
        used = _gib(e.get("used_memory_mib"), lang)
        if e.get("reason") == "gone":
            # a process that ended is not one whose memory stopped growing
            return _msg(lang, "what_leak_gone", pid=pid, name=name), [_msg(lang, "leak_gone", used=used)]
        return _msg(lang, "what_leak_resolved", pid=pid, name=name), [
            _msg(lang, "leak_resolved", used=used, slope=slope_text)]
    # the detector's projection is free / slope rounded to 0.1 h: recomputed
    # when both are known, so a fast leak reads "in 1 min 21 s", not "in 0 s"
    oom = _number(e.get("projected_oom_hours"))
    free = _number(e.get("free_memory_mib"))
    if free is not None and free >= 0 and slope is not None and slope > 0:
        oom = free / slope
    oom_s = round(oom * 3600) if oom is not None and oom >= 0 else None
    oom_text = _duration(oom_s, lang) if oom_s is not None else unknown
    lines = [_msg(lang, "leak_values", slope=slope_text, window=_duration(e.get("window_seconds"), lang),
                 used=_gib(e.get("used_memory_mib"), lang), free=_gib(e.get("free_memory_mib"), lang))]
    since = _number(e.get("since_ts"))
    if since is not None and _when(since):
        ts = _number(e.get("ts"))
        lines.append(_msg(lang, "leak_since", since=_when(since),
                         ago=_duration((ts if ts is not None else time.time()) - since, lang)))
    trend_note = _severity(e) == "info"
    if trend_note:
        lines.append(_msg(lang, "leak_trend_note", oom=oom_text))
    else:
        clock = _oom_clock(e, oom_s) if oom_s is not None else None
        lines.append(_msg(lang, "leak_oom_at", oom=oom_text, clock=clock) if clock
                     else _msg(lang, "leak_oom", oom=oom_text))
    was = e.get("escalated_from")
    escalated = was in ("info", "warning") and not trend_note
    if escalated:
        first = _when(_number(e.get("first_alert_ts")))
        lines.insert(0, _msg(lang, "leak_escalated", was=_msg(lang, "level_" + was), when=first or unknown))
    trend = e.get("trend")
    confidence = _number(e.get("confidence"))
    if trend or confidence is not None:
        trend_text = _msg(lang, _TRENDS[trend]) if trend in _TRENDS else (_defuse(trend)[:40] if trend else unknown)
        lines.append(_msg(lang, "leak_verdict", trend=trend_text,
                         confidence=f"{confidence * 100:.0f} %" if confidence is not None else unknown))
    leaking = e.get("leaking_pid")
    peers = _peers(e.get("ranks_rising"))
    if _as_int(leaking) is not None and str(leaking) != str(e.get("pid")):
        rank = e.get("rank")
        # with every rank growing in step, the one named is the fastest
        key = "leak_rank_fastest" if peers and peers[0] == peers[1] else "leak_rank"
        if rank is not None and str(rank) != "":
            lines.append(_msg(lang, key, rank=_defuse(rank)[:16], pid=_as_int(leaking), root=pid))
        else:
            lines.append(_msg(lang, "leak_member", pid=_as_int(leaking), root=pid))
    lines += _peer_lines(peers, lang)
    lines += _job_lines([e], lang, env)
    if e.get("loss_plateau") is not None:
        lines.append(_msg(lang, "leak_plateau" if e["loss_plateau"] else "leak_falling"))
    lines.append(_msg(lang, "leak_hint"))
    what = "what_leak_trend" if trend_note else ("what_leak_escalated" if escalated else "what_leak")
    return _msg(lang, what, pid=pid, name=name), lines


def render_digest(events, lang, env=None):
    """(title, sections) of one message for all of a flush's events; each
    section is (head, detail lines), one per group (job/GPUs)."""
    env = os.environ if env is None else env
    groups = _group_events(events)
    hosts = sorted({str(e.get("host", "?")) for e in events})
    host = _defuse(", ".join(hosts))
    sections = []
    for g in groups[:_DIGEST_MAX_GROUPS]:
        # an NPU group reads in the NPU wording of its language
        glang = lang + "-npu" if g[0].get("vendor") == "ascend" else lang
        what, lines = _group_render(g, glang, env, digest=len(groups) > 1)
        sections.append((g, what, lines))
    states = [_state_class(g[0]) for g in groups]
    lead = "firing" if "firing" in states else ("test" if "test" in states else "resolved")
    tag = _msg(lang, "tag_" + lead) if lead in ("firing", "resolved", "test") else lead
    if all(e.get("state") == "reminder" for g in groups for e in g):
        tag = _msg(lang, "tag_reminder")
    firing = [e for g in groups for e in g if _state_class(e) == "firing"]
    if all(e.get("event") == "ledger_digest" for e in events):
        tag = _msg(lang, "tag_ledger")
    elif any(_severity(e) == "critical" for e in firing):
        tag = _msg(lang, "tag_critical")
    elif firing and all(_severity(e) == "info" for e in firing):
        # only trend notes: not an alert
        tag = _msg(lang, "tag_note")
    if len(groups) == 1:
        title = _msg(lang, "title_one", tag=tag, host=host, what=sections[0][1])
        lines = sections[0][2]
        return title, ([(lines[0], lines[1:])] if lines else [])
    summary = []
    if states.count("firing"):
        summary.append(_msg(lang, "summary_firing", n=states.count("firing")))
    if states.count("resolved"):
        summary.append(_msg(lang, "summary_resolved", n=states.count("resolved")))
    title = _msg(lang, "title_digest", tag=tag, host=host, n=len(groups), summary=", ".join(summary) or len(groups))
    out = []
    # sections say their state when they differ (firing and resolved, or
    # a critical alert beside a plain one or a trend note)
    mixed = len({_section_tag(g, lang) for g, _, _ in sections}) > 1
    for g, what, lines in sections:
        head = lines[0] if lines else what
        if mixed:
            head = f"[{_section_tag(g, lang)}] {head}"
        out.append((head, lines[1:]))
    if len(groups) > _DIGEST_MAX_GROUPS:
        out.append((_msg(lang, "digest_more", n=len(groups) - _DIGEST_MAX_GROUPS), []))
    return title, out


def _section_tag(group, lang):
    """The tag of one section of a mixed digest: a firing critical event
    says CRITICAL, a trend note NOTE."""
    state = _state_class(group[0])
    if state == "firing" and _severity(group[0]) in ("critical", "info"):
        return _msg(lang, "tag_critical" if _severity(group[0]) == "critical" else "tag_note")
    return _msg(lang, "tag_" + state) if state in ("firing", "resolved", "test") else _defuse(state)


def _render(event, lang, env):
    """(title, lines) of the message for one event."""
    title, sections = render_digest([event], lang, env)
    lines = []
    for head, details in sections:
        lines.append(head)
        lines += details
    return title, lines


def _truncate_bytes(text, limit, lang="en"):
    raw = text.encode("utf-8")
    if len(raw) <= limit:
        return text
    tail = "\n" + _msg(lang, "truncated")
    cut = raw[:max(0, limit - len(tail.encode("utf-8")))].decode("utf-8", "ignore")
    return cut + tail


def _mentions(env):
    return [m for m in re.split(r"[\s,;]+", env.get("NOTIFY_MENTION", "")) if m]


# ----------------------------------------------------------------- bodies --

def plain_text(title, sections):
    out = [title]
    for head, details in sections:
        out.append(head)
        out += ["  " + d for d in details]
    return "\n".join(out)


def _chat_text(provider, title, sections, who):
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
    who = _mentions(env) if any(_is_page(e) for e in events) else []
    limit = _PROVIDER_TEXT_BYTES[provider]
    text = _truncate_bytes(_chat_text(provider, title, sections, who), limit, lang)
    if provider == "dingtalk":
        return {"msgtype": "markdown",
                "markdown": {"title": _truncate_bytes(title, 200, lang), "text": text},
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


# ----------------------------------------------------------- alertmanager --

def _iso(ts):
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


# The alert names and labels of etc/prometheus/gpuguard.rules.yml, so that a
# silence or an inhibition written for one holds for the other: instance is
# the host name (the rules strip the scrape port), job is "gpuguard".
_ALERTNAMES = {"gpu_idle": "GpuIdleHeld", "gpu_stuck": "GpuStuckSpinning", "gpu_degraded": "GpuDegraded",
              "gpu_memory_leak": "GpuMemoryLeakDetected",
              "monitor_degraded": "GpuguardMonitorDown", "test": "GpuguardTest"}
# A leak event from the detector (it carries a severity by projected time
# to OOM) is the rules' GpuMemoryLeak (warning/critical) or, beyond the
# warning horizon, GpuMemoryLeakTrend (info: a trend note); an older event
# without one keeps GpuMemoryLeakDetected.
_LEAK_ALERTNAMES = {"critical": "GpuMemoryLeak", "warning": "GpuMemoryLeak", "info": "GpuMemoryLeakTrend"}
_SEVERITY = {"monitor_degraded": "critical", "gpu_degraded": "critical"}
# vendor: as the metrics' label (nvidia, or ascend for an NPU), so that a
# rule's alert and gpuguard's own one carry the same labels
_LABEL_KEYS = {"gpu_idle": ("gpu", "uuid", "vendor"), "gpu_stuck": ("gpu", "uuid", "vendor"),
              "gpu_degraded": ("gpu", "uuid", "vendor"), "gpu_memory_leak": ("pid", "name")}


def _alertmanager_labels(event):
    kind = event.get("event")
    name = _ALERTNAMES.get(kind, "Gpuguard")
    if kind == "gpu_memory_leak" and event.get("severity") in _LEAK_ALERTNAMES:
        name = _LEAK_ALERTNAMES[event["severity"]]
    labels = {"alertname": name, "instance": str(event.get("host", "")),
              "job": "gpuguard", "severity": _severity(event)}
    for key in _LABEL_KEYS.get(kind, ("gpu", "uuid", "pid")):
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
_LEAK_RESOLVE_AS = (("GpuMemoryLeak", "critical"), ("GpuMemoryLeak", "warning"),
                   ("GpuMemoryLeakTrend", "info"), ("GpuMemoryLeakDetected", "warning"))


def alertmanager_alerts(event, lang="en", now=None, env=None):
    """The Alertmanager alerts for one event: one, or for a resolved leak
    of unknown severity one per name and severity it may have fired as."""
    if event.get("event") == "ledger_digest":
        return []               # a daily report, not an alert
    alert = alertmanager_alert(event, lang, now, env)
    was = event.get("escalated_from")
    if event.get("event") == "gpu_memory_leak" and _state_class(event) == "firing" and was in _LEAK_ALERTNAMES:
        # an escalation replaces the alert it was sent as: that one ends
        # now, so Alertmanager shows one alert for one leak
        labels = dict(alert["labels"], alertname=_LEAK_ALERTNAMES[was], severity=was)
        at = time.time() if now is None else now
        return [alert, dict(alert, labels=labels, endsAt=_iso(max(at, _as_int(event.get("ts")) or at)))]
    if event.get("event") != "gpu_memory_leak" or _state_class(event) != "resolved" or \
            event.get("severity") in _SEVERITY_RANK:
        return [alert]
    out = []
    for name, sev in _LEAK_RESOLVE_AS:
        labels = dict(alert["labels"], alertname=name, severity=sev)
        out.append(dict(alert, labels=labels))
    return out


def alertmanager_alert(event, lang="en", now=None, env=None):
    env = os.environ if env is None else env
    now = time.time() if now is None else now
    title, lines = _render(event, lang, env)
    annotations = {"summary": title, "description": "\n".join(lines)}
    for key in ("utilization", "power_draw_w", "power_limit_w", "spin_cycles", "idle_seconds", "fault",
                "slope_mib_per_hour", "since_ts", "projected_oom_hours", "confidence", "trend", "leaking_pid",
                "rank", "used_memory_mib", "error", "reason"):
        if event.get(key) is not None:
            annotations[key] = str(event[key])
    ts = _as_int(event.get("ts")) or now
    idle_s = _as_int(event.get("idle_seconds")) or 0
    since = _as_int(event.get("since")) or (ts - idle_s if event.get("event") in ("gpu_idle", "gpu_stuck") else ts)
    alert = {"labels": _alertmanager_labels(event), "annotations": annotations, "startsAt": _iso(since)}
    if event.get("state") in ("resolved", "test"):
        alert["endsAt"] = _iso(max(now, since))
    else:
        # Alertmanager resolves an alert not re-sent within resolve_timeout;
        # the watchdog re-sends at REPEAT_INTERVAL, so keep it open that long.
        repeat = _as_int(env.get("REPEAT_INTERVAL") or 3600) or 86400
        alert["endsAt"] = _iso(now + 2 * repeat + 300)
    host = str(event.get("host") or "")
    if re.match(r"^[A-Za-z0-9.-]+$", host):
        alert["generatorURL"] = f"http://{host}/gpuguard"
    return alert
