"""The "one place" rules of docs/ARCHITECTURE.md, checked on the source:
nvidia-smi is run only from lib/smi.sh (npu-smi only from lib/npu.sh); alerts leave only through
lib/events.sh -> python/gpuguard_alert.py, and nothing else speaks HTTP at
run time; only lib/cgroup.sh writes under /sys/fs/cgroup; no config file is
sourced; configuration keys are never exported.

Each rule is a function from files to violations. The tree must have none,
and each rule is also fed a second place (a violation planted in another
file) to show that it would catch one."""
import re
from pathlib import Path

import pytest
from conftest import ROOT


def read(rel):
    return (ROOT / rel).read_text(errors="replace")


def is_bash(path):
    return path.is_file() and path.read_text(errors="replace").startswith(("#!/usr/bin/env bash", "#!/bin/bash"))


# What runs on a user's machine: the commands, the libraries, the installer,
# the Python helpers and the shipped units and rules.
RUNTIME_SHELL = sorted(str(p.relative_to(ROOT)) for p in list((ROOT / "bin").iterdir()) + [ROOT / "install.sh"]
                       if is_bash(p)) + sorted(str(p.relative_to(ROOT)) for p in (ROOT / "lib").glob("*.sh"))
RUNTIME_PYTHON = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "python").glob("*.py"))
RUNTIME_ETC = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "etc").rglob("*") if p.is_file())
# Shell that is not shipped but still must not grow a second nvidia-smi
# caller or source a config file. bench/seed_loop.sh is the source
# article's loop kept verbatim as the baseline it is compared with: it calls
# nvidia-smi on purpose. The doubles (tests/fakebin, bench/fakebin) are
# nvidia-smi.
OTHER_SHELL = sorted(str(p.relative_to(ROOT)) for p in
                     list((ROOT / "bench").rglob("*.sh")) + list((ROOT / "tests").glob("*.sh"))
                     + list((ROOT / "tests" / "bats").rglob("*.bats")) + list((ROOT / "tests" / "bats").rglob("*.bash"))
                     + [ROOT / ".ci" / "run", ROOT / ".ci" / "venv"]
                     if p.name != "seed_loop.sh")


def shell_code(text):
    """(line number, code) for each line, comments removed. A # starts a
    comment at the start of a line or after a blank ($#, ${#a[@]} stay)."""
    for n, line in enumerate(text.splitlines(), 1):
        code = re.sub(r"(^|\s)#.*", "", line)
        if code.strip():
            yield n, code


def python_code(text):
    for n, line in enumerate(text.splitlines(), 1):
        code = re.sub(r"^\s*#.*", "", line)
        if code.strip():
            yield n, code


def unquoted(code):
    """The line with its quoted strings emptied: a message that mentions
    nvidia-smi is not a call."""
    return re.sub(r"'[^']*'|\"(\\.|[^\"\\])*\"", '""', code)


# A command word in command position: start of line, after ; & | ( { `
# $( or a keyword, or behind a prefix command (timeout 10, exec, nice...).
CMD_POS = r"(^|[;&|({`]|\$\(|\b(?:then|do|else|exec|time|nice|env|xargs|command|sudo|watch)\s+(?:-\S+\s+)*" \
          r"|\btimeout\s+(?:-\w+(?:[= ][^-\s]\S*)?\s+)*\S+\s+)\s*"


# ---------------------------------------------------------------- nvidia-smi --

SMI_HOME = "lib/smi.sh"


def tool_violations(files, home, tool, var):
    """Places outside `home` that run the device tool `tool` (by name, or
    through its override variable `var`)."""
    hits = []
    for rel, text in files:
        if rel == home:
            continue
        if rel.endswith(".py"):
            for n, code in python_code(text):
                if re.search(r"(subprocess|Popen|os\.system|os\.exec\w*|os\.spawn\w*|os\.popen|check_output|"
                             r"check_call)\b.*(%s|%s)" % (tool, var), code):
                    hits.append(f"{rel}:{n}")
            continue
        for n, code in shell_code(text):
            if re.search(CMD_POS + tool + r"(\s|$|[;)|&`])", unquoted(code)) and "command -v" not in code or \
                    re.search(CMD_POS + r"\"?\$\{?" + var + r"\b", code):
                hits.append(f"{rel}:{n}")
    return hits


def smi_violations(files):
    return tool_violations(files, SMI_HOME, "nvidia-smi", "NVIDIA_SMI")


def test_only_smi_sh_runs_nvidia_smi():
    files = [(rel, read(rel)) for rel in RUNTIME_SHELL + RUNTIME_PYTHON + RUNTIME_ETC + OTHER_SHELL]
    assert smi_violations(files) == [], "nvidia-smi is run only from lib/smi.sh (smi_run, smi_sample)"
    assert smi_violations([(SMI_HOME, read(SMI_HOME))]) == []


# ------------------------------------------------------------------ npu-smi --

NPU_HOME = "lib/npu.sh"


def npu_violations(files):
    """npu-smi (Ascend NPUs) is run only from lib/npu.sh, as nvidia-smi is
    only from lib/smi.sh."""
    return tool_violations(files, NPU_HOME, "npu-smi", "NPU_SMI")


def test_only_npu_sh_runs_npu_smi():
    files = [(rel, read(rel)) for rel in RUNTIME_SHELL + RUNTIME_PYTHON + RUNTIME_ETC + OTHER_SHELL]
    assert npu_violations(files) == [], "npu-smi is run only from lib/npu.sh (npu_run_into, npu_sample)"
    assert npu_violations([(NPU_HOME, read(NPU_HOME))]) == []


# ------------------------------------------------------------------ alerts --

ALERT_HOME = "lib/events.sh"
ALERT_HELPER = "python/gpuguard_alert.py"


def alert_violations(files):
    """A second starter of the alert helper, or a second way out over the
    network (HTTP clients, sockets, curl/wget) at run time."""
    hits = []
    for rel, text in files:
        if rel.endswith(".py"):
            if rel == ALERT_HELPER:
                continue
            for n, code in python_code(text):
                if re.search(r"^\s*(import|from)\s+(urllib(?!\.parse\b)|http\b|requests\b|urllib3\b|socket\b|"
                             r"smtplib\b|ftplib\b|xmlrpc\b|gpuguard_alert\b)", code) \
                        or re.search(r"(subprocess|Popen|os\.system|os\.exec\w*).*gpuguard_alert", code):
                    hits.append(f"{rel}:{n}")
            continue
        for n, code in shell_code(text):
            if rel != ALERT_HOME and re.search(r"gpuguard_alert(\.py)?\b", code) or re.search(CMD_POS + r"(curl|wget|nc|ncat|socat)(\s|$)", unquoted(code)) or "/dev/tcp/" in code:
                hits.append(f"{rel}:{n}")
    return hits


def test_alerts_leave_only_through_events_sh_and_the_alert_helper():
    files = [(rel, read(rel)) for rel in RUNTIME_SHELL + RUNTIME_PYTHON + RUNTIME_ETC]
    assert alert_violations(files) == [], \
        "alerts leave only through lib/events.sh -> python/gpuguard_alert.py; nothing else sends over the network"
    assert re.search(r"gpuguard_alert\.py", read(ALERT_HOME)), "lib/events.sh no longer starts the alert helper"


# ------------------------------------------------------------------ cgroups --

CGROUP_HOME = "lib/cgroup.sh"
CG_FILES = r"(cgroup\.(procs|threads|subtree_control|kill|freeze)|cpu\.(weight|max|shares|cfs_quota_us|cfs_period_us|" \
           r"idle)|memory\.(max|high|limit_in_bytes|soft_limit_in_bytes)|io\.max|blkio\.\w+|pids\.max|tasks)\b"


def cgroup_violations(files):
    """Writes (redirections, tee, mkdir/rmdir, Python open for writing)
    under /sys/fs/cgroup or to a cgroup control file, outside lib/cgroup.sh."""
    hits = []
    for rel, text in files:
        if rel == CGROUP_HOME:
            continue
        if rel.endswith(".py"):
            for n, code in python_code(text):
                if is_cgroup_path(code) and re.search(r"open\([^)]*['\"][wax+]|write_text|write_bytes|"
                                                      r"os\.(mkdir|makedirs|rmdir)", code):
                    hits.append(f"{rel}:{n}")
            continue
        for n, code in shell_code(text):
            targets = re.findall(r"(?:^|[^<>&0-9])>>?\s*(\"[^\"]*\"|'[^']*'|[^\s;&|)]+)", code)
            if any(is_cgroup_path(t) for t in targets) or \
                    (re.search(CMD_POS + r"(tee|mkdir|rmdir|cp|mv|ln|install)\s", unquoted(code)) and is_cgroup_path(code)):
                hits.append(f"{rel}:{n}")
    return hits


def is_cgroup_path(text):
    return "/sys/fs/cgroup" in text or "CG_ROOT" in text or re.search(CG_FILES, text)


def test_only_cgroup_sh_writes_under_sys_fs_cgroup():
    files = [(rel, read(rel)) for rel in RUNTIME_SHELL + RUNTIME_PYTHON]
    assert cgroup_violations(files) == [], "cgroups are touched only in lib/cgroup.sh (cg_* functions)"


# ------------------------------------------------------------------- config --

def source_violations(files):
    """A `source` or `.` of anything but a shell library (*.sh, *.bash):
    config files are parsed as data by config_parse_file, never sourced."""
    hits = []
    for rel, text in files:
        # `for f in lib/*.sh; do source "$f"` sources libraries too
        lib_vars = {"$" + v for v in re.findall(r"\bfor\s+(\w+)\s+in\s[^;\n]*\.sh\b", text)}
        lib_vars |= {"${" + v[1:] + "}" for v in lib_vars}
        for n, code in shell_code(text):
            for m in re.finditer(r"(?:^|[;&|({]|\bthen|\bdo|\belse)\s*(?:source|\.)\s+(\S+)", code):
                target = m.group(1).strip("\"';)")
                if target not in lib_vars and not re.search(r"\.(sh|bash)$|^/dev/null$", target):
                    hits.append(f"{rel}:{n}: {target}")
    return hits


def test_no_config_file_is_sourced():
    files = [(rel, read(rel)) for rel in RUNTIME_SHELL + OTHER_SHELL]
    assert source_violations(files) == [], "config files are parsed (config_parse_file), never sourced"


def config_keys():
    return set(re.findall(r"^\s*\[([A-Z][A-Z0-9_]*)\]=", read("lib/config.sh"), re.MULTILINE))


# ARCHITECTURE.md, rule 2: gg_python exports these to a Python helper besides the keys it
# is given; everything else stays unexported so that secrets never reach
# nvidia-smi, the job or any other child.
EXPORT_OK = {"GPUGUARD_STATE_DIR", "GPUGUARD_HOST", "GPUGUARD_LOG", "GPUGUARD_LOG_LEVEL", "GPUGUARD_SYSLOG"}


def export_violations(files, keys):
    """`export`/`declare -x` of a configuration key, or of a name only known
    at run time, outside gg_python (lib/common.sh), which exports exactly the
    variables a helper needs, in a subshell."""
    hits = []
    for rel, text in files:
        in_gg_python = False
        for n, code in shell_code(text):
            if re.match(r"^gg_python\(\)", code):
                in_gg_python = True
            elif in_gg_python and re.match(r"^\}", code):
                in_gg_python = False
            if in_gg_python:
                continue
            for m in re.finditer(r"\b(?:export|declare\s+-[a-zA-Z]*x[a-zA-Z]*|typeset\s+-[a-zA-Z]*x[a-zA-Z]*)"
                                 r"((?:\s+[^\s;&|]+)+)", code):
                words = m.group(1).split()
                if m.group(0).startswith("export") and any(w.startswith("-") and "n" in w for w in words):
                    continue                  # export -n takes the export away
                for word in words:
                    name = word.strip("\"'").split("=", 1)[0]
                    if name.startswith("-"):
                        continue
                    if name.startswith("$") or (name in keys and name not in EXPORT_OK):
                        hits.append(f"{rel}:{n}: {name}")
    return hits


def test_configuration_is_never_exported():
    files = [(rel, read(rel)) for rel in RUNTIME_SHELL]
    assert export_violations(files, config_keys()) == [], \
        "configuration keys are never exported: Python helpers get theirs through gg_python"


# ------------------------------------------- each rule catches a second place --

SECOND_PLACES = [
    (smi_violations, "lib/idle.sh", 'out=$(nvidia-smi --query-gpu=index --format=csv)'),
    (smi_violations, "lib/leak.sh", '  timeout -k 1 5 nvidia-smi -L'),
    (smi_violations, "lib/doctor.sh", '  "$NVIDIA_SMI" --query-gpu=name --format=csv'),
    (smi_violations, "lib/doctor.sh", '  info=$(timeout 5 ${NVIDIA_SMI} -q)'),
    (smi_violations, "bench/h200/checks.sh", 'nvidia-smi -q >"$OUT/q.txt"'),
    (smi_violations, "python/gpuguard_leak.py", '    out = subprocess.run(["nvidia-smi", "-L"])'),
    (npu_violations, "lib/idle.sh", 'out=$(npu-smi info)'),
    (npu_violations, "lib/doctor.sh", '  timeout 5 "$NPU_SMI" info -t usages -i 0'),
    (npu_violations, "python/gpuguard_leak.py", '    out = subprocess.run(["npu-smi", "info"])'),
    (alert_violations, "lib/idle.sh", '  python3 -S "$GPUGUARD_ROOT/python/gpuguard_alert.py" flush'),
    (alert_violations, "bin/gpuguard", '  gg_python gpuguard_alert.py "NOTIFY_URL" test'),
    (alert_violations, "lib/leak.sh", '  curl -fsS -d "$body" "$NOTIFY_URL"'),
    (alert_violations, "python/gpuguard_leak.py", 'import urllib.request'),
    (alert_violations, "python/gpuguard_report.py", 'from http.client import HTTPSConnection'),
    (alert_violations, "python/gpuguard_leak.py", 'import gpuguard_alert'),
    (alert_violations, "python/gpuguard_render.py", 'import http.client'),
    (alert_violations, "python/gpuguard_render.py", 'from gpuguard_alert import chat_request'),
    (cgroup_violations, "lib/lowprio.sh", '  echo "$pid" >"/sys/fs/cgroup/gpuguard/cgroup.procs"'),
    (cgroup_violations, "lib/lowprio.sh", '  printf 50 >"$dir/cpu.weight"'),
    (cgroup_violations, "lib/lowprio.sh", '  mkdir -p /sys/fs/cgroup/gpuguard/job1'),
    (cgroup_violations, "python/gpuguard_leak.py", '    open("/sys/fs/cgroup/x/memory.max", "w").write("1G")'),
    (source_violations, "lib/config.sh", '  source "$GPUGUARD_CONFIG"'),
    (source_violations, "bin/yichuidingyin.sh", '[[ -r $f ]] && . "$f"'),
    (source_violations, "install.sh", 'source /etc/gpuguard/gpuguard.conf'),
]
NOT_VIOLATIONS = [
    (smi_violations, "lib/idle.sh", '    gg_log error "$SMI_ERROR (logged once until nvidia-smi answers again)"'),
    (smi_violations, "lib/doctor.sh", '  read -r -a cmd <<<"${NVIDIA_SMI:-nvidia-smi}"'),
    (smi_violations, "lib/doctor.sh", '  if ! command -v -- nvidia-smi >/dev/null; then'),
    (smi_violations, "lib/idle.sh", '# nvidia-smi is run from smi.sh'),
    (npu_violations, "lib/idle.sh", '    gg_log error "npu-smi answers again"'),
    (alert_violations, "python/gpuguard_leak.py", 'import urllib.parse'),
    (cgroup_violations, "lib/doctor.sh", '  doctor_line INFO "cgroup mode: $CG_MODE"'),
    (cgroup_violations, "lib/jobinfo.sh", '  read -r line </proc/$pid/cgroup'),
    (source_violations, "bin/gpuguard", 'source "$GPUGUARD_ROOT/lib/common.sh"'),
]


@pytest.mark.parametrize("rule,rel,line", SECOND_PLACES, ids=lambda v: getattr(v, "__name__", None))
def test_each_rule_catches_a_second_place(rule, rel, line):
    real = read(rel) if (ROOT / rel).exists() else ""
    assert rule([(rel, real + "\n" + line + "\n")]), f"{rule.__name__} missed a second place: {rel}: {line}"


@pytest.mark.parametrize("rule,rel,line", NOT_VIOLATIONS, ids=lambda v: getattr(v, "__name__", None))
def test_rules_leave_messages_and_reads_alone(rule, rel, line):
    assert rule([(rel, line + "\n")]) == []


def test_export_rule_catches_a_config_export_and_spares_gg_python():
    keys = config_keys()
    assert {"NOTIFY_URL", "NOTIFY_SECRET", "THRESHOLD"} <= keys
    assert export_violations([("lib/config.sh", '    export "$key"\n')], keys)
    assert export_violations([("lib/leak.sh", "  export LEAK_THRESHOLD_MIB_H NOTIFY_URL\n")], keys)
    assert export_violations([("bin/x", "declare -gx NOTIFY_SECRET=$s\n")], keys)
    assert export_violations([("bin/x", "export GPUGUARD_STATE_DIR GPUGUARD_HOST PATH\n")], keys) == []
    gg_python = 'gg_python() {\n  (\n    export "${names[@]}" GPUGUARD_LOG\n    exec python3 -S "$f"\n  )\n}\n'
    assert export_violations([("lib/common.sh", gg_python)], keys) == []


# ----------------------------------------------------- citations (issue 25) --

CITED_FILES = ["bin", "lib", "python", "etc", "docs", "tests", "bench", ".ci", "install.sh", "README.md",
               "CONTRIBUTING.md", "Makefile"]


def defined_rules():
    """The numbers of the list under "Rules the code cites" in ARCHITECTURE.md."""
    text = read("docs/ARCHITECTURE.md").split("## Rules the code cites", 1)[1].split("\n## ", 1)[0]
    return {int(n) for n in re.findall(r"^(\d+)\. \*\*", text, re.MULTILINE)}


def citation_violations(files, rules):
    """A "contract N" (defined nowhere in the repository), a shared/research
    path (outside it), or an "ARCHITECTURE.md, rule N" whose N is not in
    the list."""
    hits = []
    for rel, text in files:
        for n, line in enumerate(text.splitlines(), 1):
            if re.search(r"\bcontracts? \d", line, re.IGNORECASE) or "shared/research" in line:
                hits.append(f"{rel}:{n}: {line.strip()[:80]}")
            for m in re.finditer(r"ARCHITECTURE\.md, rules? (\d+)", line):
                if int(m.group(1)) not in rules:
                    hits.append(f"{rel}:{n}: rule {m.group(1)} is not in ARCHITECTURE.md's list")
    return hits


def cited_files():
    paths = []
    for name in CITED_FILES:
        top = ROOT / name
        paths += [top] if top.is_file() else [p for p in sorted(top.rglob("*")) if p.is_file()]
    me = Path(__file__).resolve()
    out = []
    for p in paths:
        if p.resolve() == me or "__pycache__" in p.parts or p.suffix in (".pyc", ".png", ".gz"):
            continue
        try:
            out.append((str(p.relative_to(ROOT)), p.read_text(encoding="utf-8")))
        except (UnicodeDecodeError, OSError):
            continue
    return out


def test_every_citation_is_defined_in_this_repository():
    rules = defined_rules()
    assert rules == set(range(1, len(rules) + 1)) and rules
    assert citation_violations(cited_files(), rules) == [], \
        "say it in place, or point at a rule of docs/ARCHITECTURE.md's list"


def test_citation_rule_catches_an_undefined_one():
    files = [("lib/x.sh", "# as contract 4 says\n# see shared/research/notes.md\n# ARCHITECTURE.md, rule 99\n"
                          "# ARCHITECTURE.md, rule 2\n")]
    assert [h.split(":")[1] for h in citation_violations(files, {1, 2})] == ["1", "2", "3"]


def python_imports(files):
    """{module: set of runtime modules it imports} for (path, text) pairs,
    read with the ast (so an import inside a function counts too)."""
    import ast
    names = {Path(rel).stem for rel, _ in files}
    graph = {}
    for rel, text in files:
        deps = set()
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Import):
                deps.update(a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                deps.add(node.module.split(".")[0])
        graph[Path(rel).stem] = deps & names
    return graph


def import_cycles(files):
    """Each import cycle among the modules, as "a -> b -> a" (empty when
    there is none): a depth-first walk that reports every back edge."""
    graph = python_imports(files)
    cycles, state, path = [], {}, []

    def visit(mod):
        state[mod] = "open"
        path.append(mod)
        for dep in sorted(graph[mod]):
            if state.get(dep) == "open":
                cycles.append(" -> ".join(path[path.index(dep):] + [dep]))
            elif dep not in state:
                visit(dep)
        path.pop()
        state[mod] = "done"

    for mod in sorted(graph):
        if mod not in state:
            visit(mod)
    return cycles


def test_runtime_python_modules_import_no_cycle():
    assert import_cycles([(rel, read(rel)) for rel in RUNTIME_PYTHON]) == []


def test_cycle_rule_catches_an_import_inside_a_function():
    files = [(rel, read(rel)) for rel in RUNTIME_PYTHON]
    planted = [(rel, text + "\n\ndef _late():\n    import gpuguard_report\n" if rel.endswith("/gpuguard_history.py")
                else text) for rel, text in files]
    assert import_cycles(planted) == ["gpuguard_history -> gpuguard_report -> gpuguard_history"]


def global_rebindings(files):
    """`global NAME` statements: a helper's configuration (its env) is passed
    as an argument, never swapped into a module variable by an entry point."""
    import ast
    return [f"{rel}:{node.lineno}: global {', '.join(node.names)}"
            for rel, text in files for node in ast.walk(ast.parse(text)) if isinstance(node, ast.Global)]


def test_runtime_python_passes_its_configuration_instead_of_rebinding_a_global():
    assert global_rebindings([(rel, read(rel)) for rel in RUNTIME_PYTHON]) == []
    planted = "ENV = {}\n\ndef flush(env=None):\n    global ENV\n    ENV = env\n"
    assert global_rebindings([("python/gpuguard_alert.py", planted)]) == ["python/gpuguard_alert.py:4: global ENV"]
