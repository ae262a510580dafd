"""hpcdl: train PyTorch models on Slurm GPU clusters from one command.

Nothing is imported here on purpose: the login-node path must stay free of torch. The
Python API (`from hpcdl import submit, submit_sweep, submit_program, Job, Sweep`;
docs/python-api.md) is imported from hpcdl.client on first use, by the module __getattr__
below; HpcdlError, the class of every one-line refusal, from hpcdl.errors.
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hpcdl.client import (
        Job,
        JobFailedError,
        Sweep,
        WaitTimeoutError,
        submit,
        submit_program,
        submit_program_sweep,
        submit_sweep,
    )
    from hpcdl.errors import HpcdlError

__version__ = "0.1.0"

__all__ = [
    "HpcdlError",
    "Job",
    "JobFailedError",
    "Sweep",
    "WaitTimeoutError",
    "__version__",
    "submit",
    "submit_program",
    "submit_program_sweep",
    "submit_sweep",
]


def __getattr__(name: str) -> Any:
    if name == "HpcdlError":
        import hpcdl.errors

        return hpcdl.errors.HpcdlError
    if name in __all__:
        import hpcdl.client

        return getattr(hpcdl.client, name)
    raise AttributeError(f"module 'hpcdl' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
