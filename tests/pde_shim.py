"""Single-rank stand-in for ``odecli.parallel`` used ONLY while that package is not yet present.

If the real package imports, nothing here is used.  It implements the documented API for one rank,
so the PDE tests can run single-rank during development.
"""

from __future__ import annotations

import sys
import types


def install() -> bool:
    """Install the shim if ``odecli.parallel.ops`` is missing; return True if installed."""
    try:
        import odecli.parallel.ops  # noqa: F401
        import odecli.parallel.comm  # noqa: F401
        import odecli.parallel.decomposition  # noqa: F401

        return False
    except ImportError:
        pass
    import dataclasses

    import torch
    import torch.nn.functional as F

    class Comm:
        rank = 0
        size = 1

        def barrier(self):
            pass

        def abort(self, code=1):
            raise SystemExit(code)

        def allreduce_scalar(self, v, op="sum"):
            return v

        def bcast_object(self, obj, root=0):
            return obj

        def gather_object(self, obj, root=0):
            return [obj]

    def get_comm():
        return Comm()

    @dataclasses.dataclass
    class Decomposition:
        global_shape: tuple
        proc_grid: tuple
        rank: int
        coords: tuple
        y0: int
        y1: int
        x0: int
        x1: int
        north: object = None
        south: object = None
        west: object = None
        east: object = None

        @property
        def local_shape(self):
            return (self.y1 - self.y0, self.x1 - self.x0)

    def choose_proc_grid(global_shape, nranks):
        return (1, 1)

    def decompose(global_shape, nranks, rank, proc_grid=None):
        assert nranks == 1
        ny, nx = global_shape
        return Decomposition(tuple(global_shape), (1, 1), 0, (0, 0), 0, ny, 0, nx)

    def halo_exchange(u, decomp, comm, width, fill=0.0):
        return F.pad(u, (width, width, width, width), value=fill) if u.dim() >= 2 else u

    def allreduce_sum(x, comm):
        return x

    def broadcast(x, comm, root=0):
        return x

    def gather_global(local, decomp, comm, root=0):
        return local.detach().clone()

    def local_block(g, decomp):
        return g[..., decomp.y0:decomp.y1, decomp.x0:decomp.x1]

    mods = {
        "odecli.parallel.comm": dict(Comm=Comm, get_comm=get_comm),
        "odecli.parallel.decomposition": dict(
            Decomposition=Decomposition, decompose=decompose, choose_proc_grid=choose_proc_grid
        ),
        "odecli.parallel.ops": dict(
            halo_exchange=halo_exchange,
            allreduce_sum=allreduce_sum,
            broadcast=broadcast,
            gather_global=gather_global,
            local_block=local_block,
        ),
    }
    import odecli.parallel as pkg

    for name, attrs in mods.items():
        m = types.ModuleType(name)
        m.__dict__.update(attrs)
        sys.modules[name] = m
        setattr(pkg, name.rsplit(".", 1)[1], m)
    return True
