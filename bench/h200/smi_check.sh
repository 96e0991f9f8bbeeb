#!/usr/bin/env bash
# Summary: the sampling path against the real nvidia-smi: smi_sample with a PyTorch process holding memory, doctor, one watchdog cycle, a wrapped job under gpu-leak-watch
# Usage: OUT=DIR bench/h200/smi_check.sh   (about 30 s; writes OUT/smi_check.txt)

SC_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck source=../../lib/common.sh
source "$SC_ROOT/lib/common.sh"
# shellcheck source=../../lib/smi.sh
source "$SC_ROOT/lib/smi.sh"

main() {
  local state holder
  state=$(mktemp -d)
  export GPUGUARD_STATE_DIR=$state GPUGUARD_CONFIG=/dev/null
  python3 -c 'import torch, time; x = torch.ones(1 << 28, device="cuda"); time.sleep(25)' &
  holder=$!
  sleep 8
  echo "== smi_sample (a PyTorch process holds 1 GiB)"
  local rc=0
  smi_sample || rc=$?
  echo "rc=$rc error='$SMI_ERROR' apps_ok=$SMI_APPS_OK bad_lines=$SMI_BAD_LINES"
  declare -p SMI_UUIDS SMI_MEM_USED SMI_MEM_TOTAL SMI_UTIL SMI_POWER SMI_NAME SMI_PIDS_MEM SMI_PROCS
  echo "holder PID $holder"
  echo "== LANG=C, a UTF-8 locale: the same sample"
  LC_ALL=C smi_sample && echo "C: ${SMI_PIDS_MEM[*]}"
  LC_ALL=C.UTF-8 smi_sample && echo "C.UTF-8: ${SMI_PIDS_MEM[*]}"
  echo "== gpuguard doctor"
  "$SC_ROOT/bin/gpuguard" doctor | head -20
  echo "== yichuidingyin.sh --once"
  "$SC_ROOT/bin/yichuidingyin.sh" --once
  echo "exit $?"
  echo "== gpu-leak-watch -- (a job that fills 4 GiB and exits 3)"
  LEAK_INTERVAL=1 "$SC_ROOT/bin/gpu-leak-watch" -- python3 -c \
    'import torch, time, sys; xs = [torch.ones(1 << 28, device="cuda") for _ in range(4) if not time.sleep(1)]; sys.exit(3)'
  echo "exit $? (want 3)"
  tail -5 "$state"/history/*.csv 2>/dev/null | head -12
  wait "$holder"
  rm -rf -- "$state"
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
  set -uo pipefail
  main "$@" 2>&1 | tee "${OUT:?}/smi_check.txt"
fi
