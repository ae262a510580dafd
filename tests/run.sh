#!/usr/bin/env bash
# bash ./tests/run.sh      install hpcdl with its test tools, then run every test tier:
#   unit, slow (real multi-process gloo DDP), slurm (a real Slurm dev cluster that the
#   tests start with slurm/devcluster and stop again), gpu (skipped without CUDA).
# Without arguments the slurm tier runs next to the others, as a second pytest process:
# its tests spend most of their time waiting for the scheduler and for jobs, so the two
# together take little longer than the slower one. Its report follows the other's.
# The other tiers run as three pytest-xdist workers, a test file each at a time (module
# fixtures stay shared within a file), the longest files first (tests/conftest.py, from
# tests/file_seconds.json): on a 2-core machine the whole run took 28-31 min with one
# worker, 29m48s-30m57s with two and 27m49s with three (2026-11-28; their processes often
# wait on subprocesses and signals). Tests keep to their own tmp_path, so they do not meet.
# Extra arguments go to one pytest over everything, e.g. bash ./tests/run.sh -m "not slurm".
# The `extended` cases (a second signal, micro-batch variants the loss-count case covers,
# SIGKILL variants, ...: each a variant of a case the tiers run) are left out of the run without arguments to
# keep CI under 30 min on 2 cores (it took 31 min on 2026-11-28); bash ./tests/run.sh -m
# extended runs them (about 5 min).
set -euo pipefail
cd "$(dirname "$0")/.."
# torch is pinned here (a CPU wheel on this kind of machine); pyproject keeps a range.
python3 -m pip install --quiet torch==2.13.0 -e ".[dev]"
python3 -m ruff check hpcdl tests
python3 -m mypy
PYTEST=(python3 -m pytest -p no:cacheprovider --durations=30)
if [ "$#" -gt 0 ]; then
    exec "${PYTEST[@]}" "$@"
fi
slurm_log=$(mktemp /tmp/hpcdl-slurm-tier.XXXXXX)
"${PYTEST[@]}" -m slurm --basetemp=/tmp/hpcdl-tests-slurm >"$slurm_log" 2>&1 &
slurm_pid=$!
trap 'kill "$slurm_pid" 2>/dev/null || true' INT TERM
status=0
"${PYTEST[@]}" -n 3 --dist loadfile --no-loadscope-reorder -m "not slurm and not extended" --basetemp=/tmp/hpcdl-tests || status=$?
slurm_status=0
wait "$slurm_pid" || slurm_status=$?
echo
echo "=============================== slurm tier ==============================="
cat "$slurm_log"
rm -f "$slurm_log"
echo "tiers: not slurm exit $status, slurm exit $slurm_status"
[ "$status" -eq 0 ] && [ "$slurm_status" -eq 0 ]
