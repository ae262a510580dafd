#!/usr/bin/env bash
# bash benchmarks/gpu_faults.sh [spin spin_raise assert oom]   (repo root, a GPU machine;
# `bash benchmarks/gpu.sh faults` runs it with gpu.sh's $OUT). What hpcdl does when a rank
# fails on a GPU with a real (one-rank) NCCL process group, each check a short cluster=local
# run (trainer.stall_timeout_s=10) with a fault injected after step 5
# (benchmarks/gpu_fault_hooks.py):
#   spin        a ~10 min kernel with the step's collectives queued behind it: which ends
#               the rank, hpcdl's stall watchdog ("made no progress") or NCCL's timeout
#               ("Watchdog caught", "terminate called"), and after how long;
#   spin_raise  an error raised with a collective queued: its traceback must come out at
#               once (the failing rank leaves without NCCL's collective teardown);
#   assert      a device-side assert: what the user sees, and the checkpoint still loads;
#   oom         torch.OutOfMemoryError: one line naming trainer.batch_size.
# Each prints its exit status and time, the key lines of the rank's log and whether the
# newest checkpoint loads; a rank left running is reported and killed (by pid). At most about
# 130 s a check. GPUS=0 bash benchmarks/gpu_faults.sh cpu_raise checks the plumbing on a CPU.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu_faults}; mkdir -p "$OUT"
GPUS=${GPUS:-1}
KINDS=${*:-spin spin_raise assert oom}
status=0
for kind in $KINDS; do
  run="$OUT/run_$kind"; rm -rf "$run"
  start=$(date +%s.%N)
  PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" HPCDL_GPU_FAULT="$kind@5" \
    timeout -k 10 120 python3 -m hpcdl.cli.main train "run_dir=$run" cluster=local \
      cluster.tasks_per_node=1 "cluster.gpus_per_node=$GPUS" cluster.rendezvous_timeout_s=60 \
      trainer.max_epochs=3 trainer.stall_timeout_s=10 trainer.checkpoint_every_steps=2 \
      "trainer.step_hooks=[benchmarks.gpu_fault_hooks:after_step]" >"$OUT/$kind.cli.txt" 2>&1
  rc=$?; end=$(date +%s.%N)
  [ "$rc" -eq 124 ] && status=1  # the CLI itself hung past its limit
  echo "=== $kind: exit $rc after $(python3 -c "print(round($end-$start,1))") s"
  tail -n 6 "$OUT/$kind.cli.txt"
  for log in "$run"/logs/*_log.out; do
    [ -e "$log" ] || continue
    cp "$log" "$OUT/$kind.$(basename "$log")"
    echo "--- $(basename "$log"): key lines"
    grep -nE "FAULT|made no progress|Watchdog caught|terminate called|what\(\)|Error: |Traceback|Aborted|Assertion" "$log" | head -n 20
  done
  grep -h '"event": "stall"' "$run/attempts.jsonl" 2>/dev/null | head -n 2
  python3 - "$run" <<'PY'
import sys, warnings
from hpcdl.checkpoint import CheckpointStore
with warnings.catch_warnings(record=True):
    warnings.simplefilter("always")
    found = CheckpointStore(sys.argv[1] + "/checkpoints").load_latest()
print("newest checkpoint:", "none" if found is None else f"{found[0].name} loads (step {found[1]['progress']['global_step']})")
PY
  left=$(pgrep -f "$run" || true)
  if [ -n "$left" ]; then
    echo "LEFT RUNNING after the CLI ended (a rank stuck in teardown?): $left"
    kill -9 $left 2>/dev/null || true
    status=1
  fi
done
exit $status
