"""Ascend NPUs (lib/npu.sh): the npu-smi double answers as the recordings in
tests/fixtures/npu do, the parser reads each recording, and the watchdog,
status and metrics work on NPUs as on NVIDIA GPUs: the main idle scenarios
run against both doubles (device_kind), and a mixed box (one GPU, one NPU)
is watched in one cycle."""
import json
import subprocess

import pytest
from conftest import FAKEBIN, ROOT, app, busy_gpu, idle_gpu

NPU_SMI = FAKEBIN / "npu" / "npu-smi"
FIXTURES = ROOT / "tests" / "fixtures" / "npu"

# The recordings as scenarios of the double (values copied from the files).
B3_BUS = ["0000:C1:00.0", "0000:C2:00.0", "0000:81:00.0", "0000:82:00.0",
          "0000:01:00.0", "0000:02:00.0", "0000:41:00.0", "0000:42:00.0"]
SCENARIO_910B3 = {
    "layout": "910b", "version": "25.2.0",
    "chips": [{"card": i, "chip": 0, "name": "910B3", "bus": b, "total": 65536} for i, b in enumerate(B3_BUS)],
    "steps": [{"chips": [{"power": p, "temp": t, "used": u} for p, t, u in
                         [(97.9, 34, 3408), (89.5, 32, 3408), (92.3, 32, 41052), (92.4, 32, 3390),
                          (95.6, 37, 3403), (97.2, 38, 3400), (91.0, 36, 3401), (95.4, 37, 3400)]],
               "procs": [{"card": 2, "chip": 0, "pid": 1333928, "name": "", "mem": 37709}]}],
}
SCENARIO_310P3 = {
    "layout": "310p", "version": "25.2.0",
    "chips": [{"card": 2, "chip": 0, "device": 0, "name": "310P3", "bus": "0000:01:00.0", "total": 44280},
              {"card": 2, "chip": 1, "device": 1, "name": "310P3", "bus": "0000:01:00.0", "total": 43693}],
    "steps": [{"chips": [{"power": "NA", "temp": 51, "used": 1529}, {"power": "NA", "temp": 49, "used": 1411}],
               "procs": []}],
}
# Huawei's reference for the Atlas 200I A2 (310B; its name printed "xxx")
SCENARIO_310B = {
    "layout": "310b", "version": "25.2.0",
    "chips": [{"card": 0, "chip": 0, "device": 0, "name": "xxx", "bus": "NA", "total": 10810, "hugepages_pages": 15}],
    "steps": [{"chips": [{"power": 10.4, "temp": 66, "used": 957, "aicore": 0, "hugepages_used": 15}]}],
}
A3_BUS = ["9D", "9F", "99", "9B", "95", "97", "91", "93", "8D", "8F", "89", "8B", "85", "87", "81", "83"]
A3_VALUES = [(232.5, 52, 17, 53444), ("-", 51, 17, 52948), (226.9, 51, 17, 53200), ("-", 52, 17, 52940),
             (175.3, 52, 0, 3128), ("-", 52, 0, 2888), (170.6, 51, 0, 3122), ("-", 51, 0, 2888),
             (167.2, 51, 0, 3136), ("-", 49, 0, 2895), (174.5, 51, 0, 3130), ("-", 50, 0, 2895),
             (243.3, 53, 17, 50719), ("-", 50, 17, 50242), (248.0, 52, 17, 50494), ("-", 52, 17, 50242)]
A3_PROCS = [(0, 0, 3325989, 50128), (0, 0, 3330598, 132), (0, 0, 3328327, 133), (0, 0, 3333165, 132),
            (0, 1, 3328327, 50119), (1, 0, 3330598, 50117), (1, 1, 3333165, 50119),
            (6, 0, 3085960, 47426), (6, 0, 3085961, 122), (6, 0, 3085962, 122), (6, 0, 3085964, 122),
            (6, 1, 3085961, 47416), (7, 0, 3085962, 47416), (7, 1, 3085964, 47416)]
SCENARIO_A3 = {
    "layout": "a3", "version": "25.2.3",
    "chips": [{"card": i // 2, "chip": i % 2, "device": i, "name": "Ascend910", "bus": "0000:%s:00.0" % b,
               "total": 65536} for i, b in enumerate(A3_BUS)],
    "steps": [{"chips": [{"power": p, "temp": t, "aicore": a, "used": u} for p, t, a, u in A3_VALUES],
               "procs": [{"card": c, "chip": ch, "pid": pid, "name": "", "mem": m} for c, ch, pid, m in A3_PROCS]}],
}


def double(scenario, tmp_path, *args):
    path = tmp_path / "npu.json"
    path.write_text(json.dumps(scenario))
    return subprocess.run([str(NPU_SMI)] + list(args or ["info"]), env={"FAKE_NPU_SCENARIO": str(path)},
                          capture_output=True, text=True, check=False)


@pytest.mark.parametrize("scenario, recording", [
    (SCENARIO_910B3, "info-910b3-25.2.0-one-process.txt"),
    (SCENARIO_310P3, "info-310p3-25.2.0-two-chips.txt"),
    (SCENARIO_A3, "info-ascend910-a3-25.2.3-busy.txt"),
    (SCENARIO_310B, "info-310b-25.2.0-docs.txt"),
])
def test_double_answers_byte_for_byte_like_the_recordings(tmp_path, scenario, recording):
    r = double(scenario, tmp_path)
    assert r.returncode == 0
    assert r.stdout == (FIXTURES / recording).read_text()


def test_double_answers_usages_and_version_like_the_reference(tmp_path):
    """`npu-smi info -t usages -i 0` and `npu-smi -v` as Huawei's reference
    prints them (the 310B's usage figures of another moment than its table)."""
    usages = dict(SCENARIO_310B, steps=[{"chips": [{"used": 3783, "mem_rate": 35, "aicore": 0, "ctrlcpu": 1}]}])
    r = double(usages, tmp_path, "info", "-t", "usages", "-i", "0")
    assert r.returncode == 0 and r.stdout == (FIXTURES / "usages-310b-25.2.0-one-chip.txt").read_text()
    for version in ("25.2.0", "23.0.rc3"):
        r = double(dict(SCENARIO_310B, version=version), tmp_path, "-v")
        assert r.stdout == (FIXTURES / ("version-%s.txt" % version)).read_text()
    # a card that is not there fails, as a busy driver does
    r = double(usages, tmp_path, "info", "-t", "usages", "-i", "3")
    assert r.returncode != 0 and r.stdout.strip()


def parse(text, locale="C.UTF-8"):
    """The SMI_* arrays lib/npu.sh fills from a text of `npu-smi info`."""
    script = r'''
set -uo pipefail
shopt -s extglob
source lib/common.sh; source lib/smi.sh; source lib/npu.sh
smi_reset; declare -gA SMI_VENDOR=() SMI_MEM_BASE=()
npu_parse_info "$(cat)"; echo "rc=$? apps=$NPU_APPS_OK"
for id in "${SMI_UUIDS[@]}"; do
  printf '%s|%s|%s|%s|%s|%s|%s|%s|%s\n' "$id" "${SMI_INDEX[$id]}" "${SMI_UTIL[$id]}" "${SMI_MEM_USED[$id]}" \
    "${SMI_MEM_TOTAL[$id]}" "${SMI_POWER[$id]}" "${SMI_NAME[$id]}" "${SMI_GPU_FAULT[$id]}" "${SMI_NPROCS[$id]}"
done
for pid in "${!SMI_PIDS_MEM[@]}"; do echo "pid $pid ${SMI_PIDS_MEM[$pid]} ${SMI_PID_UUIDS[$pid]}"; done
'''
    r = subprocess.run(["bash", "-c", script], cwd=ROOT, input=text, capture_output=True, text=True, check=False,
                       env={"PATH": "/usr/bin:/bin", "LC_ALL": locale})
    lines = r.stdout.splitlines()
    head = dict(kv.split("=") for kv in lines[0].split())
    chips = {f[0]: f[1:] for f in (line.split("|") for line in lines[1:] if "|" in line)}
    pids = {int(w[1]): (int(w[2]), w[3:]) for w in (line.split() for line in lines if line.startswith("pid "))}
    return int(head["rc"]), int(head["apps"]), chips, pids


def test_910b_recording_reads_hbm_aicore_power_and_the_nameless_process():
    rc, apps, chips, pids = parse((FIXTURES / "info-910b3-25.2.0-one-process.txt").read_text())
    assert rc == 0 and apps == 1 and len(chips) == 8
    assert chips["NPU-2-0"] == ["2", "0", "41052", "65536", "92.3", "Ascend 910B3", "", "1"]
    assert pids == {1333928: (37709, ["NPU-2-0"])}


def test_310p_recording_reads_each_chip_of_the_card_with_unknown_power():
    rc, apps, chips, pids = parse((FIXTURES / "info-310p3-25.2.0-two-chips.txt").read_text())
    assert rc == 0 and apps == 1 and pids == {}
    # DDR memory (no HBM on a 310P), "NA" power read as unknown, never 0
    assert chips["NPU-2-0"] == ["0", "0", "1529", "44280", "", "Ascend 310P3", "", "0"]
    assert chips["NPU-2-1"] == ["1", "0", "1411", "43693", "", "Ascend 310P3", "", "0"]


def test_310b_reference_reads_its_chip_without_a_process_table():
    rc, apps, chips, pids = parse((FIXTURES / "info-310b-25.2.0-docs.txt").read_text())
    # the chip is read; no process table, so idle alerts wait (apps=0)
    assert rc == 0 and apps == 0 and pids == {}
    assert chips["NPU-0-0"] == ["0", "0", "957", "10810", "10.4", "Ascend xxx", "", "0"]


def test_older_npu_smi_23_and_a3_dash_power_and_a_process_on_two_chips():
    rc, apps, chips, _ = parse((FIXTURES / "info-910b2-23.0.7-no-processes.txt").read_text())
    assert rc == 0 and apps == 1 and chips["NPU-7-0"][2:5] == ["3347", "65536", "93.8"]
    rc, apps, chips, pids = parse((FIXTURES / "info-ascend910-a3-25.2.3-busy.txt").read_text())
    assert rc == 0 and len(chips) == 16
    assert chips["NPU-0-1"][:5] == ["1", "17", "52948", "65536", ""]
    assert pids[3328327] == (133 + 50119, ["NPU-0-0", "NPU-0-1"])


def test_a_process_name_with_blanks_or_a_bar_is_read_whole():
    text = (FIXTURES / "info-910b3-25.2.0-one-process.txt").read_text().replace(
        "| 1333928       |                          |", "| 1333928       | vllm | worker 0         |")
    rc, _, chips, pids = parse(text)
    assert rc == 0 and pids == {1333928: (37709, ["NPU-2-0"])} and chips["NPU-2-0"][-1] == "1"


def test_a_byte_order_mark_and_crlf_are_a_good_reading():
    """An answer that went through a Windows-side tool (a BOM, CRLF line
    ends) reads the same chips: the mark is one character in a UTF-8
    locale, three bytes in C."""
    text = "\ufeff" + (FIXTURES / "info-910b3-25.2.0-one-process.txt").read_text().replace("\n", "\r\n")
    for locale in ("C.UTF-8", "C"):
        rc, apps, chips, pids = parse(text, locale)
        assert rc == 0 and apps == 1 and len(chips) == 8, locale
        assert chips["NPU-2-0"][2:4] == ["41052", "65536"] and pids == {1333928: (37709, ["NPU-2-0"])}


@pytest.mark.parametrize("text, why", [
    ("NPU 0: AICore 0% HBM 3408/65536\n", "a line outside the table"),
    ("\n".join((FIXTURES / "info-910b3-25.2.0-one-process.txt").read_text().splitlines()[:7]) + "\n", "cut"),
    ((FIXTURES / "info-310p3-25.2.0-two-chips.txt").read_text().replace("| 0            1529 / 44280", "| 0            1529"),
     "usage cell"),
    ("", "no NPU chip rows"),
])
def test_unknown_or_cut_layouts_fail_the_parse(text, why):
    rc, _, _, _ = parse(text)
    assert rc == 1, why


def rendered(events, lang):
    """The text of the digest the alert helper sends for these events."""
    import sys
    sys.path.insert(0, str(ROOT / "python"))
    import gpuguard_render
    title, sections = gpuguard_render.render_digest(events, lang, env={})
    return " ".join([title] + [head + " " + " ".join(lines) for head, lines in sections])


# ------------------------------------------------ watchdog, by device kind --

class Devices:
    """Writes one scenario for the double of the device kind under test:
    the same idle/busy/gone steps as NVIDIA GPUs or as 910B NPUs."""

    def __init__(self, box, kind):
        self.box, self.kind = box, kind
        self.npu_scenario = box.tmp / "npu.json"
        if kind == "ascend":
            box.env.update({"GPUGUARD_DEVICE": "ascend", "NPU_SMI": str(NPU_SMI),
                            "FAKE_NPU_SCENARIO": str(self.npu_scenario),
                            "FAKE_NPU_STATE": str(box.tmp / "npu-step"),
                            "FAKE_NPU_LOG": str(box.tmp / "npu.log")})

    # a held idle device, a busy one, a released one (910B figures from the
    # recordings: ~95 W and 3.4 GB with nothing on it, ~230 W at work)
    def step(self, state):
        if isinstance(state, dict):
            return state
        if self.kind == "nvidia":
            return {"idle": {"gpus": [idle_gpu()], "apps": [app(1410)]},
                    "busy": {"gpus": [busy_gpu()], "apps": [app(1410)]},
                    "gone": {"gpus": [idle_gpu(mem=0)], "apps": []},
                    "hidden": {"gpus": [idle_gpu(mem=30000)], "apps": []},
                    "empty": {"gpus": [idle_gpu(mem=0)], "apps": []}}[state]
        if isinstance(state, dict):
            return state
        chip = {"idle": {"aicore": 0, "used": 41052, "power": 92.3, "temp": 32, "health": "OK"},
                "busy": {"aicore": 98, "used": 53444, "power": 232.5, "temp": 52, "health": "OK"},
                "gone": {"aicore": 0, "used": 3408, "power": 97.9, "temp": 34, "health": "OK"},
                "hidden": {"aicore": 0, "used": 29954, "power": 96.5, "temp": 36, "health": "OK"},
                "empty": {"aicore": 0, "used": 3408, "power": 97.9, "temp": 34, "health": "OK"}}[state]
        procs = [{"card": 0, "chip": 0, "pid": 1410, "name": "python3", "mem": 37709}] \
            if state in ("idle", "busy") else []
        return {"chips": [chip], "procs": procs}

    def holding(self, pid, mem, util=90):
        """A step where PID holds MEM MiB on the device, at UTIL %: an H200
        at work (~400 W) or a 910B at work (~230 W, its 3.4 GB reserve)."""
        if self.kind == "nvidia":
            return {"gpus": [{"utilization.gpu": util, "memory.used": 500 + mem, "power.draw": 400.0}],
                    "apps": [app(pid, mem=mem)]}
        return {"chips": [{"aicore": util, "used": 3400 + mem, "power": 230.0, "temp": 50}],
                "procs": [{"card": 0, "chip": 0, "pid": pid, "name": "python3", "mem": mem}]}

    @property
    def word(self):
        return "NPU" if self.kind == "ascend" else "GPU"

    def write(self, states):
        steps = [self.step(s) for s in states]
        if self.kind == "nvidia":
            self.box.write_scenario(steps)
        else:
            self.npu_scenario.write_text(json.dumps({
                "layout": "910b", "version": "25.2.0",
                "chips": [{"card": 0, "chip": 0, "name": "910B3", "bus": "0000:C1:00.0", "total": 65536}],
                "steps": steps}))


@pytest.fixture(params=["nvidia", "ascend"])
def devices(request, box):
    return Devices(box, request.param)


def idle_states(box):
    return [(e["gpu"], e["state"]) for e in box.events() if e["event"] == "gpu_idle"]


def test_idle_but_held_fires_once_then_resolves_when_busy(box, devices):
    devices.write(["idle"] * 4 + ["busy"])
    for cycle in range(5):
        box.once(now=1000 + 60 * cycle)
    assert idle_states(box) == [(0, "firing"), (0, "resolved")]
    firing = box.events()[0]
    assert firing["utilization"] == 0 and firing["processes"][0]["pid"] == 1410
    assert firing["vendor"] == devices.kind
    if devices.kind == "ascend":
        assert firing["uuid"] == "NPU-0-0" and firing["gpu_name"] == "Ascend 910B3"
        assert firing["power_limit_w"] is None


def test_released_device_resolves(box, devices):
    devices.write(["idle"] * 3 + ["gone"])
    for t in range(4):
        box.once(now=100 + t)
    assert idle_states(box) == [(0, "firing"), (0, "resolved")]
    assert box.events()[-1]["reason"] == "released"


def test_hidden_processes_holding_memory_count_and_the_firmware_reserve_does_not(box, devices):
    """A container hides the processes; an idle NPU with nothing on it still
    shows its firmware's 3.4 GB (the recordings), which is no job."""
    devices.write(["empty"] * 4 + ["hidden"] * 3)
    for t in range(4):
        box.once(now=t)
    assert box.events() == []
    for t in range(4, 7):
        box.once(now=t)
    assert idle_states(box) == [(0, "firing")]


@pytest.mark.parametrize("fault", ["error", "garbage", "no_proc_table", "cut"])
def test_a_failing_or_unknown_npu_smi_never_alerts_idle(box, fault):
    devices = Devices(box, "ascend")
    devices.write(["idle", "idle"] + [{"fault": fault}] * 6)
    for t in range(8):
        box.once(now=t, env={"SMI_FAIL_ALERT_CYCLES": "3"})
    events = box.events()
    assert [e for e in events if e["event"] == "gpu_idle"] == []
    (degraded,) = [e for e in events if e["event"] == "monitor_degraded"]
    assert "npu-smi" in degraded["error"] and degraded["vendor"] == "ascend"
    # the alert names the NPU's tool and hints, never nvidia-smi, Xid or GPU
    for lang in ("en", "zh"):
        text = rendered([degraded], lang)
        assert "npu-smi" in text and "NPU" in text, text
        assert "nvidia-smi" not in text and "Xid" not in text and "GPU" not in text, text
    if fault in ("garbage", "cut"):
        # the unknown layout is named with the version npu-smi reports
        assert "npu-smi version: 25.2.0" in degraded["error"]
    if fault == "error":
        assert "exited 255" in degraded["error"]


def test_npu_smis_text_in_an_error_is_printable(box, tmp_path):
    """npu-smi printing an escape sequence and a byte that is not UTF-8,
    in a row it does not know or as the reason it failed: status quoted
    it raw (the screen cleared) and status --json was not valid UTF-8."""
    tool = tmp_path / "npu-smi"
    box.env.update({"GPUGUARD_DEVICE": "ascend", "NPU_SMI": str(tool)})
    for rc, said in ((0, "printed a layout of 'npu-smi info' gpuguard does not know: a line read as no known row: "
                          "\\e[2J\\e[31mEVIL \ufffd"),
                     (3, "npu-smi exited 3: \\e[2J\\e[31mEVIL \ufffd")):
        tool.write_text('#!/bin/sh\n[ "$1" = -v ] && { echo "npu-smi version: 25.2.0"; exit 0; }\n'
                        'printf "\\033[2J\\033[31mEVIL \\377\\n"\nexit %d\n' % rc)
        tool.chmod(0o755)
        for args in (["status"], ["status", "--json"]):
            r = subprocess.run([str(ROOT / "bin/gpuguard")] + args, env=box.env, capture_output=True, timeout=60,
                               check=False)
            # strict: a byte that is not UTF-8 fails here
            out = r.stdout.decode("utf-8") + r.stderr.decode("utf-8")
            if "--json" in args:
                out = json.loads(out)["error"]
            assert r.returncode == 1 and said in out and "\x1b" not in out, (args, out)


def test_health_other_than_ok_is_a_device_fault(box):
    devices = Devices(box, "ascend")
    alarm = {"chips": [{"aicore": 0, "used": 41052, "power": 92.3, "temp": 32, "health": "Alarm"}], "procs": []}
    devices.write([alarm] * 6)
    for t in range(6):
        box.once(now=t)
    degraded = [e for e in box.events() if e["event"] == "gpu_degraded"]
    assert degraded and degraded[0]["fault"] == "Health Alarm" and degraded[0]["vendor"] == "ascend"
    assert [e for e in box.events() if e["event"] == "gpu_idle"] == []


def test_status_says_fault_for_a_chip_whose_health_is_critical(box):
    """Health Critical pages gpu_degraded; status says FAULT and the
    health, in the table and in --json (before: "ok", no fault key)."""
    devices = Devices(box, "ascend")
    critical = {"chips": [{"aicore": 0, "used": 41052, "power": 92.3, "temp": 32, "health": "Critical"}],
                "procs": []}
    devices.write([critical] * 6)
    for t in range(4):
        box.once(now=t, env={"SMI_FAIL_ALERT_CYCLES": "3"})
    assert [e["state"] for e in box.events() if e["event"] == "gpu_degraded"] == ["firing"]
    status = box.run("status", cmd="bin/gpuguard")
    (row,) = [ln for ln in status.stdout.splitlines() if ln.split()[:1] == ["npu0"]]
    assert "FAULT" in row.split() and "fault: Health Critical" in status.stdout, status.stdout
    (chip,) = json.loads(box.run("status", "--json", cmd="bin/gpuguard").stdout)["gpus"]
    assert (chip["state"], chip["fault"], chip["degraded_firing"]) == ("FAULT", "Health Critical", True)


@pytest.mark.parametrize("recording,uuid,pid,mem", [
    ("info-910b3-25.2.0-one-process.txt", "NPU-2-0", 1333928, 37709),
    ("info-ascend910-a3-25.2.3-busy.txt", "NPU-0-0", 3325989, 50128)])
def test_a_recorded_process_without_a_name_keeps_its_memory(box, tmp_path, recording, uuid, pid, mem):
    """The recordings leave "Process name" blank: status, events and metrics
    still read the memory as memory (before: "? MiB", the name "37709",
    used_memory_mib null, no process series)."""
    textdir = tmp_path / "textfile"
    box.env.update({"GPUGUARD_DEVICE": "ascend", "NPU_SMI": str(NPU_SMI),
                    "FAKE_NPU_FIXTURE": str(FIXTURES / recording), "GPUGUARD_TEXTFILE_DIR": str(textdir)})
    for t in range(4):
        box.once(now=60 * t)
    status = box.run("status", cmd="bin/gpuguard").stdout
    (row,) = [ln for ln in status.splitlines() if ln.split()[:2] == ["pid", str(pid)]]
    assert row.split()[2:4] == [str(mem), "MiB"] and "(not visible here)" in row, status
    doc = json.loads(box.run("status", "--json", cmd="bin/gpuguard").stdout)
    (chip,) = [g for g in doc["gpus"] if g["uuid"] == uuid]
    (proc,) = [p for p in chip["processes"] if p["pid"] == pid]
    assert (proc["name"], proc["used_memory_mib"]) == ("", mem)
    prom = (textdir / "gpuguard_idle.prom").read_text()
    assert 'uuid="%s",vendor="ascend",pid="%d",name=""} %d' % (uuid, pid, mem * 1048576) in prom, prom
    for event in box.events():
        for p in event.get("processes") or []:
            assert p["name"] == "" and isinstance(p["used_memory_mib"], int), event
    if uuid == "NPU-2-0":
        # its chip idles at 0 %: the alert lists the process with its memory
        (fired,) = [e for e in box.events() if e["event"] == "gpu_idle"]
        assert fired["processes"] == [{"pid": pid, "name": "", "used_memory_mib": mem}]


def test_dash_and_na_fields_are_unknown_never_idle(box):
    devices = Devices(box, "ascend")
    unknown = {"chips": [{"aicore": "NA", "used": 41052, "power": "-", "temp": 32}],
               "procs": [{"card": 0, "chip": 0, "pid": 1410, "name": "python3", "mem": "NA"}]}
    devices.write([unknown] * 6)
    for t in range(6):
        box.once(now=t)
    assert [e for e in box.events() if e["event"] == "gpu_idle"] == []


def test_aicore_missing_from_the_table_is_asked_of_npu_smi_usages(box):
    """A chip whose row shows AICore "-" is judged by `npu-smi info -t
    usages -i CARD`'s Aicore Usage Rate, asked only for its card and only
    then; a usages call that fails leaves it unknown, never idle."""
    devices = Devices(box, "ascend")
    dash = {"chips": [{"aicore": "-", "usage_aicore": 0, "used": 41052, "power": 92.3, "temp": 32}],
            "procs": [{"card": 0, "chip": 0, "pid": 1410, "name": "python3", "mem": 37709}]}
    devices.write(["idle"] + [dash] * 3 + [dict(dash, usages_fault="error")] * 4)
    for t in range(4):
        box.once(now=t)
    assert idle_states(box) == [(0, "firing")]
    calls = (box.tmp / "npu.log").read_text().splitlines()
    assert calls == ["info"] + ["info", "info -t usages -i 0"] * 3
    # usages fails: the chip's utilization is unknown, so the streak stops
    # growing and nothing resolves or fires again
    for t in range(4, 8):
        box.once(now=t)
    assert idle_states(box) == [(0, "firing")]


def test_mixed_box_one_gpu_one_npu_watched_in_one_cycle(box):
    """auto: both tools answer; one cycle samples both, each idle device
    fires once and says what it is."""
    npu = Devices(box, "ascend")
    box.env["GPUGUARD_DEVICE"] = "auto"
    box.env["PATH"] = "%s:%s" % (NPU_SMI.parent, box.env["PATH"])
    del box.env["NPU_SMI"]
    npu.write(["idle"] * 3)
    box.write_scenario([{"gpus": [idle_gpu()], "apps": [app(2410)]}] * 3)
    for t in range(3):
        box.once(now=t, env={"GPUGUARD_TEXTFILE_DIR": str(box.tmp)})
    firing = {e["vendor"]: e for e in box.events() if e["event"] == "gpu_idle"}
    assert set(firing) == {"nvidia", "ascend"}
    assert firing["ascend"]["processes"][0]["pid"] == 1410
    assert firing["nvidia"]["processes"][0]["pid"] == 2410
    # one npu-smi info call per cycle, serial with nvidia-smi's
    assert (box.tmp / "npu.log").read_text().splitlines() == ["info"] * 3
    prom = (box.tmp / "gpuguard_idle.prom").read_text()
    assert 'uuid="NPU-0-0",vendor="ascend"' in prom and 'vendor="nvidia"' in prom
    # status lists both (GPU 0 and NPU 0 apart), under a neutral heading
    r = box.run("status", cmd="bin/gpuguard")
    lines = r.stdout.splitlines()
    assert lines[0].split()[0] == "DEV"
    assert [line.split()[0] for line in lines if line.split()[0] in ("0", "npu0")] == ["0", "npu0"]
    # the report keeps a section each: index 0 names two devices here
    out = box.tmp / "r.html"
    r = box.run("report", "--out", str(out), cmd="bin/gpuguard", env={"GPUGUARD_NOW": "600"})
    assert r.returncode == 0, r.stderr
    html = out.read_text()
    assert "<h2>GPUs and NPUs</h2>" in html and "<h2>NPU 0 <small>NPU-0-0" in html
    assert "<h2>GPU 0 <small>GPU-" in html
    assert "idle firing: NPU 0" in html and "idle firing: GPU 0" in html


def auto_box(box):
    """A box in auto mode with both doubles installed (one GPU, one NPU)."""
    npu = Devices(box, "ascend")
    box.env["GPUGUARD_DEVICE"] = "auto"
    box.env["PATH"] = "%s:%s" % (NPU_SMI.parent, box.env["PATH"])
    del box.env["NPU_SMI"]
    return npu


def test_auto_npu_smi_without_a_driver_on_an_nvidia_box_leaves_the_gpu_watched(box):
    """npu-smi installed (a CANN image) but failing, on a box whose NPUs were
    never seen: the H200 held idle still fires; npu-smi is left out in one
    log line, with no alert; status lists the GPU and names npu-smi."""
    npu = auto_box(box)
    npu.write([{"fault": "no_driver"}] * 8)
    box.write_scenario([{"gpus": [idle_gpu(mem=20000)], "apps": [app(2410, mem=20000)]}] * 8)
    logs = ""
    for t in range(6):
        logs += box.once(now=60 * t).stderr
    events = box.events()
    assert [(e["event"], e["state"], e["vendor"]) for e in events] == [("gpu_idle", "firing", "nvidia")]
    said = [line for line in logs.splitlines() if "npu-smi" in line]
    assert len(said) == 1 and "ret is -8005" in said[0] and "left out" in said[0], logs
    r = box.run("status", cmd="bin/gpuguard")
    assert r.returncode == 0, r.stderr
    assert [line.split()[0] for line in r.stdout.splitlines()][:2] == ["GPU", "0"]
    assert "npu-smi exited 1: dcmi module initialize failed. ret is -8005" in r.stderr
    assert "left out" in r.stderr
    r = box.run("status", "--json", cmd="bin/gpuguard")
    doc = json.loads(r.stdout)
    assert r.returncode == 0 and doc["error"] is None and [g["vendor"] for g in doc["gpus"]] == ["nvidia"]
    assert doc["tool_error"]["tool"] == "npu-smi" and doc["tool_error"]["left_out"] is True


def test_auto_npu_smi_failing_on_a_mixed_box_alerts_on_its_own_and_keeps_the_gpu_judged(box):
    """A mixed box whose npu-smi fails after it found the NPU: the GPU is
    judged as usual, the NPU is not judged (its idle alert neither resolves
    nor fires again), npu-smi gets its own monitor_degraded quoting the line
    that says why, resolved when it answers; status shows the GPU, exit 1."""
    npu = auto_box(box)
    # (each status call asks npu-smi too: a step each)
    npu.write(["idle"] * 3 + [{"fault": "error"}] * 7 + ["idle"])
    box.write_scenario([{"gpus": [idle_gpu()], "apps": [app(2410)]}] * 10)
    for t in range(3):
        box.once(now=60 * t)
    assert sorted(e["vendor"] for e in box.events() if e["event"] == "gpu_idle") == ["ascend", "nvidia"]
    for t in range(3, 8):
        box.once(now=60 * t)
    r = box.run("status", cmd="bin/gpuguard", env={"GPUGUARD_NOW": "480"})
    assert r.returncode == 1
    assert [line.split()[0] for line in r.stdout.splitlines()][:2] == ["GPU", "0"], r.stdout
    assert "npu-smi exited 255: dcmi model initialized failed, because the device is used. ret is -8020" in r.stderr
    doc = json.loads(box.run("status", "--json", cmd="bin/gpuguard").stdout)
    assert doc["tool_error"]["tool"] == "npu-smi" and doc["tool_error"]["left_out"] is False
    assert [g["vendor"] for g in doc["gpus"]] == ["nvidia"]
    box.once(now=600)
    monitor = [e for e in box.events() if e["event"] == "monitor_degraded"]
    assert [(e["state"], e["vendor"], e.get("tool")) for e in monitor] == \
        [("firing", "ascend", "npu-smi"), ("resolved", "ascend", "npu-smi")]
    assert "because the device is used" in monitor[0]["error"]
    assert "DrvMngGetConsoleLogLevel" not in monitor[0]["error"]
    # the NPU's open idle alert was never read as released while npu-smi failed
    assert sorted((e["vendor"], e["state"]) for e in box.events() if e["event"] == "gpu_idle") == \
        [("ascend", "firing"), ("nvidia", "firing")]


def test_auto_nvidia_smi_without_a_driver_on_an_ascend_box_leaves_the_npu_watched(box):
    npu = auto_box(box)
    npu.write(["idle"] * 4)
    box.write_scenario([{"fault": "driver"}] * 4)
    for t in range(4):
        box.once(now=60 * t)
    assert [(e["event"], e["vendor"]) for e in box.events()] == [("gpu_idle", "ascend")]
    r = box.run("status", cmd="bin/gpuguard")
    assert r.returncode == 0 and r.stdout.splitlines()[1].split()[0] == "npu0", r.stdout
    assert "nvidia-smi exited 9" in r.stderr


def test_status_lists_each_device_and_its_holder(box, devices):
    devices.write([devices.holding(1410, 37709, util=0)] * 3)
    r = box.run("status", cmd="bin/gpuguard")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    # the table's first column says what the box has; an NPU's row reads npu0
    assert lines[0].split()[0] == devices.word
    label, used, total = ("npu0", 3400 + 37709, 65536) if devices.kind == "ascend" else ("0", 500 + 37709, 143771)
    row = [line for line in lines if line.split()[0] == label]
    assert row and "%d/%d" % (used, total) in row[0].replace(" ", "")
    assert any(line.split()[:2] == ["pid", "1410"] for line in lines)
    if devices.kind == "ascend":
        assert "GPU" not in r.stdout
    r = box.run("status", "--json", cmd="bin/gpuguard")
    (dev,) = json.loads(r.stdout)["gpus"]
    assert dev["vendor"] == devices.kind and dev["memory_used_mib"] == used
    assert dev["processes"][0]["pid"] == 1410


def test_alert_text_says_npu_for_an_npu(box):
    devices = Devices(box, "ascend")
    devices.write(["idle"] * 3)
    for t in range(3):
        box.once(now=t)
    events = [e for e in box.events() if e["event"] == "gpu_idle"]
    for lang in ("en", "zh"):
        text = rendered(events, lang)
        assert "NPU 0" in text and "GPU" not in text and "NCCL" not in text, text


def test_every_npu_message_says_npu_and_npu_smi():
    """The NPU wording of both languages: no GPU, nvidia-smi, NCCL or Xid
    left in a line an NPU alert may carry; the same keys and placeholders
    as the GPU wording."""
    import re
    import sys
    sys.path.insert(0, str(ROOT / "python"))
    import gpuguard_messages_en
    import gpuguard_messages_zh
    for mod in (gpuguard_messages_en, gpuguard_messages_zh):
        assert set(mod.NPU_MESSAGES) == set(mod.MESSAGES)
        for key, text in mod.NPU_MESSAGES.items():
            assert not re.search(r"GPU|nvidia-smi|NCCL|Xid", text), (key, text)
            assert set(re.findall(r"{\w+", text)) == set(re.findall(r"{\w+", mod.MESSAGES[key])), key


def test_an_npu_box_daily_digest_counts_npu_hours(box):
    """The ledger's daily digest of an Ascend box says NPU-hours (its event
    carries the vendor); the held idle chip is its worst incident."""
    devices = Devices(box, "ascend")
    devices.write(["idle"] * 12)
    day0 = 1796169600                     # 2026-12-02 00:00 UTC
    env = {"TZ": "UTC", "CHECK_INTERVAL": "600", "LEDGER_DIGEST_AT": "09:00"}
    for n in range(11):                   # 08:00-09:40, idle and held
        box.once(now=day0 + 8 * 3600 + 600 * n, env=env)
    box.once(now=day0 + 86400 + 9 * 3600, env=env)
    (digest,) = [e for e in box.events() if e["event"] == "ledger_digest"]
    assert digest["vendor"] == "ascend"
    en, zh = rendered([digest], "en"), rendered([digest], "zh")
    assert "NPU ledger 2026-12-02" in en and "NPU-hours" in en and "GPU" not in en
    assert "NPU 占用日报 2026-12-02" in zh and "NPU 时" in zh and "GPU" not in zh


# ------------------------------------------------------------ leak watcher --

@pytest.mark.slow
@pytest.mark.parametrize("per_step", [64, 0])
def test_leak_watcher_catches_a_leak_and_not_steady_memory(box, tmp_path, devices, per_step):
    """gpu-leak-watch samples through the same layer: a process whose memory
    grows 64 MB a minute on an H200 or a 910B is a leak; a steady one is
    not; the alert names the kind of device."""
    import test_leak
    job = test_leak.Job(tmp_path)
    try:
        pid = job.child()
        devices.write([devices.holding(pid, 3000 + per_step * i) for i in range(40)])
        test_leak.watch_cycles(box, ["--pid", str(job.proc.pid)], 30)
    finally:
        job.stop()
    leaks = [e for e in box.events() if e["event"] == "gpu_memory_leak"]
    if per_step == 0:
        assert leaks == []
        return
    (event,) = leaks
    assert event["state"] == "firing" and event["pid"] == job.proc.pid
    assert 0 < event["free_memory_mib"] < (65536 if devices.kind == "ascend" else 143771)
    assert event.get("vendor", "nvidia") == devices.kind
    # the leak alert says which memory, in both languages
    other = {"GPU": "NPU", "NPU": "GPU"}[devices.word]
    assert devices.word + " memory" in rendered([event], "en") and other not in rendered([event], "en")
    assert devices.word in rendered([event], "zh") and other not in rendered([event], "zh")


def test_doctor_checks_npu_smi_and_names_each_chip(box, tmp_path):
    devices = Devices(box, "ascend")
    warn = {"chips": [{"aicore": 0, "used": 3408, "power": 97.9, "temp": 34, "health": "Warning"}], "procs": []}
    devices.write([warn])
    r = box.run("doctor", cmd="bin/gpuguard")
    assert "OK    npu-smi answers" in r.stdout and "(1 NPU chips)" in r.stdout
    assert "NPU 0 (NPU-0-0): Ascend 910B3, Health Warning" in r.stdout
    assert "nvidia-smi" not in r.stdout


def test_report_covers_the_device_history_and_its_idle_alert(box, tmp_path, devices):
    devices.write(["idle"] * 4)
    for t in range(4):
        box.once(now=1796206508 + 60 * t)
    out = tmp_path / "r.html"
    r = box.run("report", "--out", str(out), "--gpu", "0", cmd="bin/gpuguard",
                env={"GPUGUARD_NOW": str(1796206508 + 300)})
    assert r.returncode == 0, r.stderr
    html = out.read_text()
    # the device's history: its section, titled by its kind, with the
    # capacity its tool gave (a 910B's HBM, an H200's memory)
    word = devices.word
    assert "<h2>%s 0 <small>" % word in html and "<h2>%ss</h2>" % word in html
    assert "capacity %s MiB" % ("65,536" if devices.kind == "ascend" else "143,771") in html
    assert "idle firing: %s 0" % word in html
    if devices.kind == "ascend":
        assert "<h2>NPU 0 <small>NPU-0-0" in html and "GPU 0" not in html


# ------------------------------------------------- ledger, held, NPU words --

def two_chip_box(box, tmp_path, free, held):
    """A 910B box of two chips: NPU 0 as `free`, NPU 1 as `held` (chip
    states of Devices.step); the watchdog run from cron every 10 minutes for
    an hour (2026-12-02 08:00-09:00 UTC), its textfile in tmp_path/prom.
    Returns the runs' stderr."""
    devices = Devices(box, "ascend")
    chips = [{"card": i, "chip": 0, "name": "910B3", "bus": "0000:%02X:00.0" % (0xC1 + i), "total": 65536}
             for i in range(2)]
    step = {"chips": [devices.step(free)["chips"][0], devices.step(held)["chips"][0]], "procs": []}
    devices.npu_scenario.write_text(json.dumps({"layout": "910b", "version": "25.2.0", "chips": chips,
                                                "steps": [step]}))
    box.env.update({"TZ": "UTC", "CHECK_INTERVAL": "600", "GPUGUARD_TEXTFILE_DIR": str(tmp_path / "prom")})
    day0 = 1796169600                     # 2026-12-02 00:00 UTC
    return "".join(box.once(now=day0 + 8 * 3600 + 600 * n).stderr for n in range(7))


def test_a_free_npu_adds_nothing_to_the_ledger_or_its_counters(box, tmp_path):
    """Bug report 3 #1: a free 910B chip shows its firmware's 3.4 GB in use;
    the idle rule calls it free, and so do the ledger, the held-seconds
    counters and gpuguard_gpu_held (one test of "held"). Only the chip a
    hidden job holds (30 GB) is booked: one NPU-hour, not two."""
    two_chip_box(box, tmp_path, "empty", "hidden")
    now = {"GPUGUARD_NOW": str(1796169600 + 9 * 3600)}
    r = box.run("ledger", "--json", cmd="bin/gpuguard", env=now)
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout)
    assert s["held_s"] == 3600 and s["idle_s"] == 3600
    assert [j["gpus"] for j in s["jobs"]] == [["npu1"]]
    prom = (tmp_path / "prom" / "gpuguard_idle.prom").read_text()
    assert 'gpuguard_gpu_held_seconds_total{user="?"} 3600' in prom
    assert 'gpuguard_gpu_held{gpu="0",uuid="NPU-0-0",vendor="ascend"} 0' in prom
    assert 'gpuguard_gpu_held{gpu="1",uuid="NPU-1-0",vendor="ascend"} 1' in prom


def test_an_npu_box_ledger_report_and_watchdog_log_say_npu(box, tmp_path):
    """Bug report 3 #14: `gpuguard ledger`, the report's ledger section and
    the watchdog's log lines of an Ascend box say NPU, as its digest does."""
    log = two_chip_box(box, tmp_path, "empty", "hidden")
    assert "gpu_idle firing: NPU 1 util 0%" in log and "GPU" not in log, log
    now = {"GPUGUARD_NOW": str(1796169600 + 9 * 3600)}
    r = box.run("ledger", cmd="bin/gpuguard", env=now)
    assert r.returncode == 0, r.stderr
    assert "NPU ledger 2026-12-02" in r.stdout and "1.0 NPU-hours held idle" in r.stdout
    assert "1. NPU 1 idle for 1 h 0 min" in r.stdout and "GPU" not in r.stdout, r.stdout
    out = tmp_path / "r.html"
    r = box.run("report", "--out", str(out), cmd="bin/gpuguard", env=now)
    assert r.returncode == 0, r.stderr
    section = out.read_text().split("<h2 id='ledger'>", 1)[1].split("<h2", 1)[0]
    assert section.startswith("Ledger: who held NPUs") and "1.0 NPU-hours held" in section
    assert "<th>NPU</th>" in section and "<td>1</td>" in section and "GPU" not in section, section


def test_a_mixed_box_ledger_keeps_gpu_0_and_npu_0_apart(box):
    """Bug report 3 #14: one job holding GPU 0 and NPU 0 of a mixed box is
    booked on two devices, "0" and "npu0", never one "0"; the ledger keeps
    the GPU words there."""
    npu = Devices(box, "ascend")
    box.env.update({"GPUGUARD_DEVICE": "auto", "PATH": "%s:%s" % (NPU_SMI.parent, box.env["PATH"]),
                    "TZ": "UTC", "CHECK_INTERVAL": "600"})
    del box.env["NPU_SMI"]
    npu.write(["idle"] * 7)
    box.write_scenario([{"gpus": [idle_gpu()], "apps": [app(1410)]}] * 7)
    day0 = 1796169600
    for n in range(7):
        box.once(now=day0 + 8 * 3600 + 600 * n)
    now = {"GPUGUARD_NOW": str(day0 + 9 * 3600)}
    r = box.run("ledger", "--json", cmd="bin/gpuguard", env=now)
    s = json.loads(r.stdout)
    assert s["held_s"] == 2 * 3600
    assert [sorted(j["gpus"]) for j in s["jobs"]] == [["0", "npu0"]]
    r = box.run("ledger", cmd="bin/gpuguard", env=now)
    assert "GPU ledger 2026-12-02" in r.stdout and "1. GPU 0,npu0 idle" in r.stdout, r.stdout
