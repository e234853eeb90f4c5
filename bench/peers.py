"""`python bench/peers.py [scenario] [options]`: the engine against pgqueuer in pairs of
runs (bench/harness/peers.py says how; `python -m bench peers ...` is the same)."""

import sys
from pathlib import Path

# Run as a script from a checkout: the repository root is where `bench` is importable.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.harness.peers import main

sys.exit(main())
