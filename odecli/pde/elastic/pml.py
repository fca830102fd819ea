"""Convolutional PML (CPML, Komatitsch & Martin 2007, with kappa = 1) profiles for the staggered
grid: per axis, the memory-variable coefficients ``a`` and ``b`` at integer and half-integer
nodes, as functions of the *global* node index (a rank's block gets exactly the numbers one
rank has for the whole grid).

Each spatial derivative ``df`` taken inside the PML becomes ``df + psi`` with
``psi <- b * psi + a * df`` every step, where ``b = exp(-(d + alpha) dt)`` and
``a = d / (d + alpha) * (b - 1)``; ``d`` grows like ``d0 (s/L)^2`` over the ``L = width * h``
deep layer (``d0 = -3 v ln(R) / (2 L)``, ``R`` the target reflection coefficient, ``v`` the
fastest speed) and ``alpha = pi f (1 - s/L)`` (``f`` the wavelet's dominant frequency) keeps
grazing waves from growing.  Outside the layers ``d = 0`` and ``psi`` stays 0.
"""

from __future__ import annotations

import math

import numpy as np
import torch

REFLECTION = 1e-3  # the target reflection coefficient R of the layer at normal incidence


def depth_into_layers(index: np.ndarray, n: int, width: int, low: bool, high: bool) -> np.ndarray:
    """How far (in cells, >= 0) the positions ``index`` (may be half-integer) lie inside the
    layers of an axis of ``n`` nodes: the low side's layer spans nodes ``0 .. width`` (its inner
    edge at node ``width``), the high side's ``n-1-width .. n-1``."""
    s = np.zeros_like(index, dtype=np.float64)
    if low:
        s = np.maximum(s, width - index)
    if high:
        s = np.maximum(s, index - (n - 1 - width))
    return np.clip(s, 0.0, None)


def axis_coefficients(n: int, h: float, width: int, low: bool, high: bool, speed: float,
                      frequency: float, dt: float, start: int, stop: int, half: bool,
                      dtype, device) -> tuple[torch.Tensor, torch.Tensor]:
    """``(a, b)`` at the nodes ``start .. stop-1`` of one axis (shifted by +1/2 if ``half``)."""
    index = np.arange(start, stop, dtype=np.float64) + (0.5 if half else 0.0)
    if width <= 0 or not (low or high):
        zeros = np.zeros_like(index)
        return (torch.as_tensor(zeros, dtype=dtype, device=device),
                torch.as_tensor(np.ones_like(index), dtype=dtype, device=device))
    thickness = width * h
    s = depth_into_layers(index, n, width, low, high) * h
    d0 = -3.0 * speed * math.log(REFLECTION) / (2.0 * thickness)
    d = d0 * (s / thickness) ** 2
    alpha = math.pi * frequency * np.clip(1.0 - s / thickness, 0.0, None)
    alpha = np.where(s > 0, alpha, 0.0)
    b = np.exp(-(d + alpha) * dt)
    with np.errstate(invalid="ignore", divide="ignore"):
        a = np.where(d > 0, d / (d + alpha) * (b - 1.0), 0.0)
    b = np.where(s > 0, b, 1.0)
    return (torch.as_tensor(a, dtype=dtype, device=device),
            torch.as_tensor(b, dtype=dtype, device=device))


def dominant_frequency(wavelet: np.ndarray, dt: float) -> float:
    """The frequency of the wavelet's largest spectral amplitude (``alpha``'s scale)."""
    w = np.asarray(wavelet, dtype=np.float64)
    if w.size < 2 or not np.any(w):
        return 0.0
    spectrum = np.abs(np.fft.rfft(w, n=max(4 * w.size, 256)))
    freqs = np.fft.rfftfreq(max(4 * w.size, 256), dt)
    return float(freqs[int(np.argmax(spectrum))])
