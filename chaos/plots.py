"""PNG plots of a run: latency over time with the fault window shaded, and the latency CDF of each phase.

Figures are built on matplotlib's object API with the Agg canvas, never pyplot: no global backend, no GUI, no
state shared between runs.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.axis import Axis
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from glassbox.chaos.record import RunRecord
from glassbox.chaos.stats import in_window, ok_latencies, split_phases, window_starts

PHASE_COLOURS = {"baseline": "#1f77b4", "fault": "#d62728", "recovery": "#2ca02c"}
EVENT_STYLES = {"fallback_seen": ("#8c564b", "fallback seen"), "fallback_cleared": ("#2ca02c", "fallback cleared"),
                "recovered": ("#9467bd", "recovered")}
MIN_WINDOW_SAMPLES = 20  # the plotted rolling P99 uses a window wide enough to hold about this many requests


def _plain_numbers(axis: Axis) -> None:
    """Log axes label 3, 5, 10, 20 rather than 3x10^0: latency readers want milliseconds, not exponents."""
    formatter = FuncFormatter(lambda value, _: f"{value:g}")
    axis.set_major_formatter(formatter)
    axis.set_minor_formatter(formatter)


def _rolling_p99(record: RunRecord, window_s: float) -> tuple[list[float], list[float]]:
    end = max((w.end_s for w in record.windows), default=0.0)
    centres: list[float] = []
    values: list[float] = []
    for start in window_starts(0.0, end, window_s):
        latencies = ok_latencies(in_window(record.samples, float(start), float(start) + window_s))
        if latencies.size:
            centres.append(float(start) + window_s / 2)
            values.append(float(np.percentile(latencies, 99)) * 1000)
    return centres, values


def latency_over_time(record: RunRecord, path: Path) -> Path:
    figure = Figure(figsize=(11, 5), dpi=110)
    FigureCanvasAgg(figure)
    ax = figure.add_subplot()
    for start, end in record.fault_spans():
        ax.axvspan(start, end, color="#d62728", alpha=0.12, label="fault injected")
    ok = [s for s in record.samples if s.ok]
    failed = [s for s in record.samples if not s.ok]
    ax.scatter([s.intended_s for s in ok], [s.latency_s * 1000 for s in ok], s=7, alpha=0.5, color="#1f3b73",
               linewidths=0, rasterized=True, label="request (2xx)")
    if failed:
        ax.scatter([s.intended_s for s in failed], [max(s.latency_s, 1e-4) * 1000 for s in failed], s=14,
                   marker="x", color="#d62728", linewidths=0.8, label="failed request")
    rate = record.experiment.rate_of(record.experiment.phases[0])
    window = max(record.experiment.hypothesis.recovery_window_s, MIN_WINDOW_SAMPLES / rate)
    centres, p99 = _rolling_p99(record, window)
    if centres:
        ax.plot(centres, p99, color="#ff7f0e", linewidth=1.6, label=f"rolling P99 ({window:g} s window)")
    for w in record.windows[1:]:
        ax.axvline(w.start_s, color="#888888", linestyle="--", linewidth=0.8)
    if record.windows and record.windows[0].start_s > 0:
        ax.text(record.windows[0].start_s / 2, 1.01, "warm-up", transform=ax.get_xaxis_transform(), ha="center",
                va="bottom", fontsize=9, color="#888888")
        ax.axvline(record.windows[0].start_s, color="#888888", linestyle="--", linewidth=0.8)
    for w in record.windows:
        ax.text((w.start_s + w.end_s) / 2, 1.01, w.name, transform=ax.get_xaxis_transform(), ha="center",
                va="bottom", fontsize=9, color=PHASE_COLOURS.get(w.name, "#000000"))
    labelled: set[str] = set()
    for event in record.events:
        if event.kind in EVENT_STYLES:
            colour, label = EVENT_STYLES[event.kind]
            ax.axvline(record.t(event), color=colour, linewidth=1.2,
                       linestyle="-." if event.kind.startswith("fallback") else "-",
                       label=None if label in labelled else label)
            labelled.add(label)
    if record.samples:
        ax.set_yscale("log")
        _plain_numbers(ax.yaxis)
    ax.set_xlim(0, max((w.end_s for w in record.windows), default=1.0))
    ax.set_xlabel("time since load start (s, intended send time)")
    ax.set_ylabel("latency (ms)")
    ax.set_title(f"{record.experiment.title}: latency over time", pad=18)
    ax.grid(True, which="both", alpha=0.25)
    handles, labels = ax.get_legend_handles_labels()
    unique = dict(zip(labels, handles, strict=True))  # one shaded span per injection, one legend entry
    ax.legend(unique.values(), unique.keys(), loc="upper left", fontsize=8, framealpha=0.85)
    figure.tight_layout()
    figure.savefig(path, format="png")
    return path


def latency_cdf(record: RunRecord, path: Path) -> Path:
    figure = Figure(figsize=(8, 5), dpi=110)
    FigureCanvasAgg(figure)
    ax = figure.add_subplot()
    by_phase = split_phases(record.samples, record.windows)
    drawn = False
    for w in record.windows:
        latencies = np.sort(ok_latencies(by_phase[w.name])) * 1000
        if not latencies.size:
            continue
        fraction = np.arange(1, latencies.size + 1) / latencies.size
        p99 = float(np.percentile(latencies, 99))
        ax.step(latencies, fraction, where="post", color=PHASE_COLOURS.get(w.name), linewidth=1.5,
                label=f"{w.name} (n={latencies.size}, P99 {p99:.1f} ms)")
        drawn = True
    ax.axhline(0.99, color="#888888", linestyle=":", linewidth=0.9)
    ax.text(0.01, 0.99, "P99", transform=ax.get_yaxis_transform(), va="bottom", fontsize=8, color="#666666")
    if drawn:
        ax.set_xscale("log")
        _plain_numbers(ax.xaxis)
        ax.legend(loc="lower right", fontsize=9)
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("latency (ms, successful requests)")
    ax.set_ylabel("fraction of requests at or below")
    ax.set_title(f"{record.experiment.title}: latency CDF per phase")
    ax.grid(True, which="both", alpha=0.25)
    figure.tight_layout()
    figure.savefig(path, format="png")
    return path


def write_plots(record: RunRecord, out_dir: Path) -> dict[str, str]:
    """Both plots into `out_dir`; returns name -> file name (relative, as the report links them)."""
    return {"latency_over_time": latency_over_time(record, out_dir / "latency-over-time.png").name,
            "latency_cdf": latency_cdf(record, out_dir / "latency-cdf.png").name}
