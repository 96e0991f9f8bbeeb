"""gpuguard's ledger: who held GPUs, and how long idle or stuck, per day.

Commands:
  show [--since WHEN] [--json]   the ledger since WHEN (default 1d: today;
                                 7d: the last 7 days; a date 2026-12-01),
                                 as text or JSON (with every job row, per
                                 day, as "jobs"); today's rows as the
                                 watchdog holds them arrive on stdin (a day
                                 file's text, see FORMAT), the rest is read
                                 from the day files
  digest-event DAY [--now TS]    print the daily digest event for DAY (one
                                 JSON line), nothing for a day without
                                 held GPUs

FORMAT (one file per local day, $GPUGUARD_STATE_DIR/ledger/YYYY-MM-DD.tsv,
written atomically by lib/ledger.sh; tab-separated, an empty field is "-";
"#" starts a comment):
  day    YYYY-MM-DD    the day (local time) the file holds
  last   TS SEQ        the last accounted cycle (unix time, sequence number)
  job    USER UID JOB HELD_S IDLE_S LONGEST_S LONGEST_END GPUS CMD
                       one row per user and job: GPU-seconds held (a GPU
                       that several jobs hold split by the memory of each,
                       so the rows add up to the GPUs' time), held
                       while idle or stuck, the longest idle stretch of one
                       GPU and when it ended, the GPU indexes, the masked
                       command line (cut); JOB is slurm:ID, pid:PID@START
                       or "other" (jobs past the day's row cap); USER is
                       the name, uid:N or "?"; GPUS: "0,1" for NVIDIA GPUs,
                       "npu0" for an Ascend NPU (a mixed box's GPU 0 and
                       NPU 0 stay apart; day files before that wrote an
                       NPU's plain index)
  run    RUN USER JOB SECONDS    an idle stretch still open (RUN: the
                                 GPU's UUID/JOB, one per GPU and holder)
  total  USER HELD_S IDLE_S      all-time counters (the textfile metrics)

Words: GPUGUARD_DEVICE_KINDS (set by lib/ledger.sh from the box's device
tools: "nvidia", "ascend" or "nvidia ascend") makes an Ascend box's ledger,
digest and report section say NPU and NPU-hours (the message tables' NPU
wording, as its alerts); a mixed box keeps the GPU words, its NPUs npuN.

Names (LEDGER_NAMES): user (as is), hash ("u" and 8 hex digits of
sha256(salt:user); the salt is ledger/salt, shared with lib/ledger.sh), none
(no per-user lines; incidents without user or command line).

Standard library only: it must run on a bare GPU box.
"""
import hashlib
import json
import os
import re
import sys
import time

import gpuguard_messages_en
import gpuguard_messages_zh
from gpuguard_files import write_atomic

TABLES = {"en": gpuguard_messages_en.MESSAGES, "zh": gpuguard_messages_zh.MESSAGES}
# "en-npu", "zh-npu": the digest of an Ascend box (its event says "vendor":
# "ascend", lib/ledger.sh) reads NPU-hours, as the alert helper's NPU groups
NPU_TABLES = {"en": gpuguard_messages_en.NPU_MESSAGES, "zh": gpuguard_messages_zh.NPU_MESSAGES}
DAY_RE = re.compile(r"^\d{4}-\d{2}-\d{2}$")
TOP_USERS = 10
TOP_INCIDENTS = 3
JSON_JOBS = 500
# the most points the trend line shows (days, else weeks, else 30 days)
TREND_POINTS = 14


class UsageError(Exception):
    pass


# ------------------------------------------------------------------ read --

def _uint(text):
    """A day file's whole number, None for damage: ASCII digits only
    (str.isdigit takes "²", which int() rejects: a traceback), and at most
    10 of them, as lib/ledger.sh reads it (more is no day's seconds, and
    read as is it printed 27777777777777778688.0 GPU-hours)."""
    return int(text) if re.fullmatch(r"[0-9]{1,10}", text) else None


def _parse_day(text):
    """The job rows of a day file's text: a list of dicts."""
    jobs = []
    for line in text.splitlines():
        f = line.rstrip("\r").split("\t")
        if f[0] != "job" or len(f) < 9:
            continue
        nums = [_uint(x) for x in f[4:8]]
        if None in nums:
            continue
        cmd = f[9] if len(f) > 9 and f[9] != "-" else ""
        jobs.append({"user": f[1], "uid": "" if f[2] == "-" else f[2], "job": f[3], "held_s": nums[0], "idle_s": nums[1],
                     "longest_s": nums[2], "longest_end": nums[3],
                     "gpus": [g for g in f[8].split(",") if g and g != "-"], "cmd": cmd})
    return jobs


def day_in(text):
    """The day a day file's text says it holds ('' when none)."""
    for line in text.splitlines()[:3]:
        f = line.split("\t")
        if f[0] == "day" and len(f) > 1 and DAY_RE.match(f[1]):
            return f[1]
    return ""


def ledger_dir(env=None):
    env = os.environ if env is None else env
    return os.path.join(env.get("GPUGUARD_STATE_DIR", "."), "ledger")


def read_days(folder, days, today=None):
    """{day: [job rows]} for the days asked; `today` is (day, text) from
    the watchdog's memory, which wins over the day's file."""
    out = {}
    for day in days:
        if today and today[0] == day:
            out[day] = _parse_day(today[1])
            continue
        try:
            with open(os.path.join(folder, day + ".tsv"), encoding="utf-8", errors="replace") as f:
                text = f.read()
        except OSError:
            out[day] = []
            continue
        out[day] = _parse_day(text)
        if text.strip() and day_in(text) != day:
            # a day file overwritten or cut (a disk error, a hand): its day
            # would read as a day without jobs, with no word of why
            sys.stderr.write("gpuguard: ledger: %s is not the ledger of %s (damaged?): that day shows what is "
                             "left of it\n" % (os.path.join(folder, day + ".tsv"), day))
    return out


def day_of(ts):
    return time.strftime("%Y-%m-%d", time.localtime(ts))


def days_back(last_day, n):
    """The n days ending with last_day, oldest first (local dates)."""
    t = time.mktime(time.strptime(last_day + " 12:00", "%Y-%m-%d %H:%M"))
    return [day_of(t - 86400 * i) for i in range(n - 1, -1, -1)]


# ----------------------------------------------------------------- names --

def _salt(folder):
    """(salt, '') for LEDGER_NAMES=hash, or (None, why) when there is none
    this run can use. The watchdog makes it, private to its user; a reader
    who cannot read it (a user's `gpuguard ledger` of a ledger made readable)
    gets no salt, never a new one: names hashed with a salt of one run look
    real and match nothing, neither the metrics nor the next run."""
    path = os.path.join(folder, "salt")
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            salt = f.read().strip()
        if re.fullmatch(r"[0-9a-f]{32}", salt):
            return salt, ""
    except FileNotFoundError:
        pass
    except OSError as e:
        return None, f"cannot read the salt {path} ({e.strerror})"
    salt = os.urandom(16).hex()
    try:
        write_atomic(path, salt + "\n")
    except OSError as e:
        return None, f"cannot make the salt {path} ({e.strerror})"
    return salt, ""


def _names(env):
    """(mode, name, problem): LEDGER_NAMES as shown, a function from a user
    name to the name shown (None: left out), and why hashed names cannot be
    shown ('' when they can). Without a salt no name is shown, as with
    "none", and the problem is said once on stderr."""
    mode = env.get("LEDGER_NAMES", "user") or "user"
    if mode == "none":
        return mode, lambda user: None, ""
    if mode == "hash":
        salt, problem = _salt(ledger_dir(env))
        if salt is None:
            problem = f"LEDGER_NAMES=hash: {problem}: no per-user names shown (the salt's owner, the watchdog's user, sees them)"
            sys.stderr.write(f"gpuguard: ledger: {problem}\n")
            return "none", lambda user: None, problem
        return mode, lambda user: "u" + hashlib.sha256(f"{salt}:{user}".encode()).hexdigest()[:8], ""
    return mode, lambda user: user, ""


# --------------------------------------------------------------- summary --

def _price_of(env):
    try:
        price = float(str(env.get("GPU_HOUR_PRICE", "0") or 0))
    except ValueError:
        return None
    return price if 0 < price <= 1e6 else None


def _cost(seconds, price):
    return round(seconds / 3600.0 * price, 2) if price else None


def summarize(by_day, span, trend_days, prev_days, env, names=None):
    """The ledger over the days of `span`: totals, per user, the worst
    incidents, the trend per day over `trend_days`, and the idle total of
    `prev_days` (the week before) for the change; `names` is _names(env)
    when the caller has it already."""
    mode, name, problem = names or _names(env)
    price = _price_of(env)
    users, incidents = {}, []
    held = idle = 0
    for day in span:
        for j in by_day.get(day, []):
            held += j["held_s"]
            idle += j["idle_s"]
            u = users.setdefault(j["user"], {"held_s": 0, "idle_s": 0, "longest_s": 0})
            u["held_s"] += j["held_s"]
            u["idle_s"] += j["idle_s"]
            u["longest_s"] = max(u["longest_s"], j["longest_s"])
            if j["longest_s"] > 0:
                incidents.append(dict(j, day=day))
    user_rows = [{"user": name(user), "held_s": u["held_s"], "idle_s": u["idle_s"], "longest_s": u["longest_s"],
                  "cost": _cost(u["idle_s"], price)}
                 for user, u in sorted(users.items(), key=lambda kv: (-kv[1]["idle_s"], -kv[1]["held_s"], kv[0]))]
    if mode == "none":
        user_rows = []
    incidents.sort(key=lambda j: (-j["longest_s"], -j["idle_s"]))
    worst = [{"user": name(j["user"]), "job": j["job"] if mode == "user" or j["job"].startswith("slurm:") else None,
              "cmd": j["cmd"] if mode == "user" else None, "gpus": j["gpus"], "longest_s": j["longest_s"],
              "end_ts": j["longest_end"], "idle_s": j["idle_s"], "day": j["day"]}
             for j in incidents[:TOP_INCIDENTS]]
    trend = [{"day": d, "held_s": sum(j["held_s"] for j in by_day.get(d, [])),
              "idle_s": sum(j["idle_s"] for j in by_day.get(d, []))} for d in trend_days]
    prev = [by_day.get(d) for d in prev_days]
    prev_idle = sum(j["idle_s"] for rows in prev if rows for j in rows) if any(prev) else None
    return {"from": span[0], "to": span[-1], "names": mode, "names_problem": problem or None,
            "held_s": held, "idle_s": idle,
            "gpu_hour_price": price, "currency": env.get("GPU_PRICE_CURRENCY", "") if price else None,
            "cost": _cost(idle, price), "users": user_rows[:TOP_USERS], "more_users": max(0, len(user_rows) - TOP_USERS),
            "worst": worst, "trend": trend, "prev_idle_s": prev_idle}


def span_days(first, last):
    """The days from first to last (ISO dates), at most ten years."""
    span = []
    d = last
    while d >= first and len(span) < 3660:
        span.append(d)
        d = days_back(d, 2)[0]
    return span[::-1]


def _first_day(folder, last):
    """The oldest day the ledger folder has a file for; `last` when it
    has none before it (or cannot be read)."""
    try:
        names = os.listdir(folder)
    except OSError:
        return last
    days = [n[:-4] for n in names if n.endswith(".tsv") and DAY_RE.match(n[:-4])]
    return min(days + [last])


def _oldest_kept(env, last):
    """The oldest day whose file retention keeps (LEDGER_KEEP_DAYS after
    the day, lib/common.sh) when `last` is today."""
    try:
        keep = int(env.get("LEDGER_KEEP_DAYS") or 35)
    except ValueError:
        keep = 35
    return days_back(last, keep + 1)[0]


def period(env, first, last, today_text=""):
    """(summary, jobs) of the days first..last for a report: the summary
    as `gpuguard ledger` shows it, and every job row of the period (names
    as LEDGER_NAMES says; no command line unless names are shown), most
    idle first."""
    # a --since older than the days the ledger keeps (LEDGER_KEEP_DAYS)
    # starts at its oldest day, so the period shown is the one covered
    # (--since 1999-01-01 was cut to ten years without a word, a trend of
    # 3,650 empty days); a --since 7d on a young ledger stays 7 days
    kept = _oldest_kept(env, last)
    if first < kept:
        first = max(first, _first_day(ledger_dir(env), last))
    span = span_days(first, last)
    prev = days_back(span[0], len(span) + 1)[:-1]
    if prev[0] < kept:
        # the period before is partly past retention: the few days left of
        # it against a whole period read "+383%" on a flat ledger; no change
        # is shown rather than one on days the ledger no longer has
        prev = []
    by_day = read_days(ledger_dir(env), prev + span, today=(day_in(today_text), today_text))
    names = _names(env)
    summary = summarize(by_day, span, span, prev, env, names)
    mode, name, _ = names
    jobs = [dict(j, day=d, user=name(j["user"]), cmd=j["cmd"] if mode == "user" else None,
                 job=j["job"] if mode == "user" or j["job"].startswith("slurm:") else None)
            for d in span for j in by_day.get(d, [])]
    jobs.sort(key=lambda j: (-j["idle_s"], -j["held_s"]))
    return summary, jobs


def digest_event(day, now, env):
    """The daily digest of `day` (None when no GPU was held that day):
    the day, the 7 days ending with it, and the 7 before for the change.
    An Ascend box's carries "vendor": "ascend" (the alert helper words it
    in NPU-hours)."""
    week = days_back(day, 14)
    by_day = read_days(ledger_dir(env), week)
    prev = week[:7] if week[0] >= _oldest_kept(env, day_of(now)) else []
    s = summarize(by_day, [day], week[7:], prev, env)
    if s["held_s"] == 0:
        return None
    host = env.get("GPUGUARD_HOST") or os.uname().nodename
    e = dict({"id": "ledger-" + day, "ts": int(now), "host": host, "event": "ledger_digest",
              "state": "firing", "severity": "info"}, **s)
    if npu_box(env):
        e["vendor"] = "ascend"
    return e


# ----------------------------------------------------------------- words --

def npu_box(env):
    """True on a box of Ascend NPUs only (GPUGUARD_DEVICE_KINDS): its
    ledger reads NPU and NPU-hours."""
    return (env.get("GPUGUARD_DEVICE_KINDS") or "").split() == ["ascend"]


def device_list(gpus, npu_words):
    """A row's devices as a person reads them: "0,1" for GPUs, "npu0" for
    an NPU beside GPUs (a mixed box); "0,1" again in NPU words, where every
    device is one."""
    if npu_words:
        return ",".join(g.removeprefix("npu") for g in gpus)
    return ",".join(gpus)


# ---------------------------------------------------------------- render --

def _msg(lang, key, **fields):
    if lang.endswith("-npu"):
        return NPU_TABLES[lang[:-4]][key].format(**fields)
    return TABLES[lang][key].format(**fields)


def _defuse(text):
    """Untrusted text (command lines) cannot mention anyone: the at sign
    and angle brackets become look-alikes, as in the alert helper."""
    return str(text).replace("@", "\uff20").replace("<", "\u2039").replace(">", "\u203a")


def _hours(seconds):
    return f"{seconds / 3600.0:.1f}"


def _duration(seconds, lang):
    h, rest = divmod(max(0, int(seconds)), 3600)
    m = rest // 60
    return _msg(lang, "dur_hm", h=h, m=m) if h else _msg(lang, "dur_m", m=m)


def _money(amount, currency, lang):
    currency = _defuse(currency or _msg(lang, "currency"))[:8]
    number = f"{amount:.2f}"
    if not currency:
        return number
    return f"{number} {currency}" if currency.isalpha() else f"{currency} {number}"


def _span(e):
    return e["from"] if e["from"] == e["to"] else f"{e['from']} – {e['to']}"


def render_lines(e, lang):
    """(what, lines) of a ledger summary or digest event: the subject, then
    the head line (waste), per user, the worst incidents, the trend."""
    what = _msg(lang, "ledger_what", span=_span(e))
    held, idle = e.get("held_s", 0), e.get("idle_s", 0)
    pct = f"{100.0 * idle / held:.0f}" if held else "0"
    head = _msg(lang, "ledger_head", idle=_hours(idle), held=_hours(held), pct=pct)
    if e.get("cost") is not None:
        head += _msg(lang, "ledger_head_cost", cost=_money(e["cost"], e.get("currency"), lang))
    lines = [head]
    if e.get("users"):
        lines.append(_msg(lang, "ledger_users"))
        for u in e["users"]:
            line = _msg(lang, "ledger_user", user=_defuse(u["user"]), idle=_hours(u["idle_s"]),
                        held=_hours(u["held_s"]), longest=_duration(u["longest_s"], lang))
            if u.get("cost") is not None:
                line += _msg(lang, "ledger_user_cost", cost=_money(u["cost"], e.get("currency"), lang))
            lines.append(line)
        if e.get("more_users"):
            lines.append(_msg(lang, "ledger_more_users", n=e["more_users"]))
    if e.get("worst"):
        lines.append(_msg(lang, "ledger_worst"))
        for n, w in enumerate(e["worst"], 1):
            lines.append(_incident_line(n, w, lang, e.get("from") != e.get("to")))
    trend = _trend_line(e, lang)
    if trend:
        lines.append(trend)
    return what, lines


def _incident_line(n, w, lang, with_day=False):
    """One of the worst incidents; over more than one day it names its day:
    without it, a job idle at noon three days running read as one incident
    listed three times."""
    end = time.strftime("%H:%M", time.localtime(w["end_ts"])) if w.get("end_ts") else "?"
    who = [_defuse(w["user"])] if w.get("user") else []
    job = w.get("job") or ""
    if job.startswith("slurm:"):
        who.append(_msg(lang, "ledger_slurm", id=_defuse(job[6:])))
    if w.get("cmd"):
        who.append(_defuse(w["cmd"])[:100])
    key = "ledger_incident_day" if with_day and w.get("day") else "ledger_incident"
    return _msg(lang, key, n=n, gpus=device_list(w.get("gpus") or [], lang.endswith("-npu")) or "?",
                longest=_duration(w["longest_s"], lang), end=end, who=" · ".join(who) or "?",
                day=str(w.get("day"))[5:])


def _trend_line(e, lang):
    """Idle GPU-hours per day of the trend, and the change on as many days
    before ('' for a single day: the head line says it all)."""
    trend = e.get("trend", [])
    if len(trend) < 2:
        return ""
    if len(trend) <= TREND_POINTS:
        days = " · ".join(f"{t['day'][5:]} {_hours(t['idle_s'])}" for t in trend)
        line = _msg(lang, "ledger_trend", n=len(trend), days=days)
    else:
        # a long period (--since 90d) in weeks, or 30-day spans, each
        # named by its first day and the last ending today: a line a day
        # ran off the screen. Past TREND_POINTS spans the oldest are left
        # out (the head line still counts them), and so is an oldest span
        # shorter than the others: its 1-2 days drawn as a week read as a
        # sudden drop.
        size, key = (7, "ledger_trend_weeks") if len(trend) <= 7 * TREND_POINTS else (30, "ledger_trend_months")
        spans = [trend[end - size:end] for end in range(len(trend), size - 1, -size)][:TREND_POINTS][::-1]
        days = " · ".join(f"{s[0]['day'][2:] if size == 30 else s[0]['day'][5:]} "
                          f"{_hours(sum(t['idle_s'] for t in s))}" for s in spans)
        line = _msg(lang, key, n=len(spans), days=days)
    prev, now = e.get("prev_idle_s"), sum(t["idle_s"] for t in trend)
    if prev:
        line += _msg(lang, "ledger_change", n=len(trend), pct=f"{100.0 * (now - prev) / prev:+.0f}")
    return line


# The ledger text's own glyphs and their ASCII stand-ins, for a terminal
# whose locale is not UTF-8 (lib/common.sh's gg_utf8_locale decides and
# says so with GG_ASCII=1); the digest sent to chat keeps them.
# The currency signs a price is written with become their ISO codes (the
# default ¥ is gpuguard's users' yuan); any other character a C terminal
# cannot show becomes "?" (_ascii_text).
_ASCII_GLYPHS = str.maketrans({"\u2013": "-", "\u00b7": "|", "\u2026": "...", "\u00a5": "CNY", "\uffe5": "CNY",
                               "\u20ac": "EUR", "\u00a3": "GBP"})


def _ascii_text(text):
    """The ledger's text for a terminal whose locale is not UTF-8."""
    return text.translate(_ASCII_GLYPHS).encode("ascii", "replace").decode("ascii")


def _render_text(e, lang, host):
    what, lines = render_lines(e, lang)
    title = _msg(lang, "title_one", tag=_msg(lang, "tag_ledger"), host=_defuse(host), what=what)
    return "\n".join([title, lines[0]] + ["  " + x for x in lines[1:]])


# ------------------------------------------------------------------- cli --

def _parse_since(text, now):
    """The first day of `--since`: Nd (N days ending today), a date."""
    m = re.fullmatch(r"(\d{1,4})d", text or "")
    if m and int(m.group(1)) >= 1:
        return days_back(day_of(now), int(m.group(1)))[0]
    if DAY_RE.match(text or ""):
        try:
            time.strptime(text, "%Y-%m-%d")
            return text
        except ValueError:
            pass
    raise UsageError(f"--since takes Nd (e.g. 7d) or a date YYYY-MM-DD (got '{text}')")


def _now_of(env):
    """The time: GPUGUARD_NOW pins it (replays, tests), as in lib/common.sh."""
    pinned = env.get("GPUGUARD_NOW", "")
    return float(pinned) if re.fullmatch(r"\d{1,12}", pinned) else time.time()


def _show(args, env, stdin_text, now=None):
    now = _now_of(env) if now is None else now
    since, as_json = "1d", False
    it = iter(args)
    for a in it:
        if a == "--json":
            as_json = True
        elif a == "--since":
            since = next(it, None)
            if since is None:
                raise UsageError("--since needs a value (e.g. 7d)")
        elif a.startswith("--since="):
            since = a.split("=", 1)[1]
        else:
            raise UsageError(f"ledger: unknown option '{a}' (--since WHEN, --json)")
    today = day_of(now)
    first = _parse_since(since, now)
    if first > today:
        raise UsageError(f"--since {since} is in the future")
    s, jobs = period(env, first, today, stdin_text)
    # no watchdog keeps a ledger in this state folder (lib/ledger.sh,
    # ledger_show): the zeros below are no fact
    s["no_ledger"] = env.get("LEDGER_NO_LEDGER") or None
    if s["no_ledger"]:
        sys.stderr.write(f"gpuguard ledger: {s['no_ledger']}\n")
    if as_json:
        # the rows too, per day and job, for scripts (most idle first)
        s["jobs"] = [{k: j[k] for k in ("day", "user", "job", "cmd", "gpus", "held_s", "idle_s", "longest_s",
                                        "longest_end")} for j in jobs[:JSON_JOBS]]
        return json.dumps(s, ensure_ascii=False, indent=1)
    ascii_only = env.get("GG_ASCII") == "1"
    lang = env.get("NOTIFY_LANG") if env.get("NOTIFY_LANG") in TABLES else "en"
    if ascii_only:
        # NOTIFY_LANG=zh words the chat messages; a terminal that cannot
        # show Chinese gets the English table instead of mojibake
        lang = "en"
    if npu_box(env):
        lang += "-npu"
    text = _render_text(s, lang, env.get("GPUGUARD_HOST") or os.uname().nodename)
    return _ascii_text(text) if ascii_only else text


def main(argv):
    env = os.environ
    try:
        if argv[:1] == ["show"]:
            print(_show(argv[1:], env, sys.stdin.read() if not sys.stdin.isatty() else ""))
            return 0
        if argv[:1] == ["digest-event"] and len(argv) >= 2 and DAY_RE.match(argv[1]):
            now = float(argv[3]) if argv[2:3] == ["--now"] and len(argv) > 3 else _now_of(env)
            e = digest_event(argv[1], now, env)
            if e:
                print(json.dumps(e, ensure_ascii=False, separators=(",", ":")))
            return 0
        raise UsageError("usage: gpuguard_ledger.py show [--since WHEN] [--json] | digest-event DAY [--now TS]")
    except UsageError as e:
        print(f"gpuguard: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # `gpuguard ledger | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except KeyboardInterrupt:
        # Ctrl-C: one line and 130 (128 + SIGINT, as a shell reports it),
        # never a 30-line traceback
        print("gpuguard: interrupted", file=sys.stderr)
        sys.exit(130)
