"""bench/h200/leak_habits.py, the H200 recorder, as far as it runs without a
GPU or PyTorch: its nvidia-smi sampler against the test double, its /proc
sampler, and bad arguments."""
import json
import os
import subprocess
import sys
import time

from conftest import FAKEBIN, H200_UUID, ROOT

sys.path.insert(0, str(ROOT / "bench" / "h200"))
import leak_habits

SCRIPT = str(ROOT / "bench" / "h200" / "leak_habits.py")


def test_smi_sampler_reads_each_process_and_the_capacity(tmp_path, monkeypatch):
    scen = {"gpus": [{"index": 0, "uuid": H200_UUID, "name": "NVIDIA H200", "pci.bus_id": "00000000:00:06.0",
                      "memory.total": 143771, "power.limit": 700.0}],
            "steps": [{"gpus": [{"utilization.gpu": 97, "memory.used": 9624, "power.draw": 512.3}],
                       "apps": [{"pid": 41210, "process_name": "python3", "used_memory": 3580, "gpu": 0},
                                {"pid": 41377, "process_name": "python3", "used_memory": 6044, "gpu": 0}]}]}
    path = tmp_path / "scenario.json"
    path.write_text(json.dumps(scen))
    monkeypatch.setenv("FAKE_SMI_SCENARIO", str(path))
    monkeypatch.setenv("PATH", "%s:%s" % (FAKEBIN, os.environ["PATH"]))
    s = leak_habits.make_sampler("smi")
    assert (s.total_mib, s.name) == (143771, "NVIDIA H200")
    assert s.sample([41210]) == {41210: 3580, 41377: 6044}


def test_smi_sampler_of_a_failed_driver_says_so_in_one_line(tmp_path, monkeypatch):
    path = tmp_path / "scenario.json"
    path.write_text(json.dumps({"steps": [{"fault": "driver"}]}))
    monkeypatch.setenv("FAKE_SMI_SCENARIO", str(path))
    monkeypatch.setenv("PATH", "%s:%s" % (FAKEBIN, os.environ["PATH"]))
    try:
        leak_habits.make_sampler("smi")
    except RuntimeError as e:
        assert str(e).startswith("nvidia-smi did not answer")
    else:
        raise AssertionError("a sampler was made from a failed nvidia-smi")


def test_proc_sampler_reads_resident_memory_of_live_processes():
    child = subprocess.Popen([sys.executable, "-c", "b = bytearray(64 << 20); import time; time.sleep(30)"])
    try:
        seen = {}
        for _ in range(400):            # until the child has its 64 MiB (a loaded machine: up to 20 s)
            seen = leak_habits.ProcSampler().sample([child.pid, 2 ** 22 + 7])
            if seen.get(child.pid, 0) >= 64:
                break
            time.sleep(0.05)
        assert set(seen) == {child.pid} and seen[child.pid] >= 64
    finally:
        child.kill()
        child.wait()


def test_bad_arguments_get_one_line_and_exit_2(tmp_path):
    for args in ([], ["--out", str(tmp_path), "--habits", "abz"], ["--out", str(tmp_path), "--minutes", "0"],
                 ["--out", str(tmp_path), "--habits", "aa"]):
        p = subprocess.run([sys.executable, SCRIPT] + args, capture_output=True, text=True)
        assert p.returncode == 2, args
        assert p.stderr.startswith("leak_habits.py: ") and p.stderr.count("\n") == 1, p.stderr
    assert os.listdir(tmp_path) == []
