"""torchspark's benchmarks: run each from the repository root as `.venv/bin/python -m bench.NAME`
(bench/harness.py; docs/benchmarks.md, "How to run a benchmark")."""
