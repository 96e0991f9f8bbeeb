"""Entry point of gpu-leak-watch's live detector: `gpuguard_leakcheck.py
serve` (the watcher's coprocess) or `check` (one cycle).

A script run directly is compiled on every start; a module imported is read
from its cached bytecode. So the watcher runs this 3-line file, which
imports the detector (gpuguard_leak.py): a restarted detector starts
~25 ms of CPU faster on the bench machine."""
import sys

import gpuguard_leak

try:
    sys.exit(gpuguard_leak.main(["gpuguard_leak.py"] + sys.argv[1:]))
except KeyboardInterrupt:
    # Ctrl-C: one line and 130, as gpuguard_leak.py run directly
    print("gpu-leak-watch: interrupted", file=sys.stderr)
    sys.exit(130)
