"""What identifies a run's result and lets it be reproduced: a weights hash and versions."""

from __future__ import annotations

import hashlib
import importlib.metadata
import platform
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

# Key prefixes added by wrappers: DistributedDataParallel ("module.") and torch.compile
# ("_orig_mod."), possibly both, in either order.
_WRAPPER_PREFIXES = ("module.", "_orig_mod.")


def strip_wrapper_prefix(key: str) -> str:
    stripped = True
    while stripped:
        stripped = False
        for prefix in _WRAPPER_PREFIXES:
            if key.startswith(prefix):
                key = key[len(prefix) :]
                stripped = True
    return key


def weights_sha256(state_dict: Mapping[str, Any]) -> str:
    """SHA-256 over (name, dtype, shape, bytes) of each tensor, in sorted key order.

    Keys lose their DDP/compile prefixes first, so a wrapped model hashes like the plain one.
    """
    entries = sorted((strip_wrapper_prefix(key), value) for key, value in state_dict.items())
    digest = hashlib.sha256()
    for key, value in entries:
        if isinstance(value, torch.Tensor):
            tensor = value.detach().cpu().contiguous().reshape(-1)
            meta = f"{key}|{tensor.dtype}|{tuple(value.shape)}\n"
            digest.update(meta.encode())
            # view(uint8) reinterprets the bytes, so dtypes numpy lacks (bf16) hash too.
            digest.update(tensor.view(torch.uint8).numpy().data)
        else:  # e.g. a module's _extra_state
            digest.update(f"{key}|{type(value).__name__}|{value!r}\n".encode())
    return digest.hexdigest()


def collect_versions() -> dict[str, str]:
    """Versions that decide whether a run can be reproduced, as strings."""
    try:
        hpcdl_version = importlib.metadata.version("hpcdl")
    except importlib.metadata.PackageNotFoundError:
        hpcdl_version = "unknown"
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    versions = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": np.__version__,
        "hpcdl": hpcdl_version,
        "cuda": str(torch.version.cuda) if torch.version.cuda else "none",
        "cudnn": str(cudnn) if cudnn else "none",
    }
    if torch.cuda.is_available():
        versions["gpu"] = torch.cuda.get_device_name(0)
    return versions
