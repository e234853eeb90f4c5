"""`python bench/drain.py [scenario] [options]`: the drain scenarios (bench/harness/drain.py
says what they measure; `python -m bench drain-fast ...` is the same)."""

import sys
from pathlib import Path

# Run as a script from a checkout: the repository root is where `bench` is importable.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.harness.drain import main

sys.exit(main())
