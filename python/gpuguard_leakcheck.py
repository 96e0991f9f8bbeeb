"""Entry point of gpu-leak-watch's live cycle: `gpuguard_leakcheck.py check`.

A script run directly is compiled on every start; a module imported is read
from its cached bytecode. The watcher starts Python once a cycle, so the
cycle runs this 3-line file and imports the detector (gpuguard_leak.py,
~25 ms less CPU per cycle on the bench machine)."""
import sys

import gpuguard_leak

sys.exit(gpuguard_leak.main(["gpuguard_leak.py"] + sys.argv[1:]))
