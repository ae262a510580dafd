"""data=custom's fitted state: what a dataset learns from its training data (normalization
means and deviations, a vocabulary, a label encoder), kept with the model.

A train dataset that has ``state_dict()`` and ``load_state_dict(state)`` (as torch modules
and optimizers do) has its state read once, when the data is built, and saved in every
checkpoint. A resumed run loads it into the rebuilt datasets before any batch is read, and
so do `hpcdl evaluate` and `hpcdl predict` on new data (``--split all data.kwargs...``):
the new data is prepared with the training data's statistics, not ones refitted on it.
"""

from __future__ import annotations

import warnings
from typing import Any, Optional

from hpcdl.checkpoint import check_weights_only_safe
from hpcdl.data.custom import own_dataset
from hpcdl.errors import CheckpointError, DataError, HpcdlWarning


def read_data_state(datasets: dict[str, Any], where: str) -> Optional[dict[str, Any]]:
    """The train dataset's state_dict(), checked to be savable; None when it has none."""
    train = own_dataset(datasets["train"])
    state_dict = getattr(train, "state_dict", None)
    if not callable(state_dict):
        return None
    name = type(train).__name__
    if not callable(getattr(train, "load_state_dict", None)):
        raise DataError(
            f"{where}: the train dataset ({name}) has state_dict() but no load_state_dict(state); "
            "define both (hpcdl saves the state with the model and loads it into the datasets "
            "of a resume, evaluate or predict), or neither"
        )
    try:
        state = state_dict()
    except Exception as exc:
        raise DataError(f"{where}: {name}.state_dict() raised {_described(exc)}") from exc
    if not isinstance(state, dict):
        raise DataError(
            f"{where}: {name}.state_dict() returned a {type(state).__name__}; return a dict"
        )
    try:
        check_weights_only_safe(state, f"{name}.state_dict()")
    except CheckpointError as err:
        raise DataError(
            f"{where}: {err} (checkpoints are read with weights_only=True: torch.as_tensor() "
            "a numpy array, float() a numpy number)"
        ) from None
    return state


def load_data_state(datasets: dict[str, Any], state: dict[str, Any], where: str) -> None:
    """The saved state into every split's dataset that takes one (each dataset once: the
    splits of one dataset share it); a warning when none does any more."""
    loaded: set[int] = set()
    for split, dataset in datasets.items():
        own = own_dataset(dataset)
        load = getattr(own, "load_state_dict", None)
        if id(own) in loaded or not callable(load):
            continue
        try:
            load(state)
        except Exception as exc:
            raise DataError(
                f"{where}: the {split} dataset's load_state_dict() raised {_described(exc)} "
                "on the state its train dataset saved"
            ) from exc
        loaded.add(id(own))
    if not loaded:
        warnings.warn(
            f"{where}: the checkpoint holds the train dataset's state_dict(), but these "
            "datasets have no load_state_dict(): they keep what they fitted themselves",
            HpcdlWarning,
            stacklevel=2,
        )


def _described(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
