#!/usr/bin/env bash
# Summary: run every bench and print the figures as Markdown
# Usage: bench/run.sh [idle|leak|lowprio]...
# Speed and memory figures live here, never in timed tests.

main() {
  local root
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  local which=("$@")
  ((${#which[@]})) || which=(idle leak lowprio)
  local b
  for b in "${which[@]}"; do
    if [[ -f $root/bench/$b.py ]]; then
      python3 "$root/bench/$b.py"
    fi
    echo
  done
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
  set -euo pipefail
  main "$@"
fi
