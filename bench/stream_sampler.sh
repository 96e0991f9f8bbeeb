#!/usr/bin/env bash
# Summary: the sampler alone, as a daemon runs it: smi_sample every second
# Usage: stream_sampler.sh COUNT_FILE
# Sources lib/common.sh, lib/config.sh and lib/smi.sh, asks for the resident
# loops (smi_stream_begin 1) and samples once a second until SIGTERM,
# writing the number of samples taken to COUNT_FILE after each (bench/stream.py
# reads it to tell the leak watcher's cost beyond the sampler).

GPUGUARD_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=../lib/common.sh
source "$GPUGUARD_ROOT/lib/common.sh"
# shellcheck source=../lib/config.sh
source "$GPUGUARD_ROOT/lib/config.sh"
# shellcheck source=../lib/smi.sh
source "$GPUGUARD_ROOT/lib/smi.sh"

main() {
  local count_file=$1 n=0 stop=0
  config_load || return
  trap 'stop=1' TERM INT
  smi_stream_begin 1
  while ((! stop)); do
    smi_sample || true
    n=$((n + 1))
    printf '%d\n' "$n" >"$count_file"
    sleep 1 &
    wait $! || true
  done
  smi_stream_end
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
  set -euo pipefail
  main "$@"
fi
