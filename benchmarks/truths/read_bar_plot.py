"""Read the bar heights of a grouped bar chart PNG (MagiAttention's distributed benchmark figures) from its pixels.

    python benchmarks/truths/read_bar_plot.py FIGURE.png --unit 100

For each legend colour (``LEGEND``), every bar of that colour standing on the x axis, left to right, in the axis'
units: the bar's top row (the median over its columns, so a marker or a line across it does not move it) against
the gridlines, ``--unit`` apart (the tick step printed on the figure's y axis). Needs Pillow. The figures of
benchmarks/truths/published-masks.yaml were read so, at MagiAttention commit 09fc31b2.
"""
from __future__ import annotations

import argparse

import numpy as np
from PIL import Image

#: RGB of each series in MagiAttention's figures (their legend patches)
LEGEND = {"ulysses": (196, 92, 132), "ring_p2p": (216, 136, 128), "ring_allgather": (236, 216, 168),
          "usp": (252, 188, 168), "loongtrain": (148, 196, 168), "hybrid_dcp": (80, 148, 156),
          "magi_attn-a2av": (68, 124, 184), "magi_attn-native": (64, 100, 128)}


def gray_rows(im: np.ndarray, x: int) -> list[float]:
    """Centre rows of the grey horizontal lines (gridlines, the x axis) crossing column ``x``."""
    col = im[:, x]
    grey = (np.abs(col[:, 0] - col[:, 1]) < 6) & (np.abs(col[:, 1] - col[:, 2]) < 6) & (col[:, 0] < 245)
    rows = np.flatnonzero(grey)
    runs = np.split(rows, np.flatnonzero(np.diff(rows) > 2) + 1)
    return [float(r[0] + r[-1]) / 2 for r in runs if len(r)]


def axis_scale(rows: list[float]) -> tuple[float, float]:
    """(row of zero, rows per gridline step) from the evenly spaced lines that end at the x axis (the lowest)."""
    rows = sorted(rows)
    step = float(np.median(np.diff(rows)[-4:]))
    even = [rows[-1]]
    for y in reversed(rows[:-1]):
        if abs(even[-1] - y - step) >= 6:
            break
        even.append(y)
    return rows[-1], (even[0] - even[-1]) / (len(even) - 1)


def bar_tops(im: np.ndarray, color, zero: float, tol: int = 10, gap: int = 40) -> list[float]:
    """Top rows of the bars of ``color`` standing on the axis, left to right: per column, the colour climbed from
    the axis across gaps shorter than ``gap`` rows (lines drawn over the bar), then the median over the bar."""
    hit = np.abs(im - np.asarray(color)).max(axis=2) <= tol
    base = int(zero) - 8
    tops = {}
    for x in np.flatnonzero(hit[base - 5:base].all(axis=0)):
        y = last = base
        while y > 0 and y > last - gap:
            last = y if hit[y, x] else last
            y -= 1
        tops[int(x)] = last
    xs = sorted(tops)
    bars = np.split(np.asarray(xs), np.flatnonzero(np.diff(xs) > 3) + 1) if xs else []
    return [float(np.median([tops[x] for x in b])) for b in bars if len(b) > 50]


def read_figure(path: str, unit: float) -> dict[str, list[float]]:
    """{series: bar heights in axis units, left to right}."""
    im = np.asarray(Image.open(path).convert("RGB")).astype(int)
    zero, per_step = axis_scale(gray_rows(im, int(im.shape[1] * 150 / 1568)))
    return {name: [round((zero - top) / per_step * unit, 1) for top in bar_tops(im, rgb, zero)]
            for name, rgb in LEGEND.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("figure")
    ap.add_argument("--unit", type=float, required=True, help="the y axis' tick step, in its units")
    a = ap.parse_args()
    for name, heights in read_figure(a.figure, a.unit).items():
        print(f"{name:<18} {heights}")


if __name__ == "__main__":
    main()
