"""The elastic CUDA kernels on a GPU, checked and timed: the elastic part of
``benchmarks/gpu_pde_check.py`` (which runs it between its acoustic sections, on its budget).

1. correctness on the GPU (:func:`check_against_reference`): the kernels
   (odecli/pde/elastic/cuda_*) against odecli's PyTorch reference on the same card, float64 and
   float32, a 161^2 problem with CPML, a free surface, a fluid patch, two shots of vertical
   force, vy/vx/pressure receivers and 3 time segments: whether the traces are bit for bit the
   same, max |difference| / max |traces|, and the gradient's (vp, vs, rho) max |difference| /
   max |gradient| (autograd through the reference against the hand-written adjoint);
2. at each size (:func:`time_size`), float32, one vertical-force shot, 100 vy receivers (fewer below 140^2),
   ``steps`` steps: forward and forward + gradient (loss ``sum(traces^2)``, gradient for all
   three parameters) of the kernels, of ``deepwave.elastic`` (4th order) and of odecli's
   PyTorch reference, as the median of 3 after a warm-up (the reference: 1), in G
   point-updates/s (cells * steps / wall), with RATIO lines between numbers of this run.  The
   problem is ``benchmarks/elastic_bench.py``'s: Deepwave gets an (n - 40)^2 model and pads it
   with its 20-cell PML, odecli the padded n^2 grid with a 20-cell CPML inside it, so both step
   n^2 cells.  The kernels' gradient keeps every step's store when it fits in half the free GPU
   memory (one time segment, as Deepwave stores every step), else the fewest segments that fit.
"""

from __future__ import annotations

import statistics
import sys
import time
import warnings
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tests" / "mpi_scripts"))
import elastic_equivalence as eq
from elastic_bench import DT, PML, F, H, model
from elastic_setup import build, elastic_setup

from odecli.parallel.comm import get_comm
from odecli.pde.segments import default_segment_count, segment_bounds
from odecli.pde.sources import ricker


def _on(setup, device: str):
    """``setup`` (built for the CPU by elastic_setup) moved to ``device``."""
    setup.device = torch.device(device)
    setup.local = setup.geometry.local(setup.block, setup.device, setup.dtype)
    return setup


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def timed(fn, device: str, repeats: int = 3) -> float:
    """Median wall time of ``repeats`` calls after a warm-up."""
    fn()
    _sync(device)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def check_against_reference(device: str, small: bool = False) -> None:
    print("\n== elastic2d: the CUDA kernels against odecli's PyTorch reference on the same device")
    n, nt = (41, 40) if small else (161, 200)
    _, shots, recs, comps = eq.variants()
    scale_at = lambda p: (round(p[0] * (n - 1) / (eq.SHAPE[0] - 1)), round(p[1] * (n - 1) / (eq.SHAPE[1] - 1)))
    shots = [[(*scale_at(s[:2]), s[2]) for s in shot] for shot in shots]
    recs = [scale_at(r) for r in recs]
    m = torch.nn.functional.interpolate(eq.true_model()[None], size=(n, n), mode="nearest")[0]
    for dtype in (torch.float64, torch.float32):
        out = {}
        for fused in (None, False):
            setup = _on(elastic_setup(get_comm(), (n, n), eq.SPACING, eq.DT, nt, shots, recs,
                                      ricker(25.0, nt, eq.DT), components=comps, width=10,
                                      segments=3, dtype=dtype, free_surface=True), device)
            prop = build(setup)
            prop.fused = prop.fused if fused is None else fused
            c = m.to(device, dtype).detach().clone().requires_grad_(True)
            with torch.no_grad():
                traces = prop.forward(c)
            loss = prop.forward(c).pow(2).sum()
            loss.backward()
            out[fused] = (traces, c.grad, prop.engine())
        (t0, g0, engine), (t1, g1, _) = out[None], out[False]
        gerr = max(float((g0[k] - g1[k]).abs().max() / g1[k].abs().max()) for k in range(3))
        print(f"{str(dtype)[6:]}: engine '{engine}'; traces bit for bit: {torch.equal(t0, t1)}, "
              f"max|diff|/max|traces| {float((t0 - t1).abs().max() / t1.abs().max()):.2e}; "
              f"gradient (vp, vs, rho) max|diff|/max|grad| {gerr:.2e}")


def receiver_columns(inner: int) -> list[int]:
    """100 receiver columns across the model (fewer on a small one: Deepwave wants them unique)."""
    count = min(100, inner)
    return [int(k * (inner - 1) / (count - 1)) for k in range(count)]


def _odecli(n: int, steps: int, device: str, segments: int):
    vp, vs, rho = model(n - 2 * PML, torch.float32)
    pad = lambda t: torch.nn.functional.pad(t[None, None], (PML,) * 4, mode="replicate")[0, 0]
    coef = torch.stack([pad(vp), pad(vs), pad(rho)]).to(device).contiguous()
    inner = n - 2 * PML
    recs = [(PML + 10, PML + col) for col in receiver_columns(inner)]
    setup = _on(elastic_setup(get_comm(), (n, n), (H, H), DT, steps, [[(n // 2, n // 2, 1.0)]],
                              recs, ricker(F, steps, DT), width=PML, segments=segments,
                              dtype=torch.float32, pml_speed=2600.0), device)
    return build(setup), coef


def _runners(prop, coef, fused: bool | None):
    def forward():
        prop.fused = fused
        with torch.no_grad():
            prop.forward(coef)

    def gradient():
        prop.fused = fused
        c = coef.clone().requires_grad_(True)
        traces = prop.forward(c)
        (traces * traces).sum().backward()

    return forward, gradient


def _deepwave(n: int, steps: int, device: str):
    """``deepwave.elastic``'s forward and forward + gradient on the same cells, or a reason."""
    try:
        import deepwave
    except ImportError as exc:
        return None, f"deepwave does not import ({exc})"
    warnings.filterwarnings("ignore")
    inner = n - 2 * PML
    vp, vs, rho = (t.to(device) for t in model(inner, torch.float32))
    params = [rho * (vp**2 - 2 * vs**2), rho * vs**2, 1.0 / rho]
    amp = torch.as_tensor(ricker(F, steps, DT), dtype=torch.float32, device=device).reshape(1, 1, -1)
    sloc = torch.tensor([[[n // 2 - PML, n // 2 - PML]]], device=device)
    rloc = torch.tensor([[[10, col] for col in receiver_columns(inner)]], device=device)

    def run(p):
        return deepwave.elastic(*p, H, DT, source_amplitudes_y=amp, source_locations_y=sloc,
                                receiver_locations_y=rloc, accuracy=4, pml_width=PML,
                                pml_freq=F, max_vel=2600.0).receiver_amplitudes_y

    try:
        run([t[:40, :40].contiguous() for t in params]) if inner >= 40 else run(params)
    except Exception as exc:  # noqa: BLE001 - any failure: skip Deepwave, say why
        return None, f"deepwave.elastic does not run on {device}: {str(exc).splitlines()[0]}"

    def forward():
        with torch.no_grad():
            run(params)

    def gradient():
        p = [t.clone().requires_grad_(True) for t in params]
        r = run(p)
        (r * r).sum().backward()

    name = f"deepwave {getattr(deepwave, '__version__', '')} elastic".replace("  ", " ")
    return (forward, gradient), name


def time_size(n: int, steps: int, device: str, with_reference: bool, left) -> None:
    """``left()``: whether the caller's time budget still allows a section."""
    print(f"\n== elastic2d {n}^2 cells, float32, {steps} steps, 1 shot (fy), {len(receiver_columns(n - 2 * PML))} vy receivers")
    store = 5 * n * n * 4 * steps  # the kernels' stores of every step
    free = torch.cuda.mem_get_info()[0] if device == "cuda" else 8e9
    segments = max(1, -(-int(2 * store) // int(free)))
    prop, coef = _odecli(n, steps, device, segments)
    pts = n * n * steps
    rows = {}
    kernel_f, kernel_g = _runners(prop, coef, None)
    print(f"odecli engine: {prop.engine()}")
    rows["odecli CUDA kernels"] = (timed(kernel_f, device), timed(kernel_g, device))
    runners, why = _deepwave(n, steps, device)
    if runners is None:
        print(f"Deepwave skipped: {why}")
    elif left():
        rows[why] = (timed(runners[0], device), timed(runners[1], device))
    if with_reference and left():
        # autograd keeps ~40 temporaries a step: the reference checkpoints sqrt(nt) segments
        kept, prop.segments = prop.segments, segment_bounds(steps, default_segment_count(steps))
        ref_f, ref_g = _runners(prop, coef, False)
        rows["odecli PyTorch reference"] = (timed(ref_f, device, 1), timed(ref_g, device, 1))
        prop.segments = kept
    for name, (tf, tg) in rows.items():
        print(f"{name:<28} forward {tf:8.4f} s {pts / tf / 1e9:8.2f} GPts/s   "
              f"forward+gradient {tg:8.4f} s {pts / tg / 1e9:8.2f} GPts/s")
    kf, kg = rows["odecli CUDA kernels"]
    for name, (tf, tg) in rows.items():
        if name != "odecli CUDA kernels":
            print(f"RATIO elastic odecli CUDA kernels / {name} throughput: forward {tf / kf:.2f}x, "
                  f"forward+gradient {tg / kg:.2f}x")
