"""Zero-phase low-pass filtering of traces along time: the data of a frequency-continuation stage.

Why: a waveform inversion started far from the true model fits the wrong cycle of a wave when the
data hold high frequencies (cycle skipping); inverting low-passed data first, then higher bands,
then the full band, moves the model where the full band's misfit is convex. Each stage's misfit
compares the low-passed synthetic traces with the low-passed observed ones. Filtering the residual
(synthetic minus observed) does exactly that, and, the wave equations being linear and
time-invariant in their source, it is the same as low-passing the wavelet and the observed data
with one filter (up to the end of the record, where the filter's tail is cut as the traces are).

The filter is the forward-backward (``filtfilt``) digital Butterworth of ``scipy.signal.butter``:
its response is the squared magnitude of the bilinear-transformed Butterworth,

    G(f) = 1 / (1 + (tan(pi f dt) / tan(pi f_c dt)) ** (2 N)),

real and even, so zero phase, applied by FFT on the traces zero-padded by the response's length
both ways (:data:`TAIL_PERIODS` periods of the cutoff, where the order-4 response has decayed to
1e-10 of its peak), so that the circular convolution is the linear one: no wrap-around of a
trace's end onto its start, nor of the response's tail onto itself. Being a real diagonal in
frequency, the operator is self-adjoint, so autograd's backward is the same filter and the
gradient is exact. Why not ``scipy.signal.sosfiltfilt``: it works on NumPy arrays (no autograd, no
GPU), its edge padding makes it differ from its own adjoint, and SciPy is not a runtime dependency
of odecli; ``tests/test_continuation_filter.py`` checks ``G`` against ``scipy.signal.sosfreqz`` and
the filtered traces against ``sosfiltfilt`` away from the ends.
"""

from __future__ import annotations

import math

import torch

DEFAULT_ORDER = 4  # Butterworth order N; forward-backward doubles it: 48 dB per octave past f_c
# The forward-backward order-4 response falls below 1e-10 of its peak 9.5 cutoff periods from its
# centre (1e-6 at 5.6, measured on a 65536-point grid); padding by 10 periods keeps the FFT's
# circular convolution the linear one to that level.
TAIL_PERIODS = 10.0


def lowpass_gain(frequencies: torch.Tensor, dt: float, max_frequency: float,
                 order: int = DEFAULT_ORDER) -> torch.Tensor:
    """``G(f)`` above at ``frequencies`` (Hz, 0..Nyquist): 1 at 0, 1/2 at ``max_frequency``
    (the -6 dB point of the forward-backward filter), 0 at Nyquist."""
    nyquist = 0.5 / dt
    if not 0 < max_frequency < nyquist:
        raise ValueError(f"max_frequency must be between 0 and the Nyquist frequency "
                         f"{nyquist:g} Hz, got {max_frequency:g}")
    ratio = torch.tan(math.pi * dt * frequencies.clamp(max=nyquist)) / math.tan(math.pi * dt * max_frequency)
    gain = 1.0 / (1.0 + ratio.abs() ** (2 * order))
    return torch.where(frequencies >= nyquist, torch.zeros_like(gain), gain)


def padded_length(steps: int, tail: int) -> int:
    """The FFT length: at least ``steps + tail``, a product of 2, 3 and 5 (a fast size)."""
    n = steps + tail
    while True:
        m = n
        for p in (2, 3, 5):
            while m % p == 0:
                m //= p
        if m == 1:
            return n
        n += 1


def lowpass(traces: torch.Tensor, dt: float, max_frequency: float,
            order: int = DEFAULT_ORDER) -> torch.Tensor:
    """``traces`` (time on the last axis, step ``dt`` s) low-passed at ``max_frequency`` Hz with
    zero phase; differentiable (its backward is itself). Same shape and dtype."""
    steps = traces.shape[-1]
    if traces.numel() == 0:  # a rank without receivers (MKL's FFT refuses an empty batch)
        return traces
    n = padded_length(steps, math.ceil(TAIL_PERIODS / (max_frequency * dt)))
    freqs = torch.fft.rfftfreq(n, d=dt, dtype=torch.float64, device=traces.device)
    gain = lowpass_gain(freqs, dt, max_frequency, order).to(traces.dtype)
    spectrum = torch.fft.rfft(traces, n=n, dim=-1)
    return torch.fft.irfft(spectrum * gain, n=n, dim=-1)[..., :steps]


__all__ = ["DEFAULT_ORDER", "TAIL_PERIODS", "lowpass", "lowpass_gain", "padded_length"]
