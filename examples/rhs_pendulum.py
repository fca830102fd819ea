"""Damped pendulum for ``examples/python-rhs.yaml``.

A Python right-hand side is called as ``f(t, y, p)`` with t of shape (batch,), y of shape
(batch, n_states) in the spec's state order, and p a dict of (batch,) tensors (shared
parameters are repeated per sample). It returns dy/dt with y's shape, dtype and device and
must use torch operations only, so the whole batch is evaluated at once (on CPU or GPU).
"""

import torch


def damped_pendulum(t, y, p):
    """theta' = omega, omega' = -damping * omega - (g/l) * sin(theta)."""
    theta, omega = y[:, 0], y[:, 1]
    domega = -p["damping"] * omega - p["g_over_l"] * torch.sin(theta)
    return torch.stack([omega, domega], dim=1)
