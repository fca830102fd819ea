"""Drawing helpers every ``odecli plot`` figure shares: legends that never cover a trace,
notes the layout makes room for, log axes ticked at whole decades, iteration axes as the fit's log counts.

They exist so each rule is written once: a legend goes beside the axes (the constrained
layout shrinks the axes to make room) in as many columns as the figure's height needs, and a
note goes in the figure's bottom label slot (``supxlabel``), which the layout also reserves, so
neither can overlap a trace, a tick label or an axis label.
"""

from __future__ import annotations

import math
import textwrap
from typing import Sequence

import numpy as np

DPI = 100
MAX_LEGEND_ENTRIES = 20  # more lines than this get no per-line legend: a note names the colour order
LEGEND_ROW_PX = 17  # an x-small legend row (8.3 pt text plus spacing) at DPI 100
NOTE_WIDTH_CHARS = 115  # an x-small line of text across an 8-inch figure


def figure_legend(fig, handles: Sequence, labels: Sequence[str], notes: list[str],
                  always: Sequence[tuple] = ()) -> None:
    """A legend outside the axes, to the right, in enough columns to fit the figure's height.

    ``always``: (handle, label) pairs listed first and kept in every case (observed data, initial
    states). Past ``MAX_LEGEND_ENTRIES`` per-line entries those are dropped (a wall of text helps
    no one) and a note says how the colours run instead.
    """
    handles, labels = list(handles), list(labels)
    if len(handles) > MAX_LEGEND_ENTRIES:
        notes.append(f"no legend for {len(handles)} lines; colours run from dark purple (first sample) "
                     f"to yellow (last); pick a few with --samples for a legend")
        handles, labels = [], []
    handles = [h for h, _ in always] + handles
    labels = [label for _, label in always] + labels
    if not handles:
        return
    rows = max(3, int((fig.get_figheight() * DPI - 60) // LEGEND_ROW_PX))
    fig.legend(handles, labels, loc="outside right upper", fontsize="x-small",
               ncols=math.ceil(len(handles) / rows))


def add_notes(fig, notes: Sequence[str]) -> None:
    """The notes, wrapped, in the figure's bottom label slot (room for it is kept by the layout)."""
    if notes:
        text = "\n".join(textwrap.wrap("; ".join(notes), NOTE_WIDTH_CHARS))
        fig.supxlabel(text, fontsize="x-small", color="0.35")


def decade_log_axis(ax, values: np.ndarray, axis: str = "y", whole_decades: bool = True) -> bool:
    """A log scale labelled at powers of ten only (minor ticks unlabelled), over whole decades
    unless ``whole_decades`` is False (then over the values' own range, e.g. a time axis).

    Without this a loss spanning less than a decade gets labels at 2.5 or 7.5 x 10^k, which read
    as linear ticks. Returns False (scale left linear) when no value is positive.
    """
    from matplotlib.ticker import LogLocator, NullFormatter

    values = np.asarray(values, dtype=float)
    positive = values[np.isfinite(values) & (values > 0)]
    if positive.size == 0:
        return False
    low = 10.0 ** math.floor(math.log10(positive.min()))
    high = 10.0 ** math.ceil(math.log10(positive.max()))
    if high <= low:
        high = low * 10.0
    if not whole_decades and positive.max() > positive.min():
        low, high = float(positive.min()), float(positive.max())
    which = ax.yaxis if axis == "y" else ax.xaxis
    (ax.set_yscale if axis == "y" else ax.set_xscale)("log", nonpositive="mask")
    (ax.set_ylim if axis == "y" else ax.set_xlim)(low, high)
    which.set_major_locator(LogLocator(base=10.0, numticks=12))
    which.set_minor_locator(LogLocator(base=10.0, subs=tuple(range(2, 10)), numticks=12))
    which.set_minor_formatter(NullFormatter())
    return True


def iteration_axis(ax, n_rows: int) -> np.ndarray:
    """The x of each history row: row k holds the point after k iterations (0: the initial guess),
    as the fit's log prints it (``start``, then ``iter 1``, ``iter 2`` ...); integer ticks."""
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("iterations done (0: the initial guess)")
    return np.arange(n_rows)


def draw_loss(ax, h5, title: str = "loss") -> None:
    """A fit's loss history (``history/loss``) on a decade-labelled log axis."""
    loss = np.asarray(h5["history/loss"][...], dtype=float)
    ax.set_title(title, fontsize="medium")
    if loss.size == 0:
        ax.text(0.5, 0.5, "no iterations recorded", ha="center", va="center", transform=ax.transAxes)
        return
    iterations = iteration_axis(ax, loss.size)
    ax.plot(iterations, loss, marker="o" if loss.size < 50 else None, markersize=3, linewidth=1.2)
    decade_log_axis(ax, loss, "y")
    ax.set_ylabel("loss")
    ax.grid(True, which="both", alpha=0.3)
