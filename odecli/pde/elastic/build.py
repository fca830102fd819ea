"""An elastic propagator from a :class:`~odecli.pde.propagator.Setup`: the source kind and the
receivers' components checked, the CPML's width and frequency, the free surface, the time
segments.  The boundary keys are acoustic's (``absorbing_width``: the CPML's width in cells;
``free_surface``), plus an optional ``pml_speed`` (m/s; default: the first model's largest vp).
``absorbing_strength`` (the Cerjan sponge's) does not apply to the CPML and is ignored."""

from __future__ import annotations

from odecli.pde.elastic.equation import RECEIVER_COMPONENTS, SOURCE_TYPES
from odecli.pde.elastic.pml import dominant_frequency
from odecli.pde.elastic.propagator import HALO, ElasticPropagator
from odecli.pde.propagator import Setup, SetupError
from odecli.pde.segments import default_segment_count


def build(setup: Setup) -> ElasticPropagator:
    """The elastic propagator for one rank (every rank checks the same things and raises alike)."""
    s = setup
    if s.source_type not in SOURCE_TYPES:
        raise SetupError("sources.type", f"unknown elastic source type {s.source_type!r} "
                                         f"(one of {', '.join(SOURCE_TYPES)})")
    comps = s.receiver_components
    if comps is None:
        comps = ["vy"] * s.geometry.nrec
    if len(comps) != s.geometry.nrec:
        raise SetupError("receivers", f"{len(comps)} receiver components for "
                                      f"{s.geometry.nrec} receivers")
    for c in comps:
        if c not in RECEIVER_COMPONENTS:
            raise SetupError("receivers.component", f"unknown component {c!r} "
                                                    f"(one of {', '.join(RECEIVER_COMPONENTS)})")
    if min(s.decomp.min_local_shape) < HALO:
        raise SetupError("parallel.proc_grid", f"blocks need at least {HALO} cells per side")
    b = s.boundary
    segments = s.time_segments
    if segments == "auto":
        segments = default_segment_count(s.nt)
    return ElasticPropagator(
        s.grid, s.block, s.decomp, s.comm, s.dt, s.nt, s.local, s.source_type, list(comps),
        bool(b.get("free_surface", False)), int(b.get("absorbing_width", 0) or 0),
        dominant_frequency(s.geometry.wavelet, s.dt), segments, b.get("pml_speed"), s.timer,
        s.dtype, s.device, threads=s.threads)
