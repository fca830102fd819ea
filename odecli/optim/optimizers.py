"""Adam and L-BFGS over parameters that are partly distributed (grid blocks) and partly replicated.

Inner products sum the distributed parts with an all-reduce and add the replicated parts once; the
result is broadcast from rank 0 so every rank takes exactly the same decisions.
"""

from __future__ import annotations

import math

import torch


class Space:
    def __init__(self, comm, distributed: list[bool]) -> None:
        self.comm, self.distributed = comm, distributed

    def reduce(self, local_dist: float, replicated: float, op: str = "sum") -> float:
        if self.comm.size > 1:
            local_dist = self.comm.allreduce_scalar(float(local_dist), op=op)
            local_dist = self.comm.bcast_object(local_dist, root=0)
        return (local_dist + replicated) if op == "sum" else max(local_dist, replicated)

    def dot(self, a, b) -> float:
        d = r = 0.0
        for dist, x, y in zip(self.distributed, a, b):
            v = float(torch.sum(x * y))
            if dist:
                d += v
            else:
                r += v
        return self.reduce(d, r)

    def norm(self, a) -> float:
        return math.sqrt(max(self.dot(a, a), 0.0))

    def absmax(self, a) -> float:
        d = r = 0.0
        for dist, x in zip(self.distributed, a):
            v = float(x.abs().max()) if x.numel() else 0.0
            if dist:
                d = max(d, v)
            else:
                r = max(r, v)
        return self.reduce(d, r, op="max")


class Adam:
    kind = "adam"

    def __init__(self, params, lr: float, betas=(0.9, 0.999), eps: float = 1e-8) -> None:
        self.params, self.lr, self.betas, self.eps = params, lr, tuple(betas), eps
        self.m = [torch.zeros_like(p) for p in params]
        self.v = [torch.zeros_like(p) for p in params]
        self.t = 0

    @torch.no_grad()
    def step(self, grads) -> None:
        b1, b2 = self.betas
        self.t += 1
        bc1 = 1.0 - b1**self.t
        bc2 = 1.0 - b2**self.t
        for p, g, m, v in zip(self.params, grads, self.m, self.v):
            m.mul_(b1).add_(g * (1.0 - b1))
            v.mul_(b2).add_((g * g) * (1.0 - b2))
            p.sub_((m / bc1) / (torch.sqrt(v / bc2) + self.eps) * self.lr)

    def state_vectors(self) -> dict:
        return {"m": self.m, "v": self.v}

    def state_scalars(self) -> dict:
        return {"t": self.t}

    def load(self, vectors: dict, scalars: dict) -> None:
        for dst, src in zip(self.m, vectors["m"]):
            dst.copy_(src)
        for dst, src in zip(self.v, vectors["v"]):
            dst.copy_(src)
        self.t = int(scalars["t"])


class LBFGS:
    """L-BFGS with a backtracking (Armijo) line search; ``evaluate()`` is collective."""

    kind = "lbfgs"

    def __init__(self, params, space: Space, lr: float, history: int = 10,
                 max_ls: int = 12) -> None:
        self.params, self.space, self.lr = params, space, lr
        self.history, self.max_ls = history, max_ls
        self.s: list = []
        self.y: list = []
        self.f: float | None = None
        self.g: list | None = None
        self.failed = False
        self.parts: dict = {}  # misfit/regularisation at the current point (for the history)

    def current(self, evaluate):
        if self.g is None:
            self.f, self.g = evaluate()
        return self.f, self.g

    def _direction(self, g):
        sp = self.space
        q = [-x for x in g]
        alphas = []
        rhos = [1.0 / sp.dot(y, s) for s, y in zip(self.s, self.y)]
        for s, y, rho in reversed(list(zip(self.s, self.y, rhos))):
            a = rho * sp.dot(s, q)
            alphas.append(a)
            q = [qi - a * yi for qi, yi in zip(q, y)]
        if self.s:
            s, y = self.s[-1], self.y[-1]
            gamma = sp.dot(s, y) / sp.dot(y, y)
            q = [qi * gamma for qi in q]
        for (s, y, rho), a in zip(zip(self.s, self.y, rhos), reversed(alphas)):
            b = rho * sp.dot(y, q)
            q = [qi + (a - b) * si for qi, si in zip(q, s)]
        return q

    def step(self, evaluate) -> None:
        sp = self.space
        f, g = self.current(evaluate)
        d = self._direction(g)
        gtd = sp.dot(g, d)
        if not self.s or gtd >= 0:
            if gtd >= 0:
                self.s, self.y = [], []
            d = [-x for x in g]
            gtd = sp.dot(g, d)
            t = self.lr / max(sp.absmax(g), 1e-300)
        else:
            t = 1.0
        x0 = [p.detach().clone() for p in self.params]
        ok = False
        for _ in range(self.max_ls):
            with torch.no_grad():
                for p, x, di in zip(self.params, x0, d):
                    p.copy_(x + di * t)
            f_new, g_new = evaluate()
            if math.isfinite(f_new) and f_new <= f + 1e-4 * t * gtd:
                ok = True
                break
            t *= 0.5
        if not ok:
            with torch.no_grad():
                for p, x in zip(self.params, x0):
                    p.copy_(x)
            self.failed = True
            return
        s = [di * t for di in d]
        y = [a - b for a, b in zip(g_new, g)]
        if sp.dot(y, s) > 1e-12 * max(sp.dot(y, y), 1e-300):
            self.s.append(s)
            self.y.append(y)
            if len(self.s) > self.history:
                self.s.pop(0)
                self.y.pop(0)
        self.f, self.g = f_new, g_new

    def state_vectors(self) -> dict:
        out = {}
        for i, (s, y) in enumerate(zip(self.s, self.y)):
            out[f"s{i}"] = s
            out[f"y{i}"] = y
        if self.g is not None:
            out["g"] = self.g
        return out

    def state_scalars(self) -> dict:
        return {"n": len(self.s), "f": self.f if self.f is not None else float("nan"),
                "has_g": self.g is not None, "failed": self.failed, "parts": self.parts}

    def load(self, vectors: dict, scalars: dict) -> None:
        n = int(scalars["n"])
        self.s = [vectors[f"s{i}"] for i in range(n)]
        self.y = [vectors[f"y{i}"] for i in range(n)]
        self.g = vectors["g"] if scalars["has_g"] else None
        self.f = float(scalars["f"]) if scalars["has_g"] else None
        self.failed = bool(scalars["failed"])
        self.parts = dict(scalars.get("parts", {}))
