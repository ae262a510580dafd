"""Data: sources -> stratified splits -> preprocessing -> per-rank batches.

build_data(cfg) -> DataSplits             (tensors on the CPU, preprocessed)
EpochSharder + iterate_batches            (the training loop's batches, per rank)
load_feature_rows(path, input_shape, ...)  (raw rows for `hpcdl predict`, by name or position)
"""

from hpcdl.data.build import DataSplits, build_data
from hpcdl.data.files import load_feature_rows
from hpcdl.data.loader import iterate_batches
from hpcdl.data.preprocessing import Preprocessing
from hpcdl.data.sharding import EpochSharder

__all__ = [
    "DataSplits",
    "EpochSharder",
    "Preprocessing",
    "build_data",
    "iterate_batches",
    "load_feature_rows",
]
