"""The zero-phase low-pass of frequency continuation (odecli.pde.filtering) against SciPy.

Its gain must be the squared magnitude of ``scipy.signal.butter``'s digital Butterworth (what
``sosfiltfilt`` applies), the filtered traces must match ``sosfiltfilt`` away from the record's
ends (where their edge handling differs), and autograd's backward must be the filter itself.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import signal

from odecli.pde.filtering import lowpass, lowpass_gain, padded_length


@pytest.mark.parametrize("order", [2, 4, 6])
@pytest.mark.parametrize("cutoff", [3.0, 12.5, 80.0])
def test_gain_is_the_squared_butterworth_response(order, cutoff):
    dt = 0.002
    sos = signal.butter(order, cutoff, btype="low", fs=1 / dt, output="sos")
    freqs = np.linspace(0.0, 0.5 / dt, 513)
    _, h = signal.sosfreqz(sos, worN=freqs, fs=1 / dt)
    ours = lowpass_gain(torch.as_tensor(freqs, dtype=torch.float64), dt, cutoff, order).numpy()
    np.testing.assert_allclose(ours, np.abs(h) ** 2, rtol=1e-9, atol=1e-12)
    half = lowpass_gain(torch.tensor([cutoff], dtype=torch.float64), dt, cutoff, order)
    assert float(half) == pytest.approx(0.5, rel=1e-12)  # the -6 dB point of filtfilt


def test_traces_match_sosfiltfilt_away_from_the_ends():
    dt, steps, cutoff, order = 0.002, 4000, 6.0, 4
    rng = np.random.default_rng(3)
    t = np.arange(steps) * dt
    traces = np.stack([np.sin(2 * np.pi * 2.0 * t) + 0.5 * np.sin(2 * np.pi * 25.0 * t),
                       rng.standard_normal(steps)])
    sos = signal.butter(order, cutoff, fs=1 / dt, output="sos")
    ref = signal.sosfiltfilt(sos, traces, axis=-1, padtype=None)
    ours = lowpass(torch.as_tensor(traces), dt, cutoff, order).numpy()
    inner = slice(1000, 3000)  # the responses' tails at 6 Hz decay within ~0.5 s = 250 steps
    scale = np.abs(ref[:, inner]).max()
    assert np.abs(ours[:, inner] - ref[:, inner]).max() <= 1e-9 * scale
    # 2 Hz passes (gain 1/(1+(2/6)^8) = 0.99985), 25 Hz is gone (gain 1e-10)
    np.testing.assert_allclose(ours[0, inner], np.sin(2 * np.pi * 2.0 * t[inner]) * 0.99985, atol=2e-4)


def test_backward_is_the_filter_itself():
    """A dot-product test: <L x, y> = <x, L y>, and autograd's vector-Jacobian product is L y."""
    dt, cutoff = 0.004, 9.0
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, 2, 301, dtype=torch.float64, generator=gen, requires_grad=True)
    y = torch.randn(3, 2, 301, dtype=torch.float64, generator=gen)
    lx = lowpass(x, dt, cutoff)
    ly = lowpass(y, dt, cutoff)
    assert float((lx.detach() * y).sum()) == pytest.approx(float((x.detach() * ly).sum()), rel=1e-13)
    (lx * y).sum().backward()
    torch.testing.assert_close(x.grad, ly, rtol=1e-13, atol=1e-15)


def test_a_short_record_is_filtered_as_a_long_one():
    """No wrap-around: a 70-step record filtered alone equals its first 70 steps filtered inside
    a zero-padded 5000-step record (the cutoff's response is ~600 steps long)."""
    dt, cutoff = 0.0015, 10.0
    gen = torch.Generator().manual_seed(1)
    short = torch.randn(2, 70, dtype=torch.float64, generator=gen)
    long = torch.nn.functional.pad(short, (2000, 2930))
    torch.testing.assert_close(lowpass(short, dt, cutoff), lowpass(long, dt, cutoff)[:, 2000:2070],
                               rtol=0, atol=1e-9 * float(short.abs().max()))


def test_padded_length_is_a_fast_size_long_enough():
    for steps, tail in ((1, 0), (7, 3), (300, 300), (1500, 667), (1999, 1)):
        n = padded_length(steps, tail)
        assert n >= steps + tail
        m = n
        for p in (2, 3, 5):
            while m % p == 0:
                m //= p
        assert m == 1


def test_a_cutoff_outside_the_band_is_refused():
    with pytest.raises(ValueError, match="Nyquist"):
        lowpass(torch.zeros(10), 0.01, 60.0)
