#!/usr/bin/env bash
# bash ./tests/run.sh      install hpcdl with its test tools, then run every test tier:
#   unit, slow (real multi-process gloo DDP), slurm (a real Slurm dev cluster that the
#   tests start with slurm/devcluster and stop again), gpu (skipped without CUDA).
# Extra arguments go to pytest, e.g. bash ./tests/run.sh -m "not slurm".
set -euo pipefail
cd "$(dirname "$0")/.."
# torch is pinned here (a CPU wheel on this kind of machine); pyproject keeps a range.
python3 -m pip install --quiet torch==2.13.0 -e ".[dev]"
python3 -m ruff check hpcdl tests
python3 -m mypy
exec python3 -m pytest -p no:cacheprovider "$@"
