"""The engine's benchmarks: `python -m bench SCENARIO [options]` (bench/run.sh is the same;
bench/README.md says what each scenario measures). The code lives in bench/harness/, the
registry of scenarios in bench/harness/cli.py; bench/drain.py and bench/peers.py are
entry points for the drain and peers scenarios."""
