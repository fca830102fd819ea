"""Reading run files: opening one, checking it is a complete odecli run, and any array layout.

Kept free of torch so readers start fast. Every reader (``stats``, ``plot``, ``export``) opens
run files with :func:`open_run` and states what it reads through :func:`require`, so a foreign or
damaged file is one clean :class:`InputError` naming the file and the missing or misshapen piece,
in one place, instead of a ``KeyError`` or a numpy error from deep inside a reader.

What a dataset's axes and type must be is a :class:`Layout` per kind of run, kept beside the
writer of that kind (:data:`odecli.io.ode_run.ODE_LAYOUT`, ``ODE_INVERSE_LAYOUT``,
:data:`odecli.io.pde_run.PDE_INVERSE_LAYOUT`); :func:`layout_of` finds it.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Optional, Sequence, Union

import h5py
import numpy as np

from odecli.errors import InputError
from odecli.io.bounded import check_readable

RUN_KINDS = ("ode", "ode-inverse", "pde-inverse")
CHECKPOINT_SUFFIX = ".ckpt.h5"
# where each kind's Layout is kept: beside its writer (imported only when a file of that kind is read)
LAYOUT_HOMES = {"ode": ("odecli.io.ode_run", "ODE_LAYOUT"), "ode-inverse": ("odecli.io.ode_run", "ODE_INVERSE_LAYOUT"),
                "pde-inverse": ("odecli.io.pde_run", "PDE_INVERSE_LAYOUT")}
NUMERIC_KINDS = "iuf"  # numpy dtype kinds the readers compute with: signed, unsigned, float
DTYPE_NAMES = {"O": "objects", "b": "booleans", "c": "complex numbers", "V": "records"}

Axis = Union[str, int]
"""One axis of a dataset: a dimension name, whose size must agree wherever it appears, or a fixed size.
A ``*`` in a name stands for the dataset's own name (``fit/*`` has one dimension per unknown)."""
SCALAR: tuple[tuple[Axis, ...], ...] = ((),)  # a single number


@dataclass(frozen=True)
class Layout:
    """The numeric datasets and root attributes of one kind of run file, as readers may find them.

    ``arrays`` maps a dataset's path (``group/*``: each dataset in the group) or a root attribute's
    name as ``@name`` to the axes it may have: the writer's first, then any other layouts the
    readers accept. They are checked in this order, so put the strict ones first: the sizes they
    fix are what later ones must agree with, and what the message quotes. ``nonempty`` names the
    dimensions readers need at least one entry of. Attributes read as text are not listed.
    """

    arrays: Mapping[str, tuple[tuple[Axis, ...], ...]]
    nonempty: frozenset[str] = frozenset()

    def entry(self, path: str) -> str:
        """The entry that covers ``path``: its own, or its group's ``group/*``."""
        if path in self.arrays:
            return path
        group = f"{path.rpartition('/')[0]}/*"
        if group in self.arrays:
            return group
        raise KeyError(f"{path!r} is not in the layout: a reader reads what the layout beside the writer lacks")

    def order(self, path: str) -> int:
        """Where ``path`` comes in the checking order."""
        return list(self.arrays).index(self.entry(path))

    def axes(self, path: str) -> tuple[tuple[Axis, ...], ...]:
        """The layouts ``path`` may have, a ``*`` in a dimension replaced by the dataset's name."""
        name = path.rpartition("/")[2]
        return tuple(tuple(_named(axis, name) for axis in axes) for axes in self.arrays[self.entry(path)])

    def nonempty_in(self, path: str) -> set[str]:
        """The dimensions of ``path`` that must not be empty, a ``*`` replaced by the dataset's name."""
        name = path.rpartition("/")[2]
        return {_named(dim, name) for dim in self.nonempty}


def _named(axis: Axis, name: str) -> Axis:
    return axis.replace("*", name) if isinstance(axis, str) else axis


def layout_of(kind: str) -> Layout:
    """The Layout of run files of ``kind`` (one of RUN_KINDS)."""
    module, name = LAYOUT_HOMES[kind]
    return getattr(importlib.import_module(module), name)


def open_run(path: Path) -> h5py.File:
    """Open a run file read-only; a folder, a missing, foreign or checkpoint file is an input error."""
    path = Path(path)
    if path.is_dir():
        raise InputError(f"{path}: is a folder, expected an odecli run file (.h5)")
    if not path.exists():
        raise InputError(f"{path}: file not found")
    if not path.is_file():
        raise InputError(f"{path}: not a regular file (a pipe, a device or a socket is not a run file)")
    if not os.access(path, os.R_OK):
        raise InputError(f"{path}: cannot read the file (permission denied)")
    check_readable(path)  # a damaged file can loop the HDF5 library forever: walked first, with a deadline
    try:
        handle = h5py.File(path, "r")
    except OSError:
        raise InputError(f"{path}: not an HDF5 file") from None
    try:
        if "kind" not in handle.attrs:
            raise InputError(f"{path}: not an odecli run file (no 'kind' attribute)")
        kind = run_kind(handle)
        if kind.endswith("-checkpoint"):
            raise _checkpoint_error(path, kind)
        if kind not in RUN_KINDS:
            raise InputError(f"{path}: not an odecli run file: unknown kind {kind!r} "
                             f"(expected one of {', '.join(RUN_KINDS)})")
        _refuse_links(handle, path)
    except BaseException:
        handle.close()
        raise
    return handle


def _refuse_links(h5: h5py.File, path: Path) -> None:
    """odecli writes no links: a soft link (dangling or not) or a link into another file in a run
    file was put there afterwards, and reading through it fails or reads another file's data."""
    found: list[str] = []

    def visit(name: str, link: object) -> None:
        if not found and isinstance(link, (h5py.SoftLink, h5py.ExternalLink)):
            found.append(f"{name}: is a {'link into another file' if isinstance(link, h5py.ExternalLink) else 'soft link'}")

    h5.visititems_links(visit)
    if found:
        raise InputError(f"{path}: {found[0]}, not data; odecli writes none, so the file was changed after it "
                         "was written")


def _checkpoint_error(path: Path, kind: str) -> InputError:
    """train-inverse's ``OUT.ckpt.h5`` holds optimiser state, not results: say how to use it instead."""
    name = path.name
    output = path.with_name(name[: -len(CHECKPOINT_SUFFIX)] + ".h5") if name.endswith(CHECKPOINT_SUFFIX) else "OUT.h5"
    return InputError(f"{path}: is a checkpoint of an unfinished train-inverse (kind {kind!r}), not a run file; "
                      f"finish the fit with: odecli train-inverse SPEC -o {output} --resume")


def run_kind(h5: h5py.File) -> str:
    """The ``kind`` attribute as text (other programs may store it as fixed-length bytes)."""
    kind = h5.attrs.get("kind", "")
    return kind.decode("utf-8", "replace") if isinstance(kind, bytes) else str(kind)


def require(h5: h5py.File, *paths: str, optional: Sequence[str] = (), attrs: tuple[str, ...] = ()) -> None:
    """Fail with one line unless ``h5`` holds ``paths`` and ``attrs``, and they and the ``optional``
    paths present have the axes and type the file's :class:`Layout` allows.

    ``paths`` are datasets, or groups when they end in ``/`` (then every dataset in them is checked);
    a missing group is named once, not once per dataset inside it; every missing piece is named at
    once. ``optional`` may name root attributes as ``@name``; of ``attrs``, those the layout lists
    (the numeric ones) are checked. Readers call this with all they read before reading, so the
    file's damage is reported as such instead of surfacing as a ``KeyError`` from h5py or a
    ``ValueError`` from numpy.
    """
    missing: list[str] = []
    wrong: list[str] = []
    for path in paths:
        want_group = path.endswith("/")
        parts = path.strip("/").split("/")
        for depth in range(1, len(parts) + 1):
            prefix = "/".join(parts[:depth])
            node = h5.get(prefix)
            group_wanted = want_group or depth < len(parts)
            if node is None:
                if prefix not in missing:
                    missing.append(prefix)
                break
            if group_wanted != isinstance(node, h5py.Group):
                problem = _not_a(prefix, group_wanted)
                if problem not in wrong:
                    wrong.append(problem)
                break
    absent = [name for name in attrs if name not in h5.attrs]
    problems = [f"missing {', '.join(map(repr, missing))}"] if missing else []
    if absent:
        problems.append(f"missing attribute{'s' if len(absent) > 1 else ''} {', '.join(map(repr, absent))}")
    problems += wrong
    if problems:
        raise _incomplete(h5, problems)
    _check_layout(h5, [*paths, *optional], attrs)


def _not_a(path: str, group: bool) -> str:
    return f"{path!r} is not a {'group' if group else 'dataset'}"


def _incomplete(h5: h5py.File, problems: list[str]) -> InputError:
    return InputError(f"{h5.filename}: not a complete odecli run file: {'; '.join(problems)} "
                      f"(written by another program, or damaged)")


def _check_layout(h5: h5py.File, paths: Sequence[str], attrs: Sequence[str]) -> None:
    """Check what ``paths`` and ``attrs`` name, in the Layout's order, each against the sizes the earlier ones fixed."""
    layout = layout_of(run_kind(h5))
    for group in (path for path in paths if path.endswith("/")):
        layout.entry(f"{group}*")  # a group is read whole: the layout must cover any member, in any file
    numeric = [f"@{name}" for name in attrs if f"@{name}" in layout.arrays]
    sizes: dict[str, tuple[int, str]] = {}  # dimension -> (size, the dataset that fixed it)
    for path in sorted(_present(h5, [*paths, *numeric]), key=layout.order):
        what, array = _described(h5, path)
        problem = _check_array(path, array, layout.axes(path), sizes, layout.nonempty_in(path))
        if problem:
            raise InputError(f"{h5.filename}: {what} {problem}")


def _described(h5: h5py.File, path: str) -> tuple[str, Union[h5py.Dataset, h5py.h5a.AttrID]]:
    """("dataset 'y'", the dataset) or, for '@name', ("attribute 'name'", its id): dtype and shape, no data read."""
    if path.startswith("@"):
        return f"attribute {path[1:]!r}", h5.attrs.get_id(path[1:])
    return f"dataset {path!r}", h5[path]


def _present(h5: h5py.File, paths: Sequence[str]) -> list[str]:
    """The datasets and attributes present that ``paths`` name (a group: its members), once each, in the order named."""
    found: list[str] = []
    for path in paths:
        if path.startswith("@"):
            found += [path] if path[1:] in h5.attrs else []
            continue
        node = h5.get(path.rstrip("/"))
        if node is None:
            continue
        if isinstance(node, h5py.Group) != path.endswith("/"):
            raise _incomplete(h5, [_not_a(path.rstrip("/"), path.endswith("/"))])
        members = [f"{path}{name}" for name in node] if path.endswith("/") else [path]
        for member in members:
            if not isinstance(h5[member], h5py.Dataset):
                raise _incomplete(h5, [_not_a(member, False)])
        found += [member for member in members if member not in found]
    return found


def _check_array(path: str, array: Union[h5py.Dataset, h5py.h5a.AttrID], layouts: tuple[tuple[Axis, ...], ...],
                 sizes: dict[str, tuple[int, str]], nonempty: set[str]) -> Optional[str]:
    """What is wrong with the dataset or attribute ``array`` (None: nothing); the sizes it fixes go into ``sizes``."""
    if array.dtype.kind not in NUMERIC_KINDS:
        return f"has dtype {_dtype_text(array.dtype)}, expected integers or floats"
    for axes in layouts:
        fixed = _fit(axes, array.shape, sizes, nonempty)
        if fixed is not None:
            sizes.update((dim, (size, path)) for dim, size in fixed.items())
            return None
    found = f"shape {array.shape}" if array.shape is not None else "no shape (an empty HDF5 dataspace)"
    expected = " or ".join(_axes_text(axes) for axes in layouts)
    return f"has {found}, expected {expected}{_conditions(layouts, sizes, nonempty)}"


def _dtype_text(dtype: np.dtype) -> str:
    """'|S3 (strings)': the dtype, and in words what it holds when that is not obvious from it."""
    kind = "strings" if h5py.check_string_dtype(dtype) else DTYPE_NAMES.get(dtype.kind)
    return f"{dtype.str} ({kind})" if kind else str(dtype)


def _fit(axes: tuple[Axis, ...], shape: Optional[tuple[int, ...]], sizes: Mapping[str, tuple[int, str]],
         nonempty: set[str]) -> Optional[dict[str, int]]:
    """The sizes ``shape`` gives the not yet fixed dimensions of ``axes``, or None if it does not fit them."""
    if shape is None or len(shape) != len(axes):
        return None
    fixed: dict[str, int] = {}
    for axis, size in zip(axes, shape):
        want = axis if isinstance(axis, int) else sizes[axis][0] if axis in sizes else fixed.get(axis)
        if (want is not None and size != want) or (axis in nonempty and size == 0):
            return None
        if isinstance(axis, str) and axis not in sizes:
            fixed[axis] = size
    return fixed


def _axes_text(axes: tuple[Axis, ...]) -> str:
    """'(sample, time)', '(sample,)' like the shapes they are compared with; () as 'a scalar'."""
    return f"({', '.join(map(str, axes))}{',' if len(axes) == 1 else ''})" if axes else "a scalar"


def _conditions(layouts: tuple[tuple[Axis, ...], ...], sizes: Mapping[str, tuple[int, str]], nonempty: set[str]) -> str:
    """' with sample = 3 (from 'status'), ...': sizes other datasets fixed, dimensions that must not be empty."""
    dims = dict.fromkeys(axis for axes in layouts for axis in axes if isinstance(axis, str))
    by_source: dict[str, list[str]] = {}
    for dim in dims:
        if dim in sizes:
            size, source = sizes[dim]
            by_source.setdefault(source, []).append(f"{dim} = {size}")
    parts = [f"{', '.join(fixed)} (from {source!r})" for source, fixed in by_source.items()]
    parts += [f"{dim} >= 1" for dim in dims if dim in nonempty and dim not in sizes]
    return f" with {', '.join(parts)}" if parts else ""


def numbers(h5: h5py.File, path: str) -> np.ndarray:
    """Dataset ``path`` read as floats; a group, strings or records in its place is one line
    (readers of optional pieces that no :func:`require` covered met ValueError, issue 42)."""
    node = h5.get(path)
    if not isinstance(node, h5py.Dataset) or node.dtype.kind not in "biuf":
        got = "missing" if node is None else (f"dtype {node.dtype}" if isinstance(node, h5py.Dataset) else "a group")
        raise InputError(f"{h5.filename}: dataset {path!r} must hold numbers, got {got} (written by another "
                         "program, or damaged)")
    return np.asarray(node[...], dtype=float)


def scalar_attr(h5: h5py.File, node: Union[h5py.Group, h5py.Dataset], name: str, default, *,
                kinds: str, expected: str):
    """Attribute ``name`` of ``node`` as one value of a dtype kind in ``kinds`` (``default`` where
    absent); an array, a string or a record there is one line saying it must be ``expected``."""
    if name not in node.attrs:
        return default
    value = np.asarray(node.attrs[name])
    if value.shape != () or value.dtype.kind not in kinds:
        where = "" if node.name == "/" else f" of {node.name!r}"
        raise InputError(f"{h5.filename}: attribute {name!r}{where} must be {expected}, got {value.dtype} of "
                         f"shape {value.shape} (written by another program, or damaged)")
    return value


def state_names(h5: h5py.File, n_states: int) -> list[str]:
    """The ``states`` attribute as names (``y0, y1, ...`` where it does not hold ``n_states``);
    names that are not UTF-8 text (a damaged file) are an input error, not a crash in a writer."""
    names = []
    for raw in np.atleast_1d(h5.attrs.get("states", [])):
        try:
            name = raw.decode("utf-8") if isinstance(raw, bytes) else str(raw)
            name.encode("utf-8")
        except UnicodeError:
            raise InputError(f"{h5.filename}: @states: the state names are not UTF-8 text") from None
        names.append(name)
    return names if len(names) == n_states else [f"y{i}" for i in range(n_states)]


def as_batched(t: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """t to (batch, time), y to (batch, time, state), from any layout a run file may hold."""
    if y.ndim == 1:
        y = y[None, :, None]
    elif y.ndim == 2:
        y = y[None]
    if t.ndim == 1:
        t = np.broadcast_to(t, y.shape[:2])
    return t, y
