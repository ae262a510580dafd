#!/usr/bin/env bash
# bash benchmarks/gpu_wheels.sh   (here, with a package registry; before a GPU session's run)
# Downloads into .whl/ the wheels hpcdl needs that the GPU machine's image lacks (it has
# torch, numpy, matplotlib, rich, scikit-learn, pillow, pyyaml and pytest, and no registry):
# hydra-core, omegaconf, antlr4-python3-runtime (an sdist: built here into a pure-Python
# wheel), submitit and xxhash (checkpoint checksums; a binary wheel, manylinux x86_64), for
# the image's Python 3.12; and Lightning with what its import
# needs (the overhead benchmark's Lightning row; pure-Python wheels; its aiohttp extra is
# not imported). benchmarks/gpu.sh installs them.
set -euo pipefail
cd "$(dirname "$0")/.."
info="$(git rev-parse --git-dir)/info"
mkdir -p "$info"
grep -qx '/.whl/' "$info/exclude" 2>/dev/null || echo '/.whl/' >> "$info/exclude"
mkdir -p .whl
# The versions installed here, so the GPU run uses what the tests here use.
version() { python3 -c "import importlib.metadata as m; print(m.version('$1'))"; }
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux2014_x86_64 -d .whl \
    "hydra-core==$(version hydra-core)" "omegaconf==$(version omegaconf)" \
    "submitit==$(version submitit)" "xxhash==$(version xxhash)" \
    "lightning==$(version lightning)" "lightning-utilities==$(version lightning-utilities)" \
    "torchmetrics==$(version torchmetrics)" "fsspec==$(version fsspec)" \
    "tqdm==$(version tqdm)"
python3 -m pip wheel --quiet --no-deps -w .whl \
    "antlr4-python3-runtime==$(version antlr4-python3-runtime)"
ls .whl
