"""An acoustic propagator from a spec's settings: the Cerjan sponge, the steps between halo
exchanges, the time segments (fewer where the fused gradient's store fits in memory), and
whether every rank runs the fused C kernels.  Collective: every rank builds at once."""

from __future__ import annotations

import math

import torch

from odecli.pde.acoustic import cuda_loop
from odecli.pde.acoustic.cuda_build import STEPS_PER_LAUNCH
from odecli.pde.acoustic.kernels import STEPS_PER_PASS, native_available
from odecli.pde.acoustic.propagator import HALO, AcousticPropagator, max_exchange_every
from odecli.pde.grid import Block, Grid
from odecli.pde.propagator import Setup, SetupError
from odecli.pde.segments import default_segment_count

# at 256^2 per rank 8 beat 4 by ~10 % and 16 was no better; at 2000^2 on 2 ranks (1000-row
# blocks) 16 took 3-5 % less than 8 for forward + gradient
MAX_EXCHANGE_EVERY = 16


def auto_exchange_every(decomp) -> int:
    """Steps between halo exchanges on the fused path: one more step per 32 cells of the smallest
    block, up to 16, so the redundant band (2 cells per extra step) stays under 1/16 of a block;
    above one pass (STEPS_PER_PASS) only whole passes, since a short pass after the full ones
    costs more than it saves (9 steps ran 4-7 % slower than 8 at 256^2 per rank)."""
    if decomp.nranks == 1:
        return 1
    k = max(1, min(MAX_EXCHANGE_EVERY, 1 + min(decomp.min_local_shape) // 32))
    return k if k <= STEPS_PER_PASS else k // STEPS_PER_PASS * STEPS_PER_PASS


def sponge_profile(grid: Grid, block: Block, width: int, alpha: float | None, free_surface: bool,
                   dtype, device) -> torch.Tensor | None:
    """Cerjan damping factors for the block's nodes (1 in the interior); None if width == 0."""
    if width <= 0:
        return None
    if alpha is None:
        alpha = math.sqrt(math.log(1.0 / 0.92)) / width  # G = 0.92 at the outermost node
    iy, ix = block.indices(device)
    dist = torch.minimum(ix, grid.nx - 1 - ix)
    dy = grid.ny - 1 - iy if free_surface else torch.minimum(iy, grid.ny - 1 - iy)
    dist = torch.minimum(dist, dy)
    d = (width - dist).clamp(min=0).to(dtype)
    return torch.exp(-((alpha * d) ** 2))


def fused_auto_segments(nt: int, field_bytes: int, budget_bytes: float) -> int:
    """Fewest time segments whose fused-gradient store fits ``budget_bytes``.

    Fewer segments mean less recomputation; one segment keeps every step's ``lap4(u)`` (a field
    without its ring), and ``round(sqrt(nt))`` (the fewest fields, about ``3 sqrt(nt)``) is the
    fallback.
    """
    sqrt_nt = max(1, round(math.sqrt(nt)))
    for s in range(1, sqrt_nt):
        fields = math.ceil(nt / s) + 2 * (s - 1)  # the longest segment's store + starts
        if fields * field_bytes <= budget_bytes:
            return s
    return sqrt_nt


def available_memory_bytes() -> float | None:
    """MemAvailable from /proc/meminfo (Linux), or None where it cannot be read."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return float(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _everywhere(comm, flag: bool) -> bool:
    """Whether ``flag`` holds on every rank (the same answer on all)."""
    if comm.size == 1:
        return flag
    return comm.allreduce_scalar(1.0 if flag else 0.0, op="min") > 0


def auto_segments(setup: Setup, fused: bool, gpu: bool = False) -> int:
    """``round(sqrt(nt))`` checkpoint segments, or fewer for the fused acoustic gradient
    when its store fits a quarter of the available memory shared by the ranks (less
    recomputation).  Every rank must recompute the same segments: the choice is agreed."""
    comm, nt = setup.comm, setup.nt
    sqrt_nt = default_segment_count(nt)
    if not fused and not gpu:
        return sqrt_nt
    # the CUDA kernels' store lives in the GPU's memory (cuda_loop)
    on_gpu = gpu and setup.device.type == "cuda"
    avail = torch.cuda.mem_get_info(setup.device)[0] if on_gpu else available_memory_bytes()
    # the ranks sharing the memory: all of them on the host; on GPUs those on one card
    # (rank r on cuda:r % count)
    sharing = -(-comm.size // torch.cuda.device_count()) if on_gpu else comm.size
    budget = 0.0 if avail is None else avail / (4 * sharing)
    if comm.size > 1:
        budget = comm.allreduce_scalar(budget, op="min")
    shots = setup.geometry.nshots
    itemsize = torch.zeros(0, dtype=setup.dtype).element_size()
    block = setup.block
    field = shots * (block.shape[0] + 2 * HALO) * (block.shape[1] + 2 * HALO) * itemsize
    segs = fused_auto_segments(nt, field, budget)
    return int(comm.allreduce_scalar(segs, op="max")) if comm.size > 1 else segs


def exchange_every(requested: int | str, decomp, ranks: int, gpu: bool = False) -> int:
    """``parallel.exchange_every``: ``auto`` (:func:`auto_exchange_every`), or the count asked
    for if the blocks are deep enough for it (:class:`SetupError` if not).  On the CUDA kernels
    at most the blocked kernel's steps a launch (an exchange after each launch), ``auto`` as
    many as the blocks allow."""
    most = max_exchange_every(decomp)
    if gpu:
        limit = min(STEPS_PER_LAUNCH, most)
        return limit if requested == "auto" else min(limit, exchange_every(requested, decomp, ranks))
    if requested == "auto":
        return auto_exchange_every(decomp)
    if requested > most and ranks > 1:
        raise SetupError("parallel.exchange_every",
                         f"{requested} needs blocks of at least {HALO * requested} cells "
                         f"per side; the smallest block on {ranks} ranks is "
                         f"{decomp.min_local_shape[0]}x{decomp.min_local_shape[1]} "
                         f"(use at most {most})")
    return requested


def build(setup: Setup) -> AcousticPropagator:
    """The acoustic propagator for one rank: the fused C kernels if every rank can run them
    (all ranks must take the same path: they exchange halos in the same pattern)."""
    s = setup
    like = torch.zeros(0, dtype=s.dtype, device=s.device)
    fused = _everywhere(s.comm, native_available(like)[0])
    # every rank on its GPU's kernels, or none (a rank without them would miss the exchanges)
    gpu = _everywhere(s.comm, cuda_loop.launcher_for(like, s.comm)[0] is not None)
    segments = s.time_segments
    if segments == "auto":
        segments = auto_segments(s, fused, gpu)
    b = s.boundary
    sponge = sponge_profile(s.grid, s.block, b["absorbing_width"], b["absorbing_strength"],
                            b["free_surface"], s.dtype, s.device)
    return AcousticPropagator(s.grid, s.block, s.decomp, s.comm, s.dt, s.nt, s.local, sponge,
                              segments, s.timer, fused=None if gpu else fused, threads=s.threads,
                              exchange_every=exchange_every(s.exchange_every, s.decomp,
                                                            s.comm.size, gpu),
                              geometry=s.geometry, device=s.device)
