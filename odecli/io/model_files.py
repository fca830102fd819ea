"""Model fields stored in files (``type: file`` in a PDE spec): read here, so that the numerics
in ``odecli.pde.models`` receive arrays and never open a file."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np


def read_model_array(path: Path, dataset: str = "model") -> np.ndarray:
    """A ``.npy`` file, or dataset ``dataset`` of an HDF5 file, as float64."""
    if path.suffix == ".npy":
        arr = np.load(path)
    else:
        import h5py

        with h5py.File(path, "r") as f:
            arr = f[dataset][...]
    return np.asarray(arr, dtype=np.float64)


def with_model_arrays(model: dict | None, base_dir: Path | None) -> dict | None:
    """A copy of ``model`` in which every file model (also under ``smoothed``'s ``of``) carries
    its data as ``array``; the path stays for messages."""
    if model is None:
        return None
    model = copy.copy(model)
    if model.get("type") == "file":
        path = Path(model["path"])
        if base_dir is not None and not path.is_absolute():
            path = base_dir / path
        model["array"] = read_model_array(path, model.get("dataset", "model"))
        model["path"] = str(path)
    elif model.get("type") == "smoothed":
        model["of"] = with_model_arrays(model["of"], base_dir)
    return model
