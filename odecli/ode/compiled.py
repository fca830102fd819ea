"""torch.compile'd copies of the solver's fused step, compiled only once they pay for themselves.

Compiling a fused step takes 7-23 s on a 2-core CPU (dynamo's trace, AOTAutograd, inductor's
C++), longer than most solves take eagerly. So ``compile=True`` is a rent-or-buy rule: the
solve steps eagerly - the same code, so the same steps, to round-off - and compiles once the
eager step of a right-hand side has cost :data:`COMPILE_AFTER_EAGER_S`, about what a compile
costs (in one solve or summed over several), then runs compiled for the rest of that solve and
every later solve of that right-hand side in the process. As with renting until the rent
would have bought the thing, the total stays within about twice the better of "eager
throughout" and "compile first", and a short solve runs exactly as eagerly.
``compile="wait"`` compiles before the first step instead: every step compiled, so every run
is the same code.

(Compiling on a background thread while the solve steps eagerly was tried: every eager torch op
gives up the GIL and must win it back from the tracing thread, so the solve ran 2-7x slower
during the build. A loop of solves came out even with eager, but a single 7.7 s solve took
17.9 s and ended before its build did, on the 2-core CPU above.)
"""

from __future__ import annotations

import contextlib
import functools
import time
import types
import warnings
from typing import Any, Callable

import torch

COMPILE_MODES = (False, True, "wait")
"""``solve``'s ``compile``: eager, compiled once the eager time pays for it, compiled from the start."""

COMPILE_AFTER_EAGER_S = 10.0
"""Eager seconds in one fused step (per right-hand side) after which ``compile=True`` compiles it:
about one compile with warm caches (7 s measured) and half a cold one (18-23 s)."""


class FusedStep:
    """One fused function (the eager reference) and its compiled copy, for one right-hand side."""

    def __init__(self, fn: Callable):
        self.eager = fn
        self.compiled: Callable | None = None  # made on first need: importing dynamo alone takes ~1 s
        self.state = "idle"  # idle -> ready | failed
        self.eager_seconds = 0.0

    @property
    def ready(self) -> bool:
        return self.state == "ready"

    def due(self) -> bool:
        """Whether the eager step has cost enough that compiling it now pays."""
        return self.state == "idle" and self.eager_seconds >= COMPILE_AFTER_EAGER_S

    def __call__(self, *args: Any) -> Any:
        """``compile=True``: compiled when ready (or due, compiling first), eager otherwise."""
        if self.due():
            try:
                return self.wait(*args)
            except Exception as exc:  # a compiler failure leaves the eager step in charge
                self.state = "failed"
                warnings.warn(f"torch.compile of the solver step failed, solving eagerly: {exc!r}",
                              RuntimeWarning, stacklevel=2)
        if self.ready:
            with _eager_on_recompile():
                return self.compiled(*args)
        started = time.perf_counter()
        out = self.eager(*args)
        self.eager_seconds += time.perf_counter() - started
        return out

    def wait(self, *args: Any) -> Any:
        """``compile="wait"``: the compiled copy, compiling first if these inputs need it."""
        self.compiled = self.compiled or _compile(self.eager)
        out = self.compiled(*args)
        self.state = "ready"
        return out


@functools.lru_cache(maxsize=16)
def fused_step(f: Callable, fn: Callable) -> FusedStep:
    """The :class:`FusedStep` of ``fn`` for right-hand side ``f``, shared by every solve of ``f``."""
    return FusedStep(fn)


def _eager_on_recompile() -> contextlib.AbstractContextManager:
    """Inputs a compiled copy was not traced for (a size-1 batch after compaction, another dtype)
    run eagerly rather than stall the solve for a recompile (torch >= 2.6; before, it recompiles)."""
    set_stance = getattr(torch.compiler, "set_stance", None)
    return set_stance("eager_on_recompile") if set_stance else contextlib.nullcontext()


def _compile(fn: Callable) -> Callable:
    """A compiled copy of ``fn`` with code of its own (dynamic batch size).

    Dynamo keeps compiled graphs on the code object and relies on guards to tell callers apart;
    a private copy of the code per right-hand side keeps one's graph from ever serving another.
    Values such as the controller's safety factor are constants of the graph, and torch 2.13's
    AOTAutograd cache can hand back a graph compiled for other constants, so it stays off.
    """
    import torch._functorch.config as functorch_config

    functorch_config.enable_autograd_cache = False
    # One graph per dtype/device plus specialisations of small batch sizes; dynamo's default of
    # 8 recompiles would silently fall back to eager in a long session.
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
    private = types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__)
    # Python numbers (tableau weights, chunk length, max_steps) become guarded constants: as
    # dynamic inputs they cost a conversion per call and a restarted trace.
    specialized = torch._dynamo.config.patch(specialize_float=True, specialize_int=True)
    return specialized(torch.compile(private, dynamic=True))
