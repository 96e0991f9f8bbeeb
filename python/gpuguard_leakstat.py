"""gpuguard's leak statistics: one Series per process (or process tree).

Method (docs/LEAK.md has each phenomenon and the rule that handles it):

Reduction. Samples become 1-minute "fine" floors (the minimum of each
minute; bucket_s / 10 in general), and every 10 minutes a bucket floor: the
minimum of the bucket's fine floors after dropping isolated dips (a fine
floor under 85 % of both neighbours: torch.cuda.empty_cache() drops the
process to its allocated floor for one sample). The minimum removes spikes,
evaluation peaks and checkpoint saves that last less than a bucket.

Segments. A series restarts (cut, then 30 minutes of warm-up skipped) on a
new PID for the same key (the caller says so), a gap of more than 90 s
followed by a level 256 MiB lower (the expected growth aside; after a
longer gap, also a bucket that moves 256 MiB either way from where the job
landed: a restarted job's warm-up), a gap longer than 6 h, or a floor
collapse below half the recent level that stays for an hour. Other gaps (the
watcher away, the box busy) and single low floors do not cut.

Level shifts. Inside a segment, jumps between buckets (>= 256 MiB and far
outside the bucket-to-bucket noise) are level shifts: a one-time jump (new
sequence-length bucket), the start or end of an evaluation phase, an RL
rollout/train alternation. They are subtracted (minus the local trend), so
the trend underneath stays visible and a shift is never read as growth.
Persistent up-shifts of similar size at regular intervals (>= 3, still
coming; >= 4 after an unlike one) are a step leak (the allocator leaking
in blocks), rated size / interval.

Slow tier. On the de-shifted floors (from the first hour the floor holds
still, when it rose before: the end of a long warm-up), windows of 2, 3,
6, 12 and 24 h are tested: net growth >= 64 MiB spread over >= 4 rising buckets (alike in
size when fewer than 8: a few unlike rises are new record lengths), no
single jump carrying more than 40 %, one-sided Mann-Kendall Z >= 2.326, Theil-Sen slope
>= the threshold (50 MiB/h), and the growth not decelerating: the window's
slope must be at least 0.6 of the slope in the window before it (or, with
no room before it, the last third at least 0.6 of the first third). A
decelerating series is a cache filling toward a ceiling; it alerts only
when the projected ceiling is above the GPU's capacity.

Fast tier. With the GPU's free memory known, the fine floors decide: when
the growth projects OOM within 6 h and has been observed for at least as
long as the time left (a third of it when the growth is strictly linear:
last half's rate >= 0.9 of the first half's), its rises spread over an
effective quarter of the minutes, with no single jump carrying more than 40 %, it fires. Warm-ups decelerate and
fail this; a leak of GB/h alerts minutes to an hour after it starts.

Noisy tier. When the series is noisy (the median successive difference of
its fine floors is >= 3 % of the level; a coefficient of variation up to
0.5 in the corpus), floors are the tail of the noise: each bucket also keeps
a level (the mean of its fine floors without the two extremes), and 6, 12
and 24 h windows of levels are tested: the least-squares slope's z (its
standard error from the residuals, inflated for their autocorrelation)
>= 4.0, Theil-Sen >= the threshold, growth >= min_growth.
Such a series is not cut by gaps left by dropped dips or by noise read as a
collapse.

Alerting. Two passing evaluations in a row fire (per tier); growth stopping
for two evaluations, or a restart, resolves. The event carries the slope,
since when, the projected hours to OOM, a confidence (0-1, from the
Mann-Kendall Z and the evidence span), the trend ("steady", "accelerating",
"decelerating/saturating", "steps") and a severity from the projection:
critical under 6 h (earned: the evidence spans two of the job's cycles,
and the slow tier pages only a job that has given memory back once),
warning under 7 days or when the capacity is unknown,
info (a trend note, not a page) beyond.
"""
import math

DEFAULTS = {
    "bucket_s": 600.0,          # floor bucket length
    "threshold": 50.0,          # MiB/h
    "min_growth": 64.0,         # MiB of net growth in the window
    "step_mib": 256.0,          # a jump this big between buckets may be a level shift
    "step_noise": 4.0,          # ... when it is this many noise scales out
    "skip_buckets": 3,          # warm-up skipped after a start or a cut
    "windows": (12, 18, 36, 72, 144),
    "z_min": 2.326,             # one-sided alpha = 0.01
    "decel_ratio": 0.6,         # slope / slope before it under this: decelerating
    "debounce": 2,              # fast tier: passes in a row; resolving: calm evaluations
    "slow_passes": 3,           # slow tier: passing evaluations ...
    "slow_look": 4,             # ... among the last this many (at most 30)
    "max_jump_share": 0.4,      # one bucket's jump may carry at most this of the growth
    "min_rises": 4,             # a leak raises the floor in at least this many buckets
    "few_rises": 8,             # ... and with fewer than this, by rises of alike size
    "gap_cut_s": 6 * 3600.0,    # no sample for this long: a new segment
    "gap_check_s": 90.0,        # after a shorter gap only a level change cuts
    "collapse": 0.5,            # floor under this share of the recent level ...
    "collapse_buckets": 6,      # ... for this many buckets: a restart
    "stair_min": 3,             # persistent steps of a step leak
    "fast_oom_h": 6.0,          # fast tier: OOM projected this close
    "fast_min_s": 120.0,        # ... observed for at least this long
    "fast_linear_share": 0.35,  # ... and this share of the time left when linear
    "fast_min_floors": 10,      # ... and this many fine floors since the segment began: a
                                # model's weights load in a few minutes and then stop
    "critical_h": 6.0,          # severity by projected hours to OOM
    "note_h": 168.0,            # beyond this: a trend note
    "noise_min": 0.03,          # median successive difference / level: a noisy series
    "noisy_windows": (36, 72, 144),
    "held_buckets": 6,          # the lows of the last hour are still to come (records_verdict)
    "noisy_z": 4.0,             # z of the level slope; tested every bucket (see noisy_verdict)
    "record_h": 3.0,            # a leak's records: at least one (effective) per this many hours
    "records_z": 1.645,         # ... and the floors under them trend (one-sided alpha 0.05)
    "fast_rise_share": 0.25,    # fast tier: effective rises in at least this share of the minutes
    "young_long_h": 12.0,       # a young window this long may judge its own pace (long_steady) ...
    "young_long_ratio": 0.7,    # ... its last third growing at least this share of its first
    "early_skip_h": 1.5,        # slowed_since_start: a warm-up's tail (time constants up to 20
                                # minutes) is over this long after the skipped half hour
                                # (at 1.0 a warm-up's last eval phase still counted: issue-12 l_eval 0)
}
MAX_FINES = 120
LOWS_CYCLES = 3.0   # lows_refute: the lows of at least this many of the job's cycles
LOWS_SHARE = 0.25   # ... in a band under this share of the growth claimed between them refute it
LOWS_CLAIM = 8.0    # ... when the claim is at least this many level steps (step_mib)
REFILL_PACE = 0.5   # refilling: a climb at this share of the pace of the last cycle's refill
FLUSH_ROOM = 0.05   # flushed_at_capacity: a release from within this share of the GPU's capacity ...
FLUSH_ROOM_MIB = 2048.0     # ... or this many MiB, whichever is more, was the allocator's flush


# ------------------------------------------------------------ statistics --


def params_from(env):
    """DEFAULTS with the two the user may set (LEAK_BUCKET_S and
    LEAK_THRESHOLD_MIB_H, from the environment or a dict like it)."""
    p = dict(DEFAULTS)
    for key, name in (("bucket_s", "LEAK_BUCKET_S"), ("threshold", "LEAK_THRESHOLD_MIB_H")):
        value = env.get(name)
        if value not in (None, ""):
            p[key] = float(value)
    return p

def median(values):
    s = sorted(values)
    n = len(s)
    if n == 0:
        return 0.0
    mid = n // 2
    return float(s[mid]) if n % 2 else (s[mid - 1] + s[mid]) / 2.0


def theil_sen(xs, ys):
    """Median of pairwise slopes."""
    slopes = []
    n = len(xs)
    for i in range(n):
        xi, yi = xs[i], ys[i]
        for j in range(i + 1, n):
            dx = xs[j] - xi
            if dx:
                slopes.append((ys[j] - yi) / dx)
    return median(slopes) if slopes else 0.0


def mann_kendall_z(ys):
    """One-sided Mann-Kendall Z with the tie correction."""
    n = len(ys)
    if n < 3:
        return 0.0
    s = 0
    for k in range(n - 1):
        yk = ys[k]
        for j in range(k + 1, n):
            d = ys[j] - yk
            s += (d > 0) - (d < 0)
    counts = {}
    for y in ys:
        counts[y] = counts.get(y, 0) + 1
    ties = sum(t * (t - 1) * (2 * t + 5) for t in counts.values() if t > 1)
    var = (n * (n - 1) * (2 * n + 5) - ties) / 18.0
    if var <= 0:
        return 0.0
    if s > 0:
        return (s - 1) / math.sqrt(var)
    if s < 0:
        return (s + 1) / math.sqrt(var)
    return 0.0


def reduce_points(xs, ys, most=36):
    """At most `most` points: medians of consecutive groups (keeps the
    O(n^2) statistics cheap on 24 h windows)."""
    n = len(xs)
    if n <= most:
        return xs, ys
    g = (n + most - 1) // most
    rx, ry = [], []
    for i in range(0, n, g):
        rx.append(median(xs[i:i + g]))
        ry.append(median(ys[i:i + g]))
    return rx, ry


def inflation(res):
    """Variance inflation of a mean or slope for autocorrelated residuals:
    1 + 2 sum (1 - k/n) rho_k over the initial positive lags (Geyer's
    initial positive sequence; Yue-Wang's effective sample size)."""
    n = len(res)
    ss = sum(r * r for r in res)
    if ss <= 0:
        return 1.0
    out = 1.0
    for k in range(1, n // 4 + 1):
        rho = sum(res[i] * res[i + k] for i in range(n - k)) / ss
        if rho <= 0:
            break
        out += 2 * (1 - k / n) * rho
    return out


def hinge_residuals(xs, ys):
    """Residuals around the best line bent once (flat or slower, then a
    leak: y = a + b x + c max(0, x - x_k), x_k tried every third point),
    so a leak that started inside the stretch leaves no curvature that
    would read as autocorrelation."""
    n = len(xs)
    best, out = None, None
    for k in range(n // 6, n - n // 6, 3):
        xk = xs[k]
        cols = [[1.0] * n, list(xs), [max(0.0, x - xk) for x in xs]]
        # normal equations, 3 x 3
        m = [[sum(a * b for a, b in zip(ci, cj)) for cj in cols] for ci in cols]
        v = [sum(a * y for a, y in zip(ci, ys)) for ci in cols]
        coef = solve3(m, v)
        if coef is None:
            continue
        res = [y - coef[0] - coef[1] * x - coef[2] * h for x, y, h in zip(xs, ys, cols[2])]
        sse = sum(r * r for r in res)
        if best is None or sse < best:
            best, out = sse, res
    if out is None:
        my = sum(ys) / n if n else 0.0
        out = [y - my for y in ys]
    return out


def solve3(m, v):
    """Cramer's rule for a 3 x 3 system (None when singular)."""
    def det(a):
        return (a[0][0] * (a[1][1] * a[2][2] - a[1][2] * a[2][1])
                - a[0][1] * (a[1][0] * a[2][2] - a[1][2] * a[2][0])
                + a[0][2] * (a[1][0] * a[2][1] - a[1][1] * a[2][0]))
    d = det(m)
    if abs(d) < 1e-9:
        return None
    out = []
    for c in range(3):
        mc = [row[:c] + [v[i]] + row[c + 1:] for i, row in enumerate(m)]
        out.append(det(mc) / d)
    return out


def drop_dips(values, share=0.85):
    """Values without isolated dips (lower than `share` of both neighbours)."""
    n = len(values)
    if n < 3:
        return values
    out = []
    for i, v in enumerate(values):
        left = values[i - 1] if i else values[i + 1]
        right = values[i + 1] if i + 1 < n else values[i - 1]
        if v < share * left and v < share * right:
            continue
        out.append(v)
    return out or values


def window_start(xs, w, bh, least=0):
    """The index where a window of w buckets (bh hours each) ending at the
    last point starts (no lower than `least`), or None when the points do
    not cover it: at least 6 and 60 % of its buckets, and data from its
    first bucket on."""
    lo = xs[-1] - (w - 0.5) * bh
    i = len(xs)
    while i > least and xs[i - 1] > lo:
        i -= 1
    if len(xs) - i < max(6, 0.6 * w) or xs[0] > lo + bh:
        return None
    return i


def steady_records(incs):
    """True when the records rise in four buckets of five or more and the
    window's last third grows at least 0.85 of its first third: a leak in
    small blocks, at its pace from its start. A creep that will slow down
    (fragmentation, a cache filling with a time constant of hours) has
    already lost a third of its rate over a two-hour window."""
    n = len(incs)
    if n < 6 or 5 * sum(1 for d in incs if d > 0) < 4 * n:
        return False
    k = n // 3
    first, last = sum(incs[:k]), sum(incs[-k:])
    return first > 0 and last >= 0.85 * first


def hourly_records(incs, per_hour, ratio):
    """True when the records rise in four hours of five or more (hours
    counted back from the window's end, six at least) and the window's
    last third grows at least `ratio` of its first third: the staircase of a
    leak under checkpoints that do not call empty_cache(). A checkpoint's
    buffers raise the pool once, and it keeps them cached; from then on the
    pool grows only at the next checkpoint, by what leaked since the one
    before, so a leak from the job's start sets one record a cycle, alike
    in size, while the buckets between are flat (steady_records, which
    wants four buckets of five, never sees it). New record lengths come in
    a burst and then ever more rarely (about ln(t2 / t1) of them between t1
    and t2), a creep loses a third of its rate over a few hours."""
    hours = [sum(incs[max(0, e - per_hour):e]) for e in range(len(incs), per_hour - 1, -per_hour)]
    n = len(hours)
    if n < 6 or 5 * sum(1 for h in hours if h > 0) < 4 * n:
        return False
    k = n // 3
    last, first = sum(hours[:k]), sum(hours[-k:])
    return first > 0 and last >= ratio * first


def spread(rises, most):
    """True when the growth is spread over at least `most` rises as
    counted by the effective number (sum d)^2 / sum d^2: n alike rises
    count n, one big rise beside small ones about one."""
    total = sum(rises)
    return total > 0 and total * total >= most * sum(d * d for d in rises)


def pack(flat):
    """A flat list of (index, value) pairs as one string: "FIRST|" and then
    index - FIRST and the value, comma-separated, whole numbers without a
    decimal point. The state of 64 series then loads and saves in
    milliseconds (a JSON list of pairs costs tens), with no extra module."""
    if not flat:
        return ""
    first = int(flat[0])
    out = []
    for i in range(0, len(flat), 2):
        v = flat[i + 1]
        out.append("%d,%s" % (flat[i] - first, int(v) if v == int(v) else repr(v)))
    return "%d|%s" % (first, ",".join(out))


def unpack(text):
    """pack()'s flat list back."""
    if not text:
        return []
    first, _, rest = text.partition("|")
    flat = list(map(float, rest.split(",")))
    base = int(first)
    flat[0::2] = [base + int(x) for x in flat[0::2]]
    return flat


def cycle_length(releases, start, unit=1.0):
    """The job's own cycle in hours: the median interval between its
    releases; with one release, the time from the segment's start (hour
    `start`) to it, at least `unit`; `unit` with none (an hour: six
    buckets of the default ten minutes)."""
    if not releases:
        return unit
    if len(releases) == 1:
        return max(unit, releases[0][0] - start)
    return median([b[0] - a[0] for a, b in zip(releases, releases[1:])])


# The order of alert levels. A firing alert is sent again when its evidence
# earns a higher level than the one it went out with (a trend note that
# became a warning, a warning whose OOM came near): once per level, never
# back down (here for a series, in gpuguard_leak.py for a tree).
LEVELS = {"info": 0, "warning": 1, "critical": 2}


def severity_for(oom_h, params):
    if oom_h is None:
        return "warning"
    if oom_h < params["critical_h"]:
        return "critical"
    if oom_h < params["note_h"]:
        return "warning"
    return "info"


# -------------------------------------------------------------- detector --

class Series:
    """One process (or process tree) incarnation: floors and alert state."""

    FIELDS = ("fs", "dts", "pend", "prev_v", "fed_ts", "prev_fed", "bucket", "fine", "fine_min", "fine_cur",
              "fines", "floors", "cut", "streak", "fstreak", "calm", "firing", "last", "noise", "meds", "regap",
              "dipped", "dt")

    def __init__(self, params, key, pid):
        self.p = params
        self.key = key
        self.pid = pid
        self.fs = None              # fine floor seconds, set from the first samples
        self.dts = []
        self.pend = None            # the sample held back: [ts, mib]
        self.prev_v = None          # the last sample fed
        self.fed_ts = None
        self.prev_fed = None
        self.bucket = None          # current bucket index
        self.fine = None            # current fine index
        self.fine_min = None
        self.fine_cur = []          # fine floors of the current bucket
        self._fines = []            # flat: fine_index, floor, ... (the last MAX_FINES)
        self._fines_packed = ""
        self._floors = []           # [bucket_index, floor]
        self._floors_packed = ""
        self.meds = []              # [bucket_index, median of its fine floors] (noisy series)
        self.noise = None           # running median successive difference / level
        self.cut = None             # bucket index where the segment starts
        self.regap = None           # [ts, level, slope, low, high] after a gap that did not cut (see feed)
        self.dipped = False         # the sample before this one was an empty_cache() dip, dropped
        self.dt = None              # the sampling interval (median of the first intervals)
        self.streak = 0
        self.fstreak = 0
        self.calm = 0
        self.firing = False
        self.last = {}

    PACKED = ("fines", "floors", "meds")

    @property
    def floors(self):
        """[bucket_index, floor] pairs, unpacked from the state on first use
        (most cycles never need them)."""
        if self._floors is None:
            flat = unpack(self._floors_packed)
            self._floors = [[int(flat[i]), flat[i + 1]] for i in range(0, len(flat) - 1, 2)]
        return self._floors

    @floors.setter
    def floors(self, value):
        self._floors = value

    @property
    def fines(self):
        """The flat fine floors, unpacked on first use: a live cycle appends
        to the packed string and reads its tail (fines_push, fines_tail), so
        64 series cost no unpack and repack a cycle."""
        if self._fines is None:
            self._fines = unpack(self._fines_packed)
        return self._fines

    @fines.setter
    def fines(self, value):
        self._fines = value

    def fines_push(self, f, v):
        """fines += (f, v), keeping the last MAX_FINES pairs."""
        if self._fines is not None:
            self._fines += (f, v)
            if len(self._fines) > 2 * MAX_FINES:
                del self._fines[:2]
            return
        text = self._fines_packed
        if not text:
            self._fines_packed = pack([f, v])
            return
        first, _, rest = text.partition("|")
        rest += ",%d,%s" % (f - int(first), int(v) if v == int(v) else repr(v))
        if (rest.count(",") + 1) // 2 > MAX_FINES:
            rest = rest.split(",", 2)[2]
        self._fines_packed = first + "|" + rest

    def fines_tail(self, k):
        """The last k numbers of the flat fine floors (fewer when short)."""
        if self._fines is not None:
            return self._fines[-k:]
        first, _, rest = self._fines_packed.partition("|")
        if not rest:
            return []
        flat = list(map(float, rest.rsplit(",", k)[-k:]))
        base = int(first)
        lead = 0 if len(flat) % 2 == 0 else 1      # starts on a value: skip it
        flat = flat[lead:]
        flat[0::2] = [base + int(x) for x in flat[0::2]]
        return flat

    def to_json(self):
        """A JSON-ready dict; the floor lists packed (see pack())."""
        d = {name: getattr(self, name) for name in self.FIELDS if name not in self.PACKED}
        d["fines"] = self._fines_packed if self._fines is None else pack(self._fines)
        if self._floors is None:
            d["floors"] = self._floors_packed
        else:
            d["floors"] = pack([x for pair in self._floors for x in pair])
        d["meds"] = self.meds if isinstance(self.meds, str) else pack([x for pair in self.meds for x in pair])
        d.update(key=self.key, pid=self.pid)
        return d

    @classmethod
    def from_json(cls, params, data):
        s = cls(params, data["key"], data["pid"])
        for name in cls.FIELDS:
            if name in data and name not in cls.PACKED:
                setattr(s, name, data[name])
        fines = data.get("fines")
        if isinstance(fines, str):
            s._fines, s._fines_packed = None, fines
        floors = data.get("floors")
        if isinstance(floors, str):
            s._floors, s._floors_packed = None, floors
        meds = data.get("meds")
        s.meds = meds if isinstance(meds, str) else []     # unpacked when a bucket closes
        return s

    def meds_list(self):
        if isinstance(self.meds, str):
            flat = unpack(self.meds)
            self.meds = [[int(flat[i]), flat[i + 1]] for i in range(0, len(flat) - 1, 2)]
        return self.meds

    # ------------------------------------------------------------ input --
    def fine_s(self):
        """The fine floor length: a tenth of a bucket, shorter (down to ten
        samples) when samples come faster, fixed after the first samples."""
        if self.fs is None:
            return self.p["bucket_s"] / 10.0
        return self.fs

    def restart(self, ts):
        """A new incarnation under the same key (new PID): a new segment."""
        self.cut = int(ts // self.p["bucket_s"])
        self.fines = []
        self.fstreak = 0
        self.regap = None

    def add(self, ts, mib, free_mib=None):
        """Adds a sample; returns an event dict when the alert state changes.
        A sample is held back one step: one under 85 % of both neighbours is
        an empty_cache() dip and never reaches the floors."""
        last = self.last
        last["ts"], last["used"], last["free"] = ts, mib, free_mib
        pend, prev = self.pend, self.prev_v
        self.pend = [ts, mib]
        if pend is None:
            return None
        pts, pv = pend
        if prev is not None and pv < 0.85 * prev and pv < 0.85 * mib:
            self.dipped = True
            return None
        self.prev_v = pv
        ev = self.feed(pts, pv)
        self.dipped = False
        return ev

    def add_many(self, tss, vals, frees=None):
        """add() over columns (a replay): the same result, with the common
        case (a sample inside the current fine floor) kept in local
        variables. Returns the events."""
        events = []
        last = self.last
        n = len(tss)
        i = 0
        while i < n and (self.fs is None or self.pend is None or self.fine is None):
            ev = self.add(tss[i], vals[i], frees[i] if frees is not None else None)
            if ev:
                events.append(ev)
            i += 1
        if i >= n:
            return events
        fs = self.fs
        pts, pv = self.pend
        prev = self.prev_v
        fine, fmin = self.fine, self.fine_min
        fed_ts, prev_fed = self.fed_ts, self.prev_fed
        while i < n:
            ts, mib = tss[i], vals[i]
            # the held-back sample (pts, pv) is decided now
            if prev is not None and pv < 0.85 * prev and pv < 0.85 * mib:
                pts, pv = ts, mib
                self.dipped = True
                i += 1
                continue
            if int(pts // fs) == fine:
                if pv < fmin:  # noqa: PLR1730 -- not min(): no call per sample
                    fmin = pv
                fed_ts = pts
                prev = prev_fed = pv
                pts, pv = ts, mib
                i += 1
                continue
            # a new fine floor: the full path
            self.fine_min, self.fed_ts, self.prev_fed = fmin, fed_ts, prev_fed
            self.prev_v = pv
            last["ts"], last["used"], last["free"] = ts, mib, frees[i] if frees is not None else None
            ev = self.feed(pts, pv)
            self.dipped = False
            if ev:
                events.append(ev)
            fs, fine, fmin = self.fs, self.fine, self.fine_min
            fed_ts, prev_fed = self.fed_ts, self.prev_fed
            prev = pv
            pts, pv = ts, mib
            i += 1
        self.pend = [pts, pv]
        self.prev_v = prev
        self.fine, self.fine_min, self.fed_ts, self.prev_fed = fine, fmin, fed_ts, prev_fed
        last["ts"], last["used"], last["free"] = tss[-1], vals[-1], frees[-1] if frees is not None else None
        return events

    def feed(self, ts, mib):
        p = self.p
        prev_ts = self.fed_ts
        self.fed_ts = ts
        if self.fs is None:
            if prev_ts is not None and ts > prev_ts:
                self.dts.append(ts - prev_ts)
            if len(self.dts) >= 4 or (prev_ts is not None and ts - prev_ts >= p["bucket_s"] / 10.0):
                dt = median(self.dts) if self.dts else p["bucket_s"]
                self.dt = dt
                self.fs = min(p["bucket_s"] / 10.0, max(p["bucket_s"] / 60.0, 10.0 * dt))
                self.fine = None if self.fine is None else int(prev_ts // self.fs)
        f = int(ts // self.fine_s())
        if f == self.fine:
            self.fine_min = min(self.fine_min, mib)
            self.prev_fed = mib
            return None
        if self.regap is not None:
            gts, level, slope = self.regap[:3]
            lo, hi = self.regap[3:5] if len(self.regap) >= 5 else (level, level)
            grown = slope * (ts - gts) / 3600.0
            if ts - gts > p["bucket_s"]:
                self.regap = None
            elif self.restless(mib - level - grown) and not lo - p["step_mib"] <= mib - grown <= hi + p["step_mib"]:
                # the job restarted during the gap: the segment starts there
                self.regap = None
                self.cut = int(gts // p["bucket_s"])
                self.fstreak = self.streak = 0
        restarted = False
        # (a gap left by a dropped empty_cache() dip is no absence: the
        # job was there, at its allocated floor; an evaluation starting
        # right after it is not a restart)
        # (a watcher sampling every 2 minutes, from cron say, leaves no
        # gap by sampling: a gap is 1.5 intervals at the least)
        gap_check = max(p["gap_check_s"], 1.5 * (self.dt or 0.0))
        if prev_ts is not None and ts - prev_ts > gap_check and self.prev_fed is not None \
                and not (self.dipped and ts - prev_ts <= 2 * gap_check):
            # a gap and a different level after it: the process restarted
            # (a watcher that was away finds the level where it was)
            grown = max(0.0, self.last.get("slope") or 0.0) * (ts - prev_ts) / 3600.0
            # (a noisy series differs by its noise from sample to sample,
            # and dropped dips leave gaps: only a change far beyond it counts)
            noise = self.noise or 0.0
            if noise < p["noise_min"]:
                # (against the floor the job held, not its last sample: a
                # watcher away from an evaluation's peak finds the job back
                # at its floor, where it was all along)
                held, hi = self.held_range()
                restarted = self.moved(mib - held - grown)
                # a restarted job's first sample can land near the old
                # level by chance; its warm-up leaves it within minutes:
                # the next bucket's fine floors are held to the same test
                # (a dropped empty_cache dip leaves a 2-sample gap: only
                # longer ones, the job absent, are watched; and not before
                # the noise is known: a noisy series moves by its noise)
                long_gap = ts - prev_ts > 2 * gap_check and self.noise is not None
                # (held to where it landed when higher: a step taken in the
                # gap; a move back into the levels the job held in the hour
                # before the gap, its floor to the peak it was at, is its
                # own cycle going on, not a warm-up)
                self.regap = [ts, max(mib - grown, held), max(0.0, self.last.get("slope") or 0.0), held, hi] \
                    if long_gap and not restarted else None
            elif ts - prev_ts > p["bucket_s"]:
                level = self.meds[-1][1] if isinstance(self.meds, list) and self.meds else self.prev_fed
                restarted = abs(mib - level - grown) > max(p["step_mib"], 6 * noise * level)
        self.prev_fed = mib
        if prev_ts is not None and (ts - prev_ts > p["gap_cut_s"] or restarted):
            self.close_fine()
            self.close_bucket()
            self.cut = int(ts // p["bucket_s"])
            self.fines = []
            self.fine, self.fine_min, self.bucket = f, mib, int(ts // p["bucket_s"])
            return None
        ev = self.close_fine() if self.fine is not None else None
        self.fine, self.fine_min = f, mib
        b = int(ts // p["bucket_s"])
        if self.bucket is None:
            self.bucket = b
            if self.cut is None:
                self.cut = b
        elif b != self.bucket:
            ev = self.close_bucket() or ev
            self.bucket = b
        return ev

    def held_range(self):
        """(lowest, highest) level the job held in the hour before a gap:
        the last sample, the fine floors of the bucket it was in and the
        floors of the five buckets before, in its segment. Its phases come
        back into this range each cycle; a restart starts under it."""
        cut = self.cut if self.cut is not None else -1
        levels = [self.prev_fed] + self.fine_cur + [v for b, v in self.floors[-5:] if b >= cut]
        return min(levels), max(levels)

    def moved(self, change):
        """At the first sample after a gap: is the level somewhere else (a
        restart)? Down by more than step_mib: a leak never lowers the
        floor, and a restarted job loads the same model and warms up
        again, so it comes back at or a little under where it was (the
        tidy restarts: 740 and 1120 MiB under a 53-61 GB level). A level
        higher after a gap is memory that grew while nobody looked (a
        leak's step, an evaluation) until the next bucket shows it still
        moving (restless): cutting at once took the third step of a step
        leak away (a 2 GB step every 6 h, one of them during a six-minute
        gap, was never alerted: tests/test_leak_v3.py)."""
        return -change > self.p["step_mib"]

    def restless(self, change):
        """In the bucket after a gap: has the level left where the job
        landed by more than step_mib, either way? A restarted job's warm-
        up moves it within minutes (the tidy restart@full seed 53: 240 MiB
        higher, then 1 GB higher two minutes later); a step taken during
        the gap stays where it landed."""
        return abs(change) > self.p["step_mib"]

    def close_fine(self):
        if self.fine is None:
            return None
        v = self.fine_min
        self.fine_cur.append(v)
        self.fines_push(self.fine, v)
        return self.evaluate_fast()

    def close_bucket(self):
        if not self.fine_cur:
            return None
        cur = self.fine_cur
        floor = min(drop_dips(cur))
        self.fine_cur = []
        self.floors.append([self.bucket, floor])
        keep = max(self.p["windows"]) + 24 + self.p["skip_buckets"]
        if len(self.floors) > keep:
            del self.floors[:len(self.floors) - keep]
        # the bucket's median and how noisy it is: the median successive
        # difference against the level is large for a noisy series and ~0
        # for phases, dips and saves (they change the level rarely)
        med = median(cur)
        if len(cur) >= 5:
            # the level of a noisy bucket: its mean without the two extremes
            # (more efficient than the median on Gaussian noise, still
            # blind to one dip or spike)
            trimmed = sorted(cur)[1:-1]
            level = sum(trimmed) / len(trimmed)
        else:
            level = med
        meds = self.meds_list()
        meds.append([self.bucket, round(level, 1)])
        if len(meds) > keep:
            del meds[:len(meds) - keep]
        if len(cur) >= 4 and med > 0:
            ratio = median([abs(b - a) for a, b in zip(cur, cur[1:])]) / med
            self.noise = ratio if self.noise is None else 0.8 * self.noise + 0.2 * ratio
        return self.evaluate()

    # --------------------------------------------------------- segments --
    def segment(self):
        """The floors of the current segment: after the last cut (or floor
        collapse that stays) and its warm-up."""
        p = self.p
        fl = self.floors
        start = 0
        cut = self.cut if self.cut is not None else -1
        for j in range(len(fl)):
            if fl[j][0] >= cut:
                start = j
                break
        else:
            return []
        # a collapse under half the recent level that stays: a restart
        # (earlier positions were checked by earlier evaluations)
        k = p["collapse_buckets"]
        n = len(fl)
        # a noisy series' floors are the tail of its noise: they say nothing
        # about a restart
        j = n if (self.noise or 0.0) >= p["noise_min"] else max(start + 1, n - k - 2)
        while j + k <= n:
            ref = median([v for _, v in fl[max(start, j - 6):j]])
            if fl[j][1] < p["collapse"] * ref and all(fl[i][1] < p["collapse"] * ref for i in range(j, j + k)):
                start = j
                self.cut = fl[j][0]
                j += k
                continue
            j += 1
        seg = fl[start:]
        skip = p["skip_buckets"]
        if seg and seg[0][0] == self.cut:
            seg = seg[skip:]
        return seg

    def settled(self, seg):
        """The segment from the first hour its floor holds still (moves
        less than half the threshold's hourly growth), when it rose before
        that hour: a warm-up that outlasts the skipped half hour (a 20
        minute time constant, new record lengths coming often at first)
        has ended there. Its tail in a long window, with a few record
        rises hours later, read as a steady 64-111 MiB/h (tidy records 41,
        records@full 49). A leak at the threshold in small blocks never
        holds still for an hour; one in big blocks does, and the step test
        sees it on the whole segment."""
        p = self.p
        k = max(1, round(3600.0 / p["bucket_s"]))
        still = 0.5 * p["threshold"]
        vals = [v for _, v in seg]
        for j in range(1, len(vals) - k):
            hour = vals[j:j + k + 1]
            if max(hour) - min(hour) < still:
                return seg[j:] if vals[j] - min(vals[:j]) >= p["min_growth"] else seg
        return seg

    def releases(self, seg):
        """(hour, floor) of each release in the segment: a bucket floor more
        than step_mib under the one before it. A leak never lowers the
        floor; empty_cache() after a checkpoint or an evaluation does, and
        so does the allocator itself when cudaMalloc fails near the GPU's
        capacity (it frees its cached blocks and tries again: DeepSpeed's
        "pytorch allocator cache flushes"). Either way the pool then holds
        what is live."""
        bh = self.p["bucket_s"] / 3600.0
        step = self.p["step_mib"]
        return [(b * bh, v) for (_, u), (b, v) in zip(seg, seg[1:]) if v < u - step]

    def lows_refute(self, releases, now, span, rate):
        """True when the window has a release of its own and the floors
        right after the releases of the last max(span, LOWS_CYCLES cycles)
        hours stay in a band narrower than LOWS_SHARE of the growth the
        window's pace claims between the first and the last of them, a
        claim of LOWS_CLAIM level steps at least. After a release the pool
        holds what is live, so a leak lifts those lows cycle after cycle
        at its own pace; a pool that only refills what the release gave
        back (a fragmented cache climbing to the GPU's capacity and being
        flushed, every few hours) comes back to the same low each time.
        Smaller claims are left alone: the lows scatter with the batch in
        flight, and a slow leak shows in them only over many cycles."""
        p = self.p
        if len(releases) < 2:
            return False
        back = max(span, LOWS_CYCLES * (self.last.get("cycle_h") or 1.0))
        lows = [(x, y) for x, y in releases if x >= now - back]
        if len(lows) < 2 or lows[-1][0] < now - span:
            return False
        ly = [y for _, y in lows]
        claimed = rate * (lows[-1][0] - lows[0][0])
        return claimed >= LOWS_CLAIM * p["step_mib"] and max(ly) - min(ly) < LOWS_SHARE * claimed

    def refilling(self, seg, releases, now, span):
        """True when the window's growth all came after the job's last
        release, that release is no older than one and a half of the job's
        cycles, and the floor is still under the level the pool held in the
        cycle before it. A release gives the driver back what the cache
        held but no live tensor used; the steps that follow allocate it
        again, so the climb back to the pre-release level is the same
        memory coming back (a checkpoint's empty_cache(), a fragmented pool
        flushed when cudaMalloc failed near the GPU's capacity, then
        climbing in gather-sized steps for hours until the next flush). A
        leak's memory is never given back: it shows in the next release's
        low (cycle_lows, lows_refute) or as a floor above the old level,
        at most a cycle and a half later. A release older than that says
        nothing about today's climb.

        The cycle before is the one between the last two releases. When it
        ended in a flush (its level reached flush_line()), its ceiling is
        the capacity itself, not the level it happened to reach: the
        allocator flushes wherever the next gather does not fit, a little
        higher or lower each time. Such a cycle may also be the job's
        first, from the segment's start to its first flush: one flush
        shows where the pool is flushed. A release from lower down (an
        empty_cache()) needs a whole cycle before it to show its level."""
        if not releases:
            return False
        bh = self.p["bucket_s"] / 3600.0
        last = releases[-1][0]
        first = releases[-2][0] if len(releases) >= 2 else seg[0][0] * bh
        if now - span < last - bh or now - last > 1.5 * (self.last.get("cycle_h") or self.hour()):
            return False
        before = [v for b, v in seg if first <= b * bh < last]
        if not before:
            return False
        ceiling = max(before)
        line = self.flush_line()
        held = [v for b, v in self.meds_list() if first <= b * bh < last]
        if line is not None and held and max(held) >= line:
            ceiling = self.last["used"] + self.last["free"]
        elif len(releases) < 2:
            return False
        # the climb keeps the pace at which the cycle refills what its
        # release gave back (a leak of 60 MiB/h under evaluations that
        # take and give back GBs does not: it is judged as any growth)
        refill = (max(before) - releases[-1][1]) / max(last - first, bh)
        now_level = median([v for _, v in seg[-3:]])
        pace = (now_level - releases[-1][1]) / max(now - last, bh)
        return pace >= REFILL_PACE * refill and now_level < ceiling

    def flush_line(self):
        """The level from which a release is the allocator's flush: within
        FLUSH_ROOM of the GPU's capacity (known from the free memory: the
        last sample plus what is free), or None when the capacity is
        unknown."""
        free = self.last.get("free")
        if free is None:
            return None
        cap = self.last["used"] + free
        return cap - max(FLUSH_ROOM * cap, FLUSH_ROOM_MIB)

    def flushed_at_capacity(self, seg, releases):
        """True when one of the segment's releases came from a level at today's
        floor or above (less a level step) and within FLUSH_ROOM of the
        GPU's capacity (known from the free memory: the last sample plus
        what is free). A pool that reaches the capacity is not killed:
        cudaMalloc fails, the caching allocator frees its cached blocks and
        tries again, and the pool climbs again (a ZeRO-3 job run near the
        GPU's limit). A job that came back from where its floor stands
        today has shown that this level is where it is flushed, not where
        it dies. An evaluation's peak that came near the capacity and was
        given back does not count while the floor is lower: the leak under
        it is paged (corpus C cron_leak 3, tests/test_leak_v3.py)."""
        flush = self.flush_line()
        if flush is None or not releases:
            return False
        bh = self.p["bucket_s"] / 3600.0
        line = max(median([v for _, v in seg[-3:]]) - self.p["step_mib"], flush)
        # (the level before a release is the buckets' median: a pool flushed
        # minutes after its last climb held that level for less than a
        # bucket, and the bucket's floor is the level before the climb)
        levels = self.meds_list()
        start = seg[0][0] * bh
        for hour, _ in releases:
            held = [v for b, v in levels if start <= b * bh < hour]
            if held and max(held) >= line:
                return True
            start = hour
        return False

    def above_held(self, seg, since_h):
        """True when the recent floor stands above every level the job held
        before the window (for two buckets in a row) by min_growth: a leak
        keeps setting records that persist, while a job coming back to a
        level it already held (an evaluation phase that raised the cache, a
        climb back after empty_cache(), a batch shape seen before) does not."""
        p = self.p
        bh = p["bucket_s"] / 3600.0
        vals = [float(v) for _, v in seg]
        xs = [b * bh for b, _ in seg]
        # (a level the pool was held at for an evaluation or a checkpoint
        # copy, then given back, was never the job's: excursions())
        away = self.excursions(vals)
        prior = [min(vals[j], vals[j + 1]) for j in range(len(vals) - 1)
                 if xs[j + 1] < since_h and not (away[j] or away[j + 1])]
        if not prior:
            return True
        return median(vals[-3:]) - max(prior) >= p["min_growth"]

    def level_shifts(self, ys):
        """De-shifted floors and the persistent up-shifts [(index, size)]."""
        p = self.p
        n = len(ys)
        d = [ys[i] - ys[i - 1] for i in range(1, n)]
        if not d:
            return ys, []
        med = median(d)
        mad = median([abs(x - med) for x in d]) * 1.4826
        limit = max(p["step_mib"], p["step_noise"] * (mad + 10.0))
        # a jump stands out from the diffs around it (a cache filling fast
        # has large diffs everywhere: none of them is a jump)
        m = len(d)
        jumps = []
        for i, x in enumerate(d):
            if -limit < x - med < limit and abs(x) < limit:
                jumps.append(False)         # small: no jump whatever surrounds it
                continue
            around = sorted(d[max(0, i - 3):i] + d[i + 1:i + 4])
            local = around[len(around) // 2] if around else med
            jumps.append(abs(x - local) >= limit)
        small = [x for x, j in zip(d, jumps) if not j]
        trend = sum(small) / len(small) if small else 0.0
        out = [ys[0]]
        offset = 0.0
        ups = []
        self.njumps = sum(jumps[-36:])
        for i, x in enumerate(d):
            if jumps[i]:
                near = [d[k] for k in range(max(0, i - 6), min(m, i + 7)) if not jumps[k]]
                local = sum(near) / len(near) if len(near) >= 3 else trend
                offset += x - local
                if x > 0:
                    ups.append((i + 1, x - local))
            out.append(ys[i + 1] - offset)
        # persistent: the level stays up (the minimum of what follows, up to
        # 6 buckets, is above everything in the hour before by most of the
        # jump; the end of a lower phase only returns to an earlier level)
        keep = []
        for i, size in ups:
            after = ys[i:i + 6]
            before = ys[max(0, i - 6):i]
            if len(after) >= 2 and before and min(after) - max(before) >= 0.5 * size:
                keep.append((i, size))
        return out, keep

    def staircase(self, xs, steps):
        """Rate (MiB/h) when the persistent steps are a step leak: the
        longest run of the last (up to 6) steps that are alike in size and
        pace, at least stair_min of them. An earlier up-shift of another
        size (the end of a warm-up) does not hide a run, but a run that
        does not start the segment needs one repeat more: three alike
        steps after an unlike one are also what new record lengths can
        draw (tidy records@full seed 6: +500, then +280, +300, +320 MiB
        every 1.4 h, then no more)."""
        p = self.p
        for k in range(min(6, len(steps)), p["stair_min"] - 1, -1):
            if k < len(steps) and k <= p["stair_min"]:
                break
            rate = self.stair_rate(xs, steps[-k:])
            if rate is not None and self.stairs_kept(steps[-k:]):
                return rate
        return None

    def stairs_kept(self, steps):
        """True when the floor still holds what the steps added: a step
        leak's level after k steps is k steps above where it began. An
        evaluation that raises the pool by the same amount every few
        hours, given back at the next checkpoint's empty_cache(), makes up-
        shifts alike in size and pace too, but the level comes back down
        between them."""
        raw = self.stair_raw
        first = steps[0][0]
        before = median(raw[max(0, first - 6):first])
        return median(raw[-3:]) - before >= 0.5 * sum(size for _, size in steps)

    def stair_rate(self, xs, steps):
        sizes = [s for _, s in steps]
        times = [xs[i] for i, _ in steps]
        gaps = [b - a for a, b in zip(times, times[1:])]
        ms, mg = median(sizes), median(gaps)
        # a leak's blocks are all alike and come at a steady pace; new
        # record lengths (a healthy staircase) come ever more rarely
        if mg <= 0 or min(sizes) < 0.75 * ms or max(sizes) > 1.25 * ms:
            return None
        if min(gaps) < 0.65 * mg or max(gaps) > 1.35 * mg:
            return None
        if len(gaps) == 2 and max(gaps) > 1.5 * min(gaps):
            # two intervals: their median is their mean, so the bounds
            # above let one be twice the other; three one-time jumps of
            # alike size (tidy mixed 29: +3.8, +3.5, +3.7 GiB after 4.2 h,
            # then 2.5 h) are not a leak's steady pace
            return None
        if len(gaps) >= 2 and all(b > a for a, b in zip(gaps, gaps[1:])) and gaps[-1] > 1.2 * gaps[0]:
            return None
        if xs[-1] - times[-1] > 1.5 * mg:
            return None                 # the steps stopped coming
        return ms / mg

    # --------------------------------------------------------- verdicts --
    def window_verdict(self, xs, ys, before):
        """(leaking, slope, z, trend) of one window; `before` are the de-shifted
        floors (x, y) just before it."""
        p = self.p
        growth = median(ys[-3:]) - median(ys[:3])
        if growth < p["min_growth"]:
            return False, 0.0, 0.0, "flat"
        jumps = [b - a for a, b in zip(ys, ys[1:])]
        if max(jumps) > p["max_jump_share"] * growth or sum(1 for d in jumps if d > 0) < p["min_rises"]:
            return False, 0.0, 0.0, "jumpy"
        rises = sorted(d for d in jumps if d > 0)
        if len(rises) < p["few_rises"] and rises[0] < 0.5 * median(rises) \
                and median(rises) > 2 * growth / (len(ys) - 1):
            # growth carried by a few bursty rises of unlike sizes (180,
            # 160, 20, 120 MiB over 3 h): new record lengths, not an
            # allocator leaking blocks of one size (those rise alike, or
            # in most buckets by about the window's rate)
            return False, 0.0, 0.0, "steps"
        rx, ry = reduce_points(xs, ys)
        beta = theil_sen(rx, ry)
        if beta < p["threshold"]:
            return False, beta, 0.0, "slow"
        z = mann_kendall_z(ry)
        if z < p["z_min"]:
            return False, beta, z, "noisy"
        if self.decelerating(before[0] + xs, before[1] + ys, beta):
            return False, beta, z, "decelerating/saturating"
        prev = 0.0
        if len(before[0]) >= max(6, len(xs) // 2):
            prev = theil_sen(*reduce_points(*before))
        return True, beta, z, "accelerating" if prev > 0 and beta > 1.5 * prev else "steady"

    def decelerating(self, xs, ys, beta):
        """True when the growth keeps slowing: the rates of up to 6 chunks
        (the window and the one before it) fall, and the last is under
        decel_ratio of the fastest before it (a cache filling to a ceiling)."""
        n = len(xs)
        k = 6 if n >= 24 else 3
        size = n // k
        if size < 2:
            return False
        rates = []
        for c in range(k):
            a = n - (k - c) * size
            cx, cy = reduce_points(xs[a:a + size], ys[a:a + size], 12)
            rates.append(theil_sen(cx, cy))
        top = max(rates[:-1])
        if rates[0] > 0 and rates[-1] < 0.8 * rates[0] and all(b < 0.95 * a for a, b in zip(rates, rates[1:])):
            return True                 # every chunk slower than the one before
        if top <= 0 or rates[-1] >= self.p["decel_ratio"] * top:
            return False
        # from the fastest chunk on, the rate keeps falling (flat hours
        # before a growth's onset do not count either way)
        after = rates[rates.index(top):]
        slack = 0.1 * top
        return all(b <= a + slack for a, b in zip(after, after[1:]))

    def slowed_since_start(self, whole, until, big, rate):
        """True when the window's pace is under decel_ratio of the pace the
        records kept over the first half of the segment before it (from
        early_skip_h into the segment, when a warm-up that outlasted the
        skipped half hour is over, and two hours before the window at
        least; one-time jumps left out). A pool that creeps (fragmentation,
        a cache filling) sets its records ever more rarely from the job's
        start, and it often holds still for an hour on the way: the
        settled() cut then starts the windows there and hides the faster
        hours before, so the chunk test above sees a young, steady window.
        A leak keeps its pace from the start, and one that starts later has
        a flat first half."""
        wx = whole[0]
        t0 = wx[0] + self.p["early_skip_h"]
        if until - t0 < 2.0:
            return False
        if whole[2] is None:
            whole[2] = self.records(whole[1])
        wrec = whole[2]
        half = t0 + (until - t0) / 2.0
        grown = sum(d for k in range(1, len(wx)) if t0 < wx[k] <= half
                    for d in (wrec[k] - wrec[k - 1],) if 0 < d < big)
        early = grown / (half - t0)
        return early > self.p["threshold"] and rate < self.p["decel_ratio"] * early

    def long_steady(self, incs, span):
        """True when a window of 12 h or more, young as it is, still grows
        in its last third by at least 0.7 of its first third: over that
        span a creep that will stop (fragmentation, a cache filling, time
        constants of 2-8 h) has lost more than half its rate, while a leak
        in lumpy records (a large-pool leak under a spread of batch sizes,
        a record every hour or two) keeps its pace. Such a leak from the
        job's start has no hours before a 12 h window until 18 h in."""
        k = len(incs) // 3
        if span < self.p["young_long_h"] or k < 6:
            return False
        first = sum(incs[:k])
        return first > 0 and sum(incs[-k:]) >= self.p["young_long_ratio"] * first

    def records(self, raw):
        """The running maximum of the floors, where a jump up that comes
        back down within two hours sets no record (excursions)."""
        rec, top = [], raw[0]
        for v, away in zip(raw, self.excursions(raw)):
            top = v if v > top and not away else top
            rec.append(top)
        return rec

    def records_verdict(self, xs, raw, whole=None):
        """(leaking, slope, z, trend, span_h) from the floor's records.

        The caching allocator only grows its pool when a step needs more
        than it holds, and gives memory back only on empty_cache(): a
        healthy job's floor comes back to levels it already held (after an
        evaluation, a checkpoint's release, a restart of the data loader),
        and its new records come ever more rarely (records of a bounded
        quantity: about ln(t2 / t1) of them between t1 and t2). A leak keeps
        setting records, at a steady pace, and the job holds them. So each
        window is judged on the running maximum of the floor: its growth
        without one-time jumps, spread over at least min_rises records that
        keep coming in the window's second half, at the threshold's rate or
        faster, and held by the floor at the end. `whole` is the segment's
        (xs, floors) from its start, when a long warm-up was cut from xs
        (settled): a creep's early pace is judged there."""
        n = len(raw)
        if n < 2:
            return False, 0.0, 0.0, "flat", 0.0
        rec = self.records(raw)
        # the whole segment's records, made when a window first needs them
        whole = [xs, raw, rec] if whole is None or len(whole[0]) == n else [whole[0], whole[1], None]
        out = self.record_windows(xs, raw, rec, whole)
        if out[0] or (self.noise or 0.0) >= self.p["noise_min"]:
            return out
        cyc = self.cycle_lows(xs, raw)
        return cyc if cyc[0] else out

    def cycle_lows(self, xs, raw):
        """(leaking, slope, z, trend, span_h) from the lows of each hour.
        After an empty_cache() the pool holds what is live, so under a
        checkpoint or evaluation sawtooth the hour's low is the allocated
        memory: a healthy job comes back to the same lows, hour after hour
        (they scatter with the batch in flight, without a trend), while a
        leak raises them cycle after cycle. Each window of 6, 12 or 24
        hourly lows is tested as floors are: Theil-Sen >= the threshold,
        Mann-Kendall Z >= z_min, growth >= min_growth, not decelerating."""
        p = self.p
        k = p["held_buckets"]
        n = len(raw)
        lows_x, lows_y = [], []
        for end in range(n, k - 1, -k):
            lows_x.append(xs[end - 1])
            lows_y.append(min(raw[end - k:end]))
        lows_x.reverse()
        lows_y.reverse()
        best = (False, 0.0, 0.0, "flat", 0.0)
        infl = None
        for w in (6, 12, 24):
            if len(lows_y) < w:
                break
            wx, wy = lows_x[-w:], lows_y[-w:]
            tail = raw[n - w * k:]
            # with no cycle (the pool never given back: the lows are the
            # floors), a leak still raises the low of almost every hour,
            # new batch shapes raise a few, in a burst that stops...
            cycles = any(b < a - p["min_growth"] for a, b in zip(tail, tail[1:]))
            if not cycles and w < 12:
                continue        # ... and is judged over half a day at least
            growth = median(wy[-2:]) - median(wy[:2])
            beta = theil_sen(wx, wy)
            z = mann_kendall_z(wy)
            span = wx[-1] - wx[0] + k * p["bucket_s"] / 3600.0
            d = [b - a for a, b in zip(wy, wy[1:])]
            # (a jump stands out from the hour-to-hour scatter of the lows)
            big = max(p["step_mib"], 4.0 * median([abs(x) for x in d]))
            md = median([x for x in d if x < big])
            if max(d) >= big:
                # a jump (a new batch shape) raises every low after it at
                # once: a level, not a pace; what is left must rise. Jumps
                # that come alike and steadily are the staircase test's
                # (evaluate); faster smooth leaks set records every bucket
                off, flat = 0.0, [wy[0]]
                for x, y in zip(d, wy[1:]):
                    off += x - md if x >= big else 0.0
                    flat.append(y - off)
                wy = flat
                growth = median(wy[-2:]) - median(wy[:2])
                beta = theil_sen(wx, wy)
                z = mann_kendall_z(wy)
            rises = [b - a for a, b in zip(wy, wy[1:]) if b > a]
            if len(rises) < (0.5 if cycles else 0.75) * len(d) or not spread(rises, w / 3.0):
                continue
            if z >= p["z_min"] and len(lows_y) >= 12:
                # lows that wander for hours (an MoE's expert load, a
                # curriculum) hold fewer independent hours than they
                # number: the same inflation as the noisy tier, from the
                # segment's lows around a line bent once
                if infl is None:
                    infl = inflation(hinge_residuals(lows_x[-24:], lows_y[-24:]))
                z /= math.sqrt(infl)
            if growth >= p["min_growth"] and beta >= p["threshold"] and z >= p["z_min"] \
                    and not self.decelerating(lows_x, lows_y, beta):
                # lows that come back to where the job's lows already were
                # (a wander in a band, an MoE's expert load) are no
                # growth: a leak's lows stand above every earlier one
                prior = lows_y[:-w]
                if prior and median(lows_y[-2:]) - max(prior) < p["min_growth"]:
                    best = (False, beta, z, "back to a low held before", span)
                    continue
                return True, beta, z, "steady (cycle lows)", span
            if beta > best[1]:
                best = (False, beta, z, "flat", span)
        return best

    def excursions(self, raw):
        """Per floor, True inside an excursion: a jump up of at least
        step_mib that comes back down by most of it within two hours (an
        evaluation or a checkpoint copy that held the pool up for a while,
        then empty_cache() gave it back). Such a level is not the job's:
        it sets no record. A jump that has not come back yet is kept."""
        p = self.p
        n = len(raw)
        away = [False] * n
        span = 2 * max(1, round(3600.0 / p["bucket_s"]))
        # a segment that begins inside an excursion (it was cut there)
        lead = 0
        while lead < min(n - 3, span) and raw[lead] >= median(raw[lead + 1:lead + 7]) + p["step_mib"]:
            away[lead] = True
            lead += 1
        # a climb back after empty_cache() (a dip, then the old level) is
        # recovery, not a jump: a jump is measured from the level held
        # before it (the highest floor so far outside excursions)
        held = raw[lead] if n else 0.0
        for a in range(1, n):
            base = max(raw[a - 1], held)
            jump = raw[a] - base
            if away[a] or jump < p["step_mib"]:
                if not away[a] and raw[a] > held:
                    held = raw[a]
                continue
            for b in range(a + 1, min(n, a + span + 1)):
                if raw[b] <= base + 0.5 * jump:
                    for k in range(a, b):
                        away[k] = True
                    break
            else:
                held = raw[a]
        return away

    def record_windows(self, xs, raw, rec, whole):
        """records_verdict's windows over one record series."""
        p = self.p
        bh = p["bucket_s"] / 3600.0
        end = xs[-1]
        best = (False, 0.0, 0.0, "flat", 0.0)
        for w in p["windows"]:
            i = window_start(xs, w, bh, 1)
            if i is None:
                break
            ok, rate, z, trend = self.record_window(xs, raw, rec, i, whole)
            if ok:
                return True, rate, z, trend, end - xs[i - 1]
            if rate > best[1] or best[4] == 0:
                best = (False, rate, z, trend, end - xs[i - 1])
        return best

    def record_window(self, xs, raw, rec, i, whole):
        """(leaking, rate, z, trend) of the records from index i on (i >= 1)."""
        p = self.p
        n = len(raw)
        base = rec[i - 1]
        incs = [rec[k] - rec[k - 1] for k in range(i, n)]
        pos = [d for d in incs if d > 0]
        if not pos:
            return False, 0.0, 0.0, "flat"
        # a one-time jump (a new batch shape) is a level, not a rate
        md = median(pos)
        big = 4.0 * md if md >= p["step_mib"] / 4.0 else p["step_mib"]
        small = [d for d in pos if d < big]
        growth = sum(small)
        span = xs[-1] - xs[i - 1]
        rate = growth / span if span > 0 else 0.0
        if growth < p["min_growth"]:
            return False, rate, 0.0, "flat"
        if len(small) < p["min_rises"] or max(small) > p["max_jump_share"] * growth:
            return False, rate, 0.0, "jumpy"
        # (the test sees the records without the one-time jumps: a new
        # batch shape in the first third would hide a steady pace, one in
        # the last third would fake it)
        small_incs = [d if d < big else 0.0 for d in incs]
        cycled = hourly_records(small_incs, max(1, round(3600.0 / p["bucket_s"])), p["young_long_ratio"])
        if len(small) < p["few_rises"] and min(small) < 0.5 * median(small) \
                and median(small) > 2 * growth / len(incs) and not cycled:
            # a few bursty records of unlike sizes: new record lengths
            return False, rate, 0.0, "steps"
        if rate < p["threshold"]:
            return False, rate, 0.0, "slow"
        # a leak's growth is spread over many records (one every record_h
        # hours at the least: under a spread of activation sizes the pool
        # grows only when the leak and a large batch together pass the
        # last record, every hour or two); a few new batch shapes carry
        # theirs in a handful of unlike rises. The effective number of
        # records, (sum d)^2 / sum d^2, counts alike rises fully and small
        # ones beside big ones hardly.
        if not spread(small, max(p["min_rises"], span / p["record_h"])):
            return False, rate, 0.0, "steps"
        half = xs[i - 1] + span / 2.0
        late = sum(d for k, d in zip(range(i, n), incs) if 0 < d < big and xs[k] > half)
        if late < 0.25 * growth:
            return False, rate, 0.0, "decelerating/saturating"
        held = max(min(raw[j], raw[j + 1]) for j in range(max(i - 1, n - 7), n - 1))
        if held < base + 0.5 * growth:
            return False, rate, 0.0, "not held"
        j = max(0, i - 1 - (n - i))
        free = self.last.get("free")
        if 2 * (i - 1 - j) < n - i and (free is None or free > 24.0 * rate) \
                and not steady_records(small_incs) and not cycled and not self.long_steady(small_incs, span):
            # no hours before the window to tell a creep that will slow
            # down (fragmentation, a cache filling) from a leak's pace;
            # one that fills the GPU within a day is not waited for
            return False, rate, 0.0, "young"
        if self.decelerating(xs[j:], rec[j:], rate) or self.slowed_since_start(whole, xs[i - 1], big, rate):
            return False, rate, 0.0, "decelerating/saturating"
        _, ry = reduce_points(xs[i - 1:], raw[i - 1:])
        z = mann_kendall_z(ry)
        if z < p["records_z"]:
            # records without a trend in the floors under them: a level
            # that wanders (MoE routing) reaching a new high now and then
            return False, rate, z, "wandering"
        prev = 0.0
        if i - 1 - j >= 6:
            prev = (rec[i - 1] - rec[j]) / (xs[i - 1] - xs[j]) if xs[i - 1] > xs[j] else 0.0
        return True, rate, z, "accelerating" if prev > 0 and rate > 1.5 * prev else "steady"

    def windows_verdict(self, xs, ys):
        """(leaking, slope, z, trend, span_h) over the time windows."""
        p = self.p
        bh = p["bucket_s"] / 3600.0
        leaking, slope, z, trend, span = False, 0.0, 0.0, "flat", 0.0
        if not xs:
            return leaking, slope, z, trend, span
        end = xs[-1]
        for w in p["windows"]:
            i = window_start(xs, w, bh)
            if i is None:
                break
            lo = end - (w - 0.5) * bh
            j = i
            while j > 0 and xs[j - 1] > lo - w * bh:
                j -= 1
            ok, beta, zz, tr = self.window_verdict(xs[i:], ys[i:], (xs[j:i], ys[j:i]))
            if ok:
                return True, beta, zz, tr, end - xs[i]
            if beta > slope or span == 0:
                slope, z, trend, span = beta, zz, tr, end - xs[i]
        return leaking, slope, z, trend, span

    def noisy_verdict(self, start):
        """(slope, z, span_h) when the bucket levels of a noisy series grow:
        floors of a series with a coefficient of variation of 0.1-0.5 are
        the tail of its noise, the levels (trimmed means) its level, with
        independent errors of about equal size from bucket to bucket.

        On each window (noisy_windows, at least 80 % covered), the least-
        squares slope of the levels is tested against its standard error
        (the residuals' standard deviation: the levels are trimmed means
        already; a MAD on 36 residuals is an unsteady scale: at z 3.5 it
        flagged 3 of 80 healthy traces, the standard deviation none). The
        variance is inflated for autocorrelated residuals (inflation():
        the window's own, or the whole segment's around a once-bent line
        when larger: a level that wanders for hours has few independent
        buckets in 6 h, and a 6 h window cannot see that wander itself).
        It fires when z >= noisy_z (tested every bucket on three windows:
        many looks, hence 4.0, not 2.33), the Theil-Sen slope (robust, the
        rate reported) >= the threshold, and the growth >= min_growth. On
        Gaussian noise the least-squares slope is the efficient estimate
        (Mann-Kendall on group medians, the first cut, threw part of the
        evidence away): its z grows as T^1.5."""
        p = self.p
        meds = [m for m in self.meds_list() if m[0] >= start]
        if not meds:
            return None
        bh = p["bucket_s"] / 3600.0
        end = meds[-1][0]
        long_infl = None
        for w in p["noisy_windows"]:
            pts = [m for m in meds if m[0] > end - w]
            if len(pts) < 0.8 * w:
                break
            xs = [b * bh for b, _ in pts]
            ys = [float(v) for _, v in pts]
            n = len(xs)
            mx, my = sum(xs) / n, sum(ys) / n
            sxx = sum((x - mx) ** 2 for x in xs)
            if sxx <= 0:
                continue
            b_ols = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
            res = [y - my - b_ols * (x - mx) for x, y in zip(xs, ys)]
            ss = sum(r * r for r in res)
            if ss <= 0:
                continue
            z = b_ols / math.sqrt(ss / (n - 2) / sxx)
            if z < p["noisy_z"]:
                continue
            # autocorrelated noise (a level that wanders for an hour or
            # more) carries fewer independent buckets than it numbers: the
            # variance is inflated, from this window's residuals and from
            # the whole segment's around a bent line (a window shorter than
            # the wander cannot see it), computed only when z passes
            if long_infl is None:
                lx = [b * bh for b, _ in meds[-max(p["noisy_windows"]):]]
                ly = [float(v) for _, v in meds[-max(p["noisy_windows"]):]]
                long_infl = inflation(hinge_residuals(lx, ly))
            z /= math.sqrt(max(inflation(res), long_infl))
            if z < p["noisy_z"]:
                continue
            beta = theil_sen(*reduce_points(xs, ys, 48))
            span = xs[-1] - xs[0]
            if beta < p["threshold"] or beta * span < p["min_growth"]:
                continue
            return beta, z, span
        return None

    def phase_split(self, ys):
        """The level between two alternating phases (RL rollout/train), or
        None: the largest gap between sorted floors, with both sides >= 25 %
        of the points and the gap wide against each side's spread."""
        n = len(ys)
        if n < 12:
            return None
        s = sorted(ys)
        lo_i = n // 4
        best, at = 0.0, None
        for i in range(lo_i, n - lo_i):
            g = s[i] - s[i - 1]
            if g > best:
                best, at = g, i
        if at is None or best < self.p["step_mib"]:
            return None
        low, high = s[:at], s[at:]
        spread = max(low[int(0.9 * (len(low) - 1))] - low[int(0.1 * (len(low) - 1))],
                     high[int(0.9 * (len(high) - 1))] - high[int(0.1 * (len(high) - 1))])
        if best < 2 * spread:
            return None
        return (s[at - 1] + s[at]) / 2.0

    def evaluate(self):
        """The slow tier, once per bucket."""
        p = self.p
        seg = self.segment()
        xs = [b * p["bucket_s"] / 3600.0 for b, _ in seg]
        raw = [float(v) for _, v in seg]
        self.njumps = 0
        leaking, slope, z, trend, span = False, 0.0, 0.0, "flat", 0.0
        if not raw or max(raw) - min(raw) < p["min_growth"]:
            ys, ups, rate, split = raw, [], None, None      # flat: nothing to test
        else:
            ys, ups = self.level_shifts(raw)
            self.stair_raw = raw
            rate = self.staircase(xs, ups) if ups else None
            split = self.phase_split(raw[-36:]) if self.njumps >= 6 else None
        if not raw or max(raw) - min(raw) < p["min_growth"]:
            pass
        elif rate is not None and rate >= p["threshold"]:
            leaking, slope, trend = True, rate, "steps"
            span = xs[-1] - xs[ups[-min(len(ups), 6)][0]]
        elif split is not None:
            # alternating phases: each phase against itself, the busier one decides
            high = [(x, y) for x, y in zip(xs, raw) if y >= split]
            low = [(x, y) for x, y in zip(xs, raw) if y < split]
            recent = xs[-1] - 6.0
            main = max((high, low), key=lambda ph: sum(1 for x, _ in ph if x > recent))
            leaking, slope, z, trend, span = self.windows_verdict([x for x, _ in main], [y for _, y in main])
            trend = trend if trend != "steady" else "steady (phase-aware)"
            held = [[round(x / (p["bucket_s"] / 3600.0)), y] for x, y in main]
            since = main[-1][0] - span if main else 0.0
            if not leaking and (self.noise or 0.0) < p["noise_min"]:
                # the low phase of every hour (the memory left when the
                # cache is given back) is compared across the job's cycles
                ok = self.cycle_lows(xs, raw)
                if ok[0]:
                    leaking, slope, z, trend, span = ok
                    held, since = seg, xs[-1] - span
        else:
            # the windows start where a long warm-up settled (the step test
            # above keeps the whole segment: a run of steps after an unlike
            # one needs one more)
            settled = self.settled(seg)
            whole = (xs, raw)
            if len(settled) < len(seg):
                cut = len(seg) - len(settled)
                xs, ys = xs[cut:], [y - ys[cut] + raw[cut] for y in ys[cut:]]
            if (self.noise or 0.0) < p["noise_min"]:
                # (a noisy series' floors are the tail of its noise: the
                # noisy tier below judges its levels)
                leaking, slope, z, trend, span = self.records_verdict(xs, raw[len(raw) - len(xs):], whole)
            held, since = seg, xs[-1] - span
        if leaking and trend != "steps" and not self.above_held(held, since):
            leaking, trend = False, "back to a level held before"
        if leaking:
            # (only then: a scan of the segment every bucket cost the 7-day
            # replay a fifth of its time)
            releases = self.releases(seg)
            self.last["cycle_h"] = cycle_length(releases, seg[0][0] * p["bucket_s"] / 3600.0, self.hour())
            self.last["released"] = len(releases)
            if "cycle lows" not in trend and self.lows_refute(releases, xs[-1], span, slope):
                leaking, trend = False, "the lows after each release hold"
            elif "cycle lows" not in trend and self.refilling(seg, releases, xs[-1], span):
                leaking, trend = False, "refilling what the last release gave back"
        if not leaking and seg and (self.noise or 0.0) >= p["noise_min"]:
            ok = self.noisy_verdict(seg[0][0])
            if ok is not None:
                leaking, (slope, z, span), trend = True, ok, "steady (noisy)"
        self.last["slope"] = slope
        self.last["trend"] = trend
        self.last["window_s"] = span * 3600.0 + p["bucket_s"]
        if leaking:
            self.last["since"] = (xs[-1] - span) * 3600.0
            self.last["z"] = z
        if self.firing:
            return self.maybe_resolve(leaking, seg) or (self.escalate("slow") if leaking else None)
        # the last four evaluations as bits: a verdict that flickers on a
        # healthy curve (a wander, a creep near the threshold) passes once
        # or twice; a leak passes most of the time, with a miss now and
        # then that must not start the count again
        self.streak = ((self.streak << 1) | int(leaking)) & ((1 << p["slow_look"]) - 1)
        if bin(self.streak).count("1") >= p["slow_passes"]:
            return self.fire("slow")
        return None

    def evaluate_fast(self):
        """The fast tier, once per fine floor, when the free memory is known."""
        p = self.p
        free = self.last.get("free")
        if free is None or (self.firing and self.last.get("paged") == "critical"):
            # (a firing alert is watched on: a leak that speeds up under a
            # warning escalates to a page)
            self.fstreak = 0
            return None
        tail = self.fines_tail(10)
        if len(tail) < 10:
            self.fstreak = 0
            return None
        fs = self.fine_s()
        cut_f = int((self.cut or 0) * p["bucket_s"] // fs)
        # cheap gate: the last few minutes' rate against the free memory
        a, b = tail[0:2], tail[-2:]
        if a[0] < cut_f:
            self.fstreak = 0
            return None
        rate = (b[1] - a[1]) / ((b[0] - a[0]) * fs / 3600.0)
        if rate < max(p["threshold"], 1.0) or free / rate > p["fast_oom_h"]:
            self.fstreak = 0
            return None
        ok = self.fast_verdict(free, cut_f)
        if ok is None:
            self.fstreak = 0
            return None
        self.fstreak += 1
        beta, since, z = ok
        # under an hour left there is no time for a second look
        if self.fstreak >= p["debounce"] or free / beta < 1.0:
            self.last.update(slope=beta, trend="steady", since=since, z=z,
                             window_s=self.last["ts"] - since)
            return self.escalate("fast") if self.firing else self.fire("fast")
        return None

    def fast_verdict(self, free, cut_f):
        """(slope, since_ts, z) when the fine floors show growth that will
        fill the GPU within fast_oom_h and has been seen for long enough:
        as long as the time it leaves (a third of it when the rise is
        smooth and linear). The evidence is the last stretch of that length:
        a warm-up, which decelerates, never passes (its time left is at
        least its time constant, over which its rate falls by half)."""
        p = self.p
        fs = self.fine_s()
        fl = self.fines
        pts = [(fl[i], fl[i + 1]) for i in range(0, len(fl), 2) if fl[i] >= cut_f]
        vals = drop_dips([v for _, v in pts])
        if len(vals) != len(pts):
            keep = set(vals)
            pts = [(f, v) for f, v in pts if v in keep]
        if len(pts) < p["fast_min_floors"]:
            return None
        end = pts[-1][0]
        xs = [(f - end) * fs / 3600.0 for f, _ in pts]
        ys = [float(v) for _, v in pts]
        span_h = -xs[0]
        beta = theil_sen(*reduce_points(xs, ys, 24))
        if beta <= 0 or free / beta > p["fast_oom_h"]:
            return None
        for share in (p["fast_linear_share"], 1.0):
            need = max(p["fast_min_s"] / 3600.0, share * free / beta)
            if span_h < need:
                continue
            i = 0
            while xs[i] < -need - 1e-9:
                i += 1
            wx, wy = xs[i:], ys[i:]
            if len(wx) < 5:
                wx, wy = xs[-5:], ys[-5:]
            rx, ry = reduce_points(wx, wy, 24)
            wbeta = theil_sen(rx, ry)
            if wbeta <= 0 or free / wbeta > p["fast_oom_h"] or need < 0.9 * share * free / wbeta:
                continue
            growth = wy[-1] - wy[0]
            d = [bb - aa for aa, bb in zip(wy, wy[1:])]
            if growth < p["min_growth"] or max(d) > p["max_jump_share"] * growth \
                    or not spread([x for x in d if x > 0], p["fast_rise_share"] * len(d)):
                # (a leak under a spread of batch sizes grows the pool only
                # when a large batch comes: in a third of the minutes, say)
                continue
            if share < 1.0:
                # smooth and linear: rising in most fine floors, no jump over
                # a quarter, the rate of each third within -15/+50 % of the first
                k = len(rx) // 3
                if len(wx) < 20 or k < 2 or sum(1 for x in d if x > 0) < 0.8 * len(d) or max(d) > 0.25 * growth:
                    continue
                r1, r2, r3 = theil_sen(rx[:k], ry[:k]), theil_sen(rx[k:-k], ry[k:-k]), theil_sen(rx[-k:], ry[-k:])
                if r1 <= 0 or min(r2, r3) < 0.85 * r1 or max(r2, r3) > 1.5 * r1:
                    continue
            else:
                # the halves' rates without the jumps that stand out: one
                # new record length (+2 GB in a minute, tidy records@full
                # 47) in the second half hid a warm-up's deceleration
                md = median(d)
                big = max(p["step_mib"], 4.0 * md)
                if any(x > big for x in d):
                    off, flat = 0.0, [wy[0]]
                    for x, y in zip(d, wy[1:]):
                        off += x - md if x > big else 0.0
                        flat.append(y - off)
                    rx, ry = reduce_points(wx, flat, 24)
                half = len(rx) // 2
                b1 = theil_sen(rx[:half + 1], ry[:half + 1])
                b2 = theil_sen(rx[half:], ry[half:])
                if b1 <= 0 or b2 < 0.8 * b1:
                    continue                # decelerating: a warm-up
            return wbeta, self.last["ts"] + wx[0] * 3600.0, mann_kendall_z(ry)
        return None

    def maybe_resolve(self, leaking, seg):
        p = self.p
        restarted = self.cut is not None and seg == [] and len(self.floors) > 1
        recent = self.floors[-min(len(self.floors), 12):]
        rx = [b * p["bucket_s"] / 3600.0 for b, _ in recent]
        ry, _ = self.level_shifts([float(v) for _, v in recent])
        # (a step up that sets a record is the leak going on, however
        # flat the de-shifted floors: a graph kept every evaluation raises
        # the pool by one alike step an hour)
        top = max((v for b, v in seg if b < recent[0][0]), default=None)
        record = top is not None and max(v for _, v in recent) >= top + p["min_growth"]
        stopped = not leaking and len(recent) >= 6 and theil_sen(rx, ry) < 0.25 * p["threshold"] and \
            median(ry[-3:]) - median(ry[:3]) < p["min_growth"] and not record
        self.calm = self.calm + 1 if (stopped or restarted) else 0
        if self.calm >= p["debounce"] or restarted:
            self.firing, self.streak, self.calm = False, 0, 0
            self.last["slope"] = theil_sen(rx, ry) if len(rx) > 1 else 0.0
            return self.event("resolved")
        return None

    def hour(self):
        """Six buckets in hours: an hour at the default ten-minute bucket
        (a watcher given shorter buckets, a test's, scales with them)."""
        return 6.0 * self.p["bucket_s"] / 3600.0

    def fire(self, tier):
        self.firing, self.calm, self.streak, self.fstreak = True, 0, 0, 0
        self.last["tier"] = tier
        ev = self.event("firing")
        self.last["paged"], self.last["paged_ts"] = ev["severity"], ev["ts"]
        return ev

    def escalate(self, tier):
        """A firing alert's event again when the evidence of this evaluation
        earns it a higher level than it was sent with (its OOM came near a
        warning, a trend note's pace became a warning's); the event says
        which level it was and since when. Once per level; a severity that
        falls back is not sent (the alert stands until resolved)."""
        was = self.last.get("paged")
        before = self.last.get("tier")
        self.last["tier"] = tier
        ev = self.event("firing")
        if was not in LEVELS:
            # a state written before levels were kept: what was sent is
            # unknown, so nothing is sent again
            self.last["paged"], self.last["tier"] = ev["severity"], before
            return None
        if LEVELS[ev["severity"]] <= LEVELS[was]:
            self.last["tier"] = before
            return None
        ev.update({"escalated_from": was, "first_alert_ts": self.last.get("paged_ts")})
        self.last["paged"] = ev["severity"]
        return ev

    def verdict(self):
        """(slope, firing, severity, oom_h) for status lines and metrics."""
        slope = self.last.get("slope", 0.0) or 0.0
        free = self.last.get("free")
        # unrounded: the status line carries it in seconds (a fast leak's
        # 96 s to OOM is not "0.0 h")
        oom = free / slope if free is not None and slope > 0 else None
        if not self.firing:
            return slope, False, "none", oom
        # the level the alert was sent with (or escalated to): the metrics
        # and status say what paged, not a projection the page rule refused
        return slope, True, self.last.get("paged") or severity_for(oom, self.p), oom

    def event(self, state):
        slope = round(self.last.get("slope", 0.0) or 0.0, 1)
        free = self.last.get("free")
        oom = round(free / slope, 3) if free is not None and slope > 0 else None
        ev = {"ts": int(self.last["ts"]), "event": "gpu_memory_leak", "state": state, "pid": self.pid,
              "slope_mib_per_hour": slope, "used_memory_mib": self.last["used"],
              "free_memory_mib": free, "projected_oom_hours": oom,
              "window_seconds": int(self.last.get("window_s", 0))}
        if state == "firing":
            z = self.last.get("z") or 0.0
            span_h = self.last.get("window_s", 0) / 3600.0
            conf = min(0.99, 0.5 + 0.1 * max(0.0, z - 2.0) + 0.05 * min(span_h, 6.0))
            if self.last.get("tier") == "fast" or self.last.get("trend") == "steps":
                conf = min(0.99, max(conf, 0.8))
            since = self.last.get("since")
            severity = severity_for(oom, self.p)
            if severity == "critical" and self.last.get("tier") != "fast" \
                    and span_h < 2.0 * max(self.hour(), self.last.get("cycle_h") or 0.0):
                # a page is earned: evidence over at least two of the job's
                # own cycles (the interval between its releases; two hours
                # for a training job's hourly checkpoints or evaluations);
                # the fast tier earns it by the minutes its rise kept its pace
                severity = "warning"
            if severity == "critical" and self.last.get("tier") != "fast" and not self.last.get("released"):
                # until the job has given memory back once, nvidia-smi shows
                # the reserved pool, not what is live; a pool that reaches
                # the GPU's capacity is flushed by the allocator when
                # cudaMalloc fails (a ZeRO-3 job climbing in gather-sized
                # steps for hours), not killed, so the slow tier's OOM is
                # only a projection; the fast tier pages a fill that kept
                # its pace
                severity = "warning"
            if severity == "critical":
                seg = self.segment()
                if self.flushed_at_capacity(seg, self.releases(seg)):
                    # the allocator has flushed this pool from where its
                    # floor is today, near the capacity: the climb to the
                    # capacity is where the job is flushed again, a fill of
                    # either tier included
                    severity = "warning"
            ev.update({"severity": severity, "trend": self.last.get("trend", "steady"),
                       "since_ts": int(since) if since is not None else None,
                       "confidence": round(conf, 2), "tier": self.last.get("tier", "slow")})
        return ev
