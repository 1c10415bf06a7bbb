"""PNG charts: ``opsbot stats --plot FILE.png`` (TTFT and TPOT P50 / P99 over time, one colour per
scenario) and ``opsbot analyze``'s ``counts.png`` (occurrences over time per group).

matplotlib is imported only here and only when a chart is asked for; the figure is drawn on the Agg
canvas directly (no pyplot, no GUI backend, no global state).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from bot.errors import OpsbotError
from bot.stats import describe_window, pick_bucket, time_series
from bot.store import RequestRecord

PLOT_SIZE_PX = (1200, 800)
"""Width and height of the PNG in pixels."""
_DPI = 100


def plot_latency(
    records: Sequence[RequestRecord],
    path: Path,
    since: datetime,
    until: datetime,
    *,
    ttft_target_s: float | None = None,
) -> Path:
    """Draw TTFT (top) and TPOT (bottom) P50 (solid) and P99 (dashed) per scenario to ``path`` (PNG).

    Each point is one time bucket (1 min to 1 d, at most 60 across the window) that had answers;
    ``ttft_target_s`` (the SLO's P99 target) is drawn as a dotted line.
    Raises :class:`OpsbotError` when matplotlib is missing or the file cannot be written.
    """
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.dates import AutoDateLocator, ConciseDateFormatter
        from matplotlib.figure import Figure
    except ImportError:
        raise OpsbotError("opsbot stats --plot needs matplotlib: pip install 'matplotlib>=3.11'") from None
    bucket = pick_bucket(until - since)
    series = time_series(records, since, bucket)
    width, height = PLOT_SIZE_PX
    figure = Figure(figsize=(width / _DPI, height / _DPI), dpi=_DPI)
    FigureCanvasAgg(figure)
    ttft_ax, tpot_ax = figure.subplots(2, 1, sharex=True)
    figure.subplots_adjust(left=0.07, right=0.8, top=0.92, bottom=0.08, hspace=0.12)
    figure.suptitle(
        f"opsbot latency per scenario, {describe_window(since, until)}, "
        f"P50 solid / P99 dashed, one point per {bucket.total_seconds() / 60:g} min"
    )
    colours = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown", "tab:pink")
    for i, (scenario, points) in enumerate(series.items()):
        colour = colours[i % len(colours)]
        times = [p.start + bucket / 2 for p in points]
        for ax, p50, p99, scale in (
            (ttft_ax, [p.ttft_p50 for p in points], [p.ttft_p99 for p in points], 1000.0),
            (tpot_ax, [p.tpot_p50 for p in points], [p.tpot_p99 for p in points], 1.0),
        ):
            pairs50 = [(t, v / scale) for t, v in zip(times, p50, strict=True) if v is not None]
            pairs99 = [(t, v / scale) for t, v in zip(times, p99, strict=True) if v is not None]
            if pairs50:
                ax.plot(*zip(*pairs50, strict=True), color=colour, marker="o", ms=3, label=f"{scenario} P50")
            if pairs99:
                ax.plot(
                    *zip(*pairs99, strict=True),
                    color=colour,
                    ls="--",
                    marker="o",
                    ms=3,
                    label=f"{scenario} P99",
                )
    if ttft_target_s is not None:
        ttft_ax.axhline(ttft_target_s, color="grey", ls=":", label=f"P99 target {ttft_target_s:g} s")
    ttft_ax.set_ylabel("TTFT (s)")
    tpot_ax.set_ylabel("TPOT (ms per token)")
    tpot_ax.set_xlabel("time (UTC)")
    for ax in (ttft_ax, tpot_ax):
        ax.grid(True, alpha=0.3)
        ax.set_ylim(bottom=0)
        ax.set_xlim(since, until)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small", borderaxespad=0)
    if not series:
        ttft_ax.text(
            0.5, 0.5, "no requests in this window", ha="center", va="center", transform=ttft_ax.transAxes
        )
    locator = AutoDateLocator()  # type: ignore[no-untyped-call]
    tpot_ax.xaxis.set_major_locator(locator)
    tpot_ax.xaxis.set_major_formatter(ConciseDateFormatter(locator))  # type: ignore[no-untyped-call]
    try:
        figure.savefig(path, format="png", dpi=_DPI)
    except OSError as exc:
        raise OpsbotError(f"cannot write the plot to {path}: {exc.strerror or exc}") from None
    return path


COUNTS_SIZE_PX = (1200, 600)
"""Width and height of ``opsbot analyze``'s ``counts.png`` in pixels."""


def plot_counts(counts: Mapping[str, Any], path: Path, *, title: str, unit: str) -> Path:
    """Draw ``counts`` (a report's ``counts_over_time``: buckets, and per group its counts) as stacked
    steps, one colour per group, to ``path`` (PNG); ``unit`` names what is counted ("alert firings").
    Raises :class:`OpsbotError` when matplotlib is missing or the file cannot be written."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise OpsbotError(
            "opsbot analyze's counts.png needs matplotlib: pip install 'matplotlib>=3.11'"
        ) from None
    width, height = COUNTS_SIZE_PX
    figure = Figure(figsize=(width / _DPI, height / _DPI), dpi=_DPI)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    if counts["buckets"]:
        x = [datetime.fromisoformat(b.replace("Z", "+00:00")) for b in counts["buckets"]]
        # One more edge, so the last bucket is drawn as wide as the others.
        x.append(x[-1] + timedelta(seconds=counts["bucket_s"]))
        stacks = [[*s["counts"], s["counts"][-1]] for s in counts["series"]]
        labels = [s["group"][:56] for s in counts["series"]]
        axes.stackplot(x, *stacks, labels=labels, step="post", alpha=0.85)  # type: ignore[arg-type]
        axes.set_ylabel(f"{unit} per {counts['bucket']}")
        axes.set_xlabel("time (UTC)")
        axes.legend(loc="upper left", fontsize=7, ncol=2, frameon=False)
        axes.grid(True, alpha=0.3)
        figure.autofmt_xdate()
    else:
        axes.text(0.5, 0.5, "no record carries a timestamp", ha="center", va="center")
        axes.set_axis_off()
    axes.set_title(f"{title}: counts over time per group", fontsize=10)
    try:
        figure.savefig(path, format="png", dpi=_DPI)
    except OSError as exc:
        raise OpsbotError(f"cannot write the chart to {path}: {exc.strerror or exc}") from None
    return path
