"""Arrays stored in files that a PDE spec names (``type: file`` models, wavelet files, observed
data): read and checked here, so that the numerics in ``odecli.pde`` receive arrays and never open
a file. Every failure is a :class:`~odecli.errors.SpecError` naming the spec field: a path that
is not a regular file (a FIFO would block for ever, ``/dev/zero`` never end), an HDF5 group,
a dangling or external link, strings, and values that are not finite are refused, not read."""

from __future__ import annotations

import copy
import os
import stat
from pathlib import Path

import numpy as np

from odecli.errors import SpecError


def read_array(path: Path, dataset: str, *, file: str, field: str) -> np.ndarray:
    """A ``.npy`` file, or dataset ``dataset`` of an HDF5 file, as finite float64 values."""
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        raise SpecError(file, field, f"cannot read {path}: {exc.strerror or exc}") from None
    if not stat.S_ISREG(mode):
        raise SpecError(file, field, f"{path} is not a regular file (a pipe, a device or a folder cannot be read)")
    try:
        if path.suffix == ".npy":
            arr = np.load(path, allow_pickle=False)
        else:
            arr = _read_h5_dataset(path, dataset, file, field)
    except SpecError:
        raise
    except (OSError, ValueError, EOFError) as exc:
        raise SpecError(file, field, f"cannot read {path}: {' '.join(str(exc).split())}") from None
    if not (np.issubdtype(arr.dtype, np.number) or arr.dtype == bool) or np.iscomplexobj(arr):
        raise SpecError(file, field, f"{path}: expected real numbers, got values of type {arr.dtype}")
    arr = np.asarray(arr, dtype=np.float64)
    if not np.all(np.isfinite(arr)):
        raise SpecError(file, field, f"{path}: holds NaN or infinite values")
    return arr


def _read_h5_dataset(path: Path, dataset: str, file: str, field: str) -> np.ndarray:
    import h5py

    with h5py.File(path, "r") as f:
        link = f.get(dataset, getlink=True)
        if link is None:
            raise SpecError(file, field, f"{path} has no dataset {dataset!r}")
        if isinstance(link, h5py.ExternalLink):
            raise SpecError(file, field, f"{path}: {dataset!r} is a link into another file; store the data itself")
        node = f.get(dataset)
        if node is None:
            raise SpecError(file, field, f"{path}: {dataset!r} is a link to {link.path!r}, which does not exist")
        if not isinstance(node, h5py.Dataset):
            raise SpecError(file, field, f"{path}: {dataset!r} is a group, expected a dataset")
        return node[()]


def read_model_array(path: Path, dataset: str = "model", *, file: str = "", field: str = "model") -> np.ndarray:
    """A model field from a ``.npy`` file, or dataset ``dataset`` of an HDF5 file, as float64."""
    return read_array(path, dataset, file=file or str(path), field=field)


def read_wavelet(path: Path, *, file: str, field: str = "sources.wavelet.path") -> np.ndarray:
    """A wavelet file: one non-empty row of samples (a ``(1, n)`` or ``(n, 1)`` array is one row)."""
    arr = read_array(path, "wavelet", file=file, field=field)
    if arr.ndim != 1 and sum(n > 1 for n in arr.shape) > 1:
        raise SpecError(file, field, f"{path}: expected one row of samples, got an array of shape {arr.shape}")
    if arr.size == 0:
        raise SpecError(file, field, f"{path}: the wavelet has no samples")
    return arr.ravel()


def with_model_arrays(model: dict | None, base_dir: Path | None, *, file: str = "", field: str = "model") -> dict | None:
    """A copy of ``model`` in which every file model (also under ``smoothed``'s ``of``) carries
    its data as ``array``; the path stays for messages."""
    if model is None:
        return None
    model = copy.copy(model)
    if model.get("type") == "file":
        path = Path(model["path"])
        if base_dir is not None and not path.is_absolute():
            path = base_dir / path
        model["array"] = read_model_array(path, model.get("dataset", "model"), file=file, field=f"{field}.path")
        model["path"] = str(path)
    elif model.get("type") == "smoothed":
        model["of"] = with_model_arrays(model["of"], base_dir, file=file, field=f"{field}.of")
    return model
