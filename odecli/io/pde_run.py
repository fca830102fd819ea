"""The pde-inverse result file (HDF5, written atomically by rank 0).

Contract (other tools rely on these names): datasets ``history/loss``, ``history/grad_norm``,
``history/wall_time_s`` (one entry per iteration), ``fields/true``, ``fields/initial``,
``fields/final`` (global grid, physical units), ``data/observed``, ``data/predicted``
(shots x receivers x steps; a steady equation's: experiments x sensors x 1, its one 'step' the steady
state at ``data/time`` = [0], so every reader of traces reads it, with the attribute ``steady`` = 1);
root attributes ``kind`` = "pde-inverse", ``spec``, ``ranks``,
``decomposition``, ``odecli_version``.  Also ``engine`` (what ran the time loop), ``history/misfit``, ``history/regularization``,
``history/model_error``, ``timing/{total_s,comm_s,compute_s}`` (one entry per rank),
``geometry/{sources,receivers}`` (node indices), ``data/time``, ``unknown/*``.
An equation with several parameters (elastic2d) writes ``fields/{true,initial,final}_NAME`` for
each (``true_`` for every parameter whose true model is known, the others for the inverted ones),
``history/model_error_NAME`` and the attributes ``parameters`` and ``inverted`` (JSON lists) and
``model_error_final_NAME``; ``model_error`` is then the root mean square of the inverted
parameters' relative errors. Linear solves (a steady equation, an implicit scheme) add
``history/solver_iterations_{mean,max}``; frequency continuation adds ``history/max_frequency`` (each row's
stage: its low-pass cutoff in Hz, inf for the full band).

:data:`PDE_INVERSE_LAYOUT` states these shapes for the readers (``odecli.io.layout.require``):
change it with the writer.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from odecli import __version__
from odecli.io.atomic import atomic_h5
from odecli.io.layout import SCALAR, Layout

TRACES = (("shot", "receiver", "step"), ("shot", "step", "receiver"))  # readers find the time axis by data/time
#: The datasets and numeric attributes of a pde-inverse run as readers may find them; the writer's layouts come first.
PDE_INVERSE_LAYOUT = Layout({
    "history/*": (("iteration",),),
    "timing/*": (("rank",),),
    "fields/*": (("y", "x"),),
    "data/time": (("step",),),
    "data/observed": TRACES,
    "data/predicted": TRACES,
    "geometry/receivers": (("receiver", 2),),
    "geometry/sources": (("source", 3),),
    "@ranks": SCALAR, "@model_error_final": SCALAR, "@grid_spacing": ((2,),),
})


def write_result(path: Path, r: dict, replace: bool = True) -> None:
    """The ``kind: pde-inverse`` run file, written atomically (``replace``: see atomic_path)."""
    with atomic_h5(path, replace) as f:
        f.attrs["kind"] = "pde-inverse"
        f.attrs["spec"] = r["spec_text"]
        f.attrs["ranks"] = int(r["ranks"])
        f.attrs["decomposition"] = json.dumps(r["decomposition"])
        f.attrs["proc_grid"] = np.asarray(r["decomposition"]["proc_grid"], dtype=np.int64)
        f.attrs["odecli_version"] = __version__
        for k in ("equation", "name", "optimizer", "unknown_type", "stop_reason", "engine"):
            f.attrs[k] = str(r[k])
        f.attrs["iterations"] = int(len(r["history"]["loss"]))
        f.attrs["grid_spacing"] = np.asarray(r["spacing"], dtype=np.float64)
        f.attrs["dt"] = float(r["dt"])
        f.attrs["model_error_final"] = float(r["final_model_error"])
        f.attrs["parameters"] = json.dumps(list(r.get("parameters", [])))
        f.attrs["inverted"] = json.dumps(list(r.get("inverted", [])))
        if r.get("receiver_components") is not None:  # elastic2d: what each receiver records
            f.attrs["receiver_components"] = json.dumps(list(r["receiver_components"]))
        for name, v in r.get("final_model_errors", {}).items():
            f.attrs[f"model_error_final_{name}"] = float(v)
        h = f.create_group("history")
        for k, v in r["history"].items():
            h.create_dataset(k, data=np.asarray(v, dtype=np.float64))
        fl = f.create_group("fields")
        for k, v in r["fields"].items():
            if v is not None:
                fl.create_dataset(k, data=np.asarray(v, dtype=np.float64))
        d = f.create_group("data")
        d.create_dataset("observed", data=np.asarray(r["observed"], dtype=np.float64))
        d.create_dataset("predicted", data=np.asarray(r["predicted"], dtype=np.float64))
        d.create_dataset("time", data=np.arange(r["observed"].shape[-1]) * float(r["dt"]))
        f.attrs["steady"] = int(bool(r.get("steady")))
        g = f.create_group("geometry")
        g.create_dataset("receivers", data=np.asarray(r["receivers"], dtype=np.int64).reshape(-1, 2))
        g.create_dataset("sources", data=np.asarray(r["sources"], dtype=np.int64).reshape(-1, 3))
        g.attrs["sources_columns"] = "shot, iy, ix"
        t = f.create_group("timing")
        for k, v in r["timing"].items():
            t.create_dataset(k, data=np.asarray(v, dtype=np.float64))
        u = f.create_group("unknown")
        for name, arr in r["unknown"].items():
            u.create_dataset(name, data=np.asarray(arr, dtype=np.float64))
