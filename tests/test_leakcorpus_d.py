"""Corpus D (bench/leakcorpus_d.py, a generator family written blind to the
detector): the same seed writes the same bytes, each label agrees with its
trace (the generator's own check), and bad arguments get one line."""
import subprocess
import sys

from conftest import ROOT

SCRIPT = str(ROOT / "bench" / "leakcorpus_d.py")


def _run(*args):
    return subprocess.run([sys.executable, SCRIPT] + [str(a) for a in args], capture_output=True, text=True)


def test_two_seeds_of_each_kind_agree_with_their_labels_and_repeat_byte_for_byte(tmp_path):
    a = _run(tmp_path / "a", "--seeds", "2", "--check")
    assert a.returncode == 0, a.stdout + a.stderr
    assert a.stdout.startswith("24 traces (12 leaking) in ")
    assert _run(tmp_path / "b", "--seeds", "2").returncode == 0
    for f in sorted((tmp_path / "a").iterdir()):
        assert f.read_bytes() == (tmp_path / "b" / f.name).read_bytes(), f.name


def test_bad_arguments_get_one_line_and_exit_2(tmp_path):
    for args in (["--kinds", "nope", tmp_path], ["--seeds", "0", tmp_path], ["--score", tmp_path / "none"], []):
        p = _run(*args)
        assert p.returncode == 2, (args, p.stderr)
        assert p.stderr.startswith("leakcorpus_d.py: ") and p.stderr.count("\n") == 1, p.stderr
