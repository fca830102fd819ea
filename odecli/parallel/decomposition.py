"""Block decomposition of a 2-D (ny, nx) grid over a row-major process grid.

Pure arithmetic, no communication: every rank can compute every other rank's block,
which is what lets gathers and halo checks agree without extra messages.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Decomposition:
    """The block ``[y0:y1, x0:x1]`` owned by ``rank`` and its four face neighbours (None = boundary)."""

    global_shape: tuple[int, int]
    proc_grid: tuple[int, int]
    rank: int
    coords: tuple[int, int]
    y0: int
    y1: int
    x0: int
    x1: int
    north: int | None
    south: int | None
    west: int | None
    east: int | None

    @property
    def local_shape(self) -> tuple[int, int]:
        return (self.y1 - self.y0, self.x1 - self.x0)

    @property
    def nranks(self) -> int:
        return self.proc_grid[0] * self.proc_grid[1]

    @property
    def min_local_shape(self) -> tuple[int, int]:
        """Smallest block extent on any rank, so all ranks can reject a too-wide halo together."""
        return (self.global_shape[0] // self.proc_grid[0], self.global_shape[1] // self.proc_grid[1])


def _split(n: int, parts: int, index: int) -> tuple[int, int]:
    """[start, stop) of part ``index`` when n cells are split into sizes differing by at most 1."""
    base, extra = divmod(n, parts)
    start = index * base + min(index, extra)
    return start, start + base + (1 if index < extra else 0)


def _check_shape(global_shape: tuple[int, int]) -> tuple[int, int]:
    if len(global_shape) != 2 or any(int(n) != n or n < 1 for n in global_shape):
        raise ValueError(f"global_shape must be two positive integers (ny, nx), got {global_shape!r}")
    return (int(global_shape[0]), int(global_shape[1]))


def choose_proc_grid(global_shape: tuple[int, int], nranks: int, min_block: int = 1) -> tuple[int, int]:
    """Factor ``nranks`` into (py, px) giving near-square blocks, i.e. the least halo per rank.

    Minimises ny/py + nx/px (half a block's perimeter); ties go to more rows of ranks, whose
    north/south messages are contiguous in row-major memory.
    """
    ny, nx = _check_shape(global_shape)
    if nranks < 1:
        raise ValueError(f"nranks must be >= 1, got {nranks}")
    grids = [
        (py, nranks // py)
        for py in range(1, nranks + 1)
        if nranks % py == 0 and ny // py >= min_block and nx // (nranks // py) >= min_block
    ]
    if not grids:
        raise ValueError(
            f"cannot split a {ny}x{nx} grid over {nranks} ranks with blocks of at least "
            f"{min_block} cell(s) per side; use fewer ranks or a larger grid"
        )
    return min(grids, key=lambda g: (ny / g[0] + nx / g[1], -g[0]))


def decompose(
    global_shape: tuple[int, int],
    nranks: int,
    rank: int,
    proc_grid: tuple[int, int] | None = None,
    min_block: int = 1,
) -> Decomposition:
    """This rank's block; ``proc_grid`` defaults to :func:`choose_proc_grid`."""
    ny, nx = _check_shape(global_shape)
    if nranks < 1:
        raise ValueError(f"nranks must be >= 1, got {nranks}")
    if not 0 <= rank < nranks:
        raise ValueError(f"rank {rank} is outside 0..{nranks - 1}")
    if proc_grid is None:
        proc_grid = choose_proc_grid((ny, nx), nranks, min_block)
    py, px = proc_grid
    if py < 1 or px < 1 or py * px != nranks:
        raise ValueError(f"proc_grid {tuple(proc_grid)} has {py * px} ranks, but nranks is {nranks}")
    if ny // py < min_block or nx // px < min_block:
        raise ValueError(
            f"proc_grid {py}x{px} splits the {ny}x{nx} grid into blocks as small as "
            f"{ny // py}x{nx // px}, below min_block={min_block}"
        )
    iy, ix = divmod(rank, px)
    y0, y1 = _split(ny, py, iy)
    x0, x1 = _split(nx, px, ix)
    return Decomposition(
        global_shape=(ny, nx),
        proc_grid=(py, px),
        rank=rank,
        coords=(iy, ix),
        y0=y0,
        y1=y1,
        x0=x0,
        x1=x1,
        north=rank - px if iy > 0 else None,
        south=rank + px if iy < py - 1 else None,
        west=rank - 1 if ix > 0 else None,
        east=rank + 1 if ix < px - 1 else None,
    )
