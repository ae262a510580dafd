#!/usr/bin/env bash
# bash benchmarks/gpu.sh      on a machine with NVIDIA GPUs, in one call (a GPU session):
#   1. the gpu test tier: bf16, fp16 + GradScaler, compile, channels_last (and its resume
#      with the fused step), NCCL with one rank and with one rank per visible GPU, CUDA RNG
#      state in exact resume, a CPU run continued on the GPU (pytest -m gpu);
#   2. hpcdl bench devices for the MLP and the CNN (the course's CPU-vs-GPU table);
#   3. every benchmark of the suite on the GPU (python -m benchmarks.run --all);
#   4. what lagged sync is worth: hpcdl bench overhead with trainer.lagged_sync on and off
#      (the same fused kernel both times), MLP, CNN and the GPU-bound ResNet-18 (lagged.md);
#   5. kernels, copies and waits per step: python -m benchmarks.kernels, hpcdl (lagged sync
#      on and off) vs the hand-written loop, MLP and CNN bf16 (kernels.md; ~1 min).
# bash benchmarks/gpu.sh tests devices   runs only the steps named (tests, devices, suite,
# lagged, kernels, and faults: benchmarks/gpu_faults.sh, what a failing GPU rank does, 90 s on an H100, only
# when named), e.g. in two calls where one call's time limit is too short for all four;
# BENCHMARKS="overhead mfu" bash benchmarks/gpu.sh suite   runs only those benchmarks;
# REPEATS=3 sets the suite's measured rounds (default 5). The suite's files are rewritten
# after each benchmark: a call killed at its time limit keeps the benchmarks that finished.
# Writes everything under $OUT (default: benchmarks/results/gpu-<date>): nvidia-smi.txt,
# versions.txt, gpu-tests.log, devices.md, and the suite's <date>-<host>-cuda.{json,md}.
# Where the image lacks hydra/omegaconf/submitit/xxhash, run benchmarks/gpu_wheels.sh first (with
# a registry) and carry .whl: they are installed from there. Every step runs even if an
# earlier one failed; the exit status is the first failure's.
set -uo pipefail
STEPS=" ${*:-tests devices suite lagged kernels} "
for name in $STEPS; do
    case $name in tests|devices|suite|lagged|kernels|faults) ;; *) echo "gpu.sh: no step '$name' (tests, devices, suite, lagged, kernels, faults)" >&2; exit 2;; esac
done
cd "$(dirname "$0")/.."
OUT="${OUT:-benchmarks/results/gpu-$(date +%F)}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if compgen -G ".whl/*.whl" > /dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/hpcdl-site .whl/*.whl || exit 1
    export PYTHONPATH="$PYTHONPATH:/tmp/hpcdl-site"
fi
status=0
step() {  # step NAME COMMAND...: run it (if asked for), log it, remember the first failure
    local name=$1; shift
    [[ $STEPS == *" $name "* ]] || return 0
    echo "== $name: $*"
    "$@" || { local rc=$?; echo "== $name failed ($rc)"; [ $status -ne 0 ] || status=$rc; }
}
{ nvidia-smi; nvidia-smi topo -m; } > "$OUT/nvidia-smi.txt" 2>&1
python3 - > "$OUT/versions.txt" 2>&1 <<'PY'
import platform, subprocess, torch
print("date", subprocess.run(["date", "-Is"], capture_output=True, text=True).stdout.strip())
print("python", platform.python_version(), "torch", torch.__version__, "cuda", torch.version.cuda)
print("gpus", [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())])
print("nccl", torch.cuda.nccl.version() if torch.cuda.is_available() else None)
print("git", subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip())
PY
# 4 xdist workers share the GPU (99 s on an H100 against 186 s in one; GPU_TEST_WORKERS=0: one).
step tests bash -c "set -o pipefail; python3 -m pytest -p no:cacheprovider -m gpu -v -n ${GPU_TEST_WORKERS:-4} tests 2>&1 | tee '$OUT/gpu-tests.log'"
# Each piped step fails if any of its commands fails (pipefail alone would see tee's status,
# or the last command's).
step devices bash -c "set -o pipefail; { rc=0; \
    python3 -m hpcdl.cli.main bench devices model=mlp data=breast_cancer || rc=1; echo; \
    python3 -m hpcdl.cli.main bench devices model=cnn data=digits || rc=1; echo; \
    python3 -m hpcdl.cli.main bench devices model=cnn data=digits trainer.precision=bf16 || rc=1; \
    exit \$rc; } | tee '$OUT/devices.md'"
step suite python3 -m benchmarks.run ${BENCHMARKS:---all} ${REPEATS:+--repeats "$REPEATS"} --out "$OUT"
step lagged bash -c "set -o pipefail; { rc=0; \
    for case in 'model=mlp data=breast_cancer' 'model=cnn data=digits trainer.precision=bf16' \
        'model=resnet18 data=synthetic data.shape=[3,32,32] data.num_classes=10 data.num_samples=16384 data.val_fraction=0.25 data.test_fraction=0.125 trainer.batch_size=256 trainer.precision=bf16'; do \
    for sync in true false; do echo \"### \$case trainer.lagged_sync=\$sync\"; \
    python3 -m hpcdl.cli.main bench overhead --repeats 3 --epochs 3 \$case optim.fused=true trainer.lagged_sync=\$sync || rc=1; \
    echo; done; done; exit \$rc; } | tee '$OUT/lagged.md'"
step kernels bash -c "set -o pipefail; { rc=0; \
    for case in 'model=mlp data=breast_cancer' 'model=cnn data=digits trainer.precision=bf16'; do \
    python3 -m benchmarks.kernels \$case || rc=1; echo; done; exit \$rc; } 2>&1 | grep -v '^USDT' | tee '$OUT/kernels.md'"
step faults bash -c "set -o pipefail; OUT='$OUT/faults' bash benchmarks/gpu_faults.sh 2>&1 | tee '$OUT/faults.log'"
exit $status
