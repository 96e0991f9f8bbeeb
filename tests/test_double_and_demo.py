"""The nvidia-smi test double answers as the H200 recordings show, and the
README's `make demo` works as a newcomer runs it."""
import subprocess

from conftest import FAKEBIN, ROOT, user_environ

DOUBLE = str(FAKEBIN / "nvidia-smi")
RECORDING = ROOT / "tests/fixtures/h200/recording-idle-then-busy.txt"
SESSION = (ROOT / "tests/fixtures/h200/session.log").read_text()


def smi(*args, env=None):
    full = user_environ()
    full.pop("FAKE_SMI_SCENARIO", None)
    full.update(env or {})
    return subprocess.run([DOUBLE] + list(args), capture_output=True, text=True, env=full)


def test_answers_like_the_recorded_session():
    r = smi("--query-compute-apps=pid,process_name,used_memory,gpu_uuid,gpu_bus_id", "--format=csv")
    assert r.returncode == 0
    assert r.stdout == "pid, process_name, used_gpu_memory [MiB], gpu_uuid, gpu_bus_id\n"
    assert r.stdout in SESSION
    r = smi("--query-compute-apps=pid,process_name,used_memory,gpu_uuid,gpu_bus_id", "--format=csv,noheader,nounits")
    assert (r.returncode, r.stdout) == (0, "")
    r = smi("--query-gpu=bogus.field", "--format=csv")
    assert (r.returncode, r.stdout) == (2, 'Field "bogus.field" is not a valid field to query.\n\n')
    assert r.stdout in SESSION
    r = smi("-i", "7", "--query-gpu=index", "--format=csv")
    assert (r.returncode, r.stdout) == (6, "No devices were found\n")
    assert smi("-L").stdout == "GPU 0: NVIDIA H200 (UUID: GPU-21b026da-3a23-ca8c-52da-f8eedc850d97)\n"
    assert smi("-L").stdout in SESSION


def test_replays_a_raw_recording_verbatim(tmp_path):
    env = {"FAKE_SMI_RECORDING": str(RECORDING), "FAKE_SMI_STATE": str(tmp_path / "step")}
    gpu = ["--query-gpu=index,uuid,utilization.gpu,memory.used,memory.total,power.draw,power.limit",
           "--format=csv,noheader,nounits"]
    apps = ["--query-compute-apps=pid,process_name,used_memory,gpu_uuid", "--format=csv,noheader,nounits"]
    samples = []
    for _ in range(16):
        samples.append((smi(*gpu, env=env).stdout, smi(*apps, env=env).stdout))
    text = RECORDING.read_text()
    for g, a in samples:
        assert g in text and a in text
    assert samples[3][0].split(", ")[2] == "0" and samples[3][1].startswith("437, python3, 2696, GPU-")
    assert samples[9][0].split(", ")[2] == "99"
    assert samples[-1][1] == ""
    r = smi("--query-gpu=index", "--format=csv", env=env)
    assert r.returncode == 255 and "the recording holds only" in r.stdout


def test_make_demo_shows_a_firing_and_a_resolved_alert():
    r = subprocess.run(["make", "-s", "demo"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "[gpuguard ALERT]" in r.stdout and "[gpuguard RESOLVED]" in r.stdout
    assert "Processes: 437 python3 (2696 MiB)" in r.stdout
    assert "one firing and one resolved alert delivered" in r.stdout
