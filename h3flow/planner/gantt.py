"""A Gantt chart of a schedule: one lane per resource, one colour per clip (matplotlib, PNG).

Sampling and decoding are solid bars; encode + offload are hatched so a borrowed encode
(the XTX's clips on Host A's first pool) stands out; the handoff (latent write + SHA-256),
the transfer over the link and the mux have their own hatches, all in the legend.
``draw_comparison`` puts the design's round-robin above the chosen schedule on one time
axis. matplotlib is imported here only, so planning without a chart never loads it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from h3flow.core.fsutil import atomic_writer
from h3flow.planner.resources import Resources
from h3flow.planner.schedule import Schedule

STYLE = {  # stage -> (bar height as a share of the lane, hatch, alpha)
    "encode": (0.78, "////", 0.55),
    "offload": (0.78, "....", 0.45),
    "sample": (0.78, "", 0.95),
    "handoff": (0.78, "\\\\\\", 0.8),
    "transfer": (0.78, "---", 0.8),
    "decode": (0.78, "", 0.95),
    "mux": (0.78, "xxx", 0.6),
}
LEGEND = [  # (label, hatch, face)
    ("encode", "////", "lightgrey"),
    ("offload", "....", "lightgrey"),
    ("sample / decode", "", "grey"),
    ("handoff (write + SHA-256)", "\\\\\\", "lightgrey"),
    ("transfer (link)", "---", "lightgrey"),
    ("mux", "xxx", "lightgrey"),
]


def _lanes(resources: Resources) -> list[tuple[str, str]]:
    lanes = [
        (p.name, p.label + (f"\nencoded on {p.encoder}" if p.encoder != p.name else "")) for p in resources.samplers
    ]
    lanes += [(lk.name, lk.label) for lk in resources.links]
    lanes += [(d.name, d.label) for d in resources.decoders]
    return lanes


def _plot(ax, schedule: Schedule, lanes: list[tuple[str, str]], colour: dict, span: float, labels: bool) -> None:
    row = {name: i for i, (name, _) in enumerate(lanes)}
    for run in schedule.runs:
        height, hatch, alpha = STYLE[run.stage]
        y = row[run.resource]
        width = max(run.end - run.start, span * 0.002)  # sub-second stages stay visible
        ax.barh(
            y,
            width,
            left=run.start,
            height=height,
            color=colour[run.clip],
            alpha=alpha,
            hatch=hatch,
            edgecolor="black",
            linewidth=0.4,
        )
        if labels and run.stage in ("sample", "decode") and (run.end - run.start) > span * 0.028:
            ax.text(
                run.start + (run.end - run.start) / 2, y, run.clip, ha="center", va="center", fontsize=8, color="black"
            )
    ax.set_yticks(range(len(lanes)))
    ax.set_yticklabels([label for _, label in lanes], fontsize=9)
    ax.set_ylim(len(lanes) - 0.4, -0.7)
    ax.set_xlim(0, span * 1.02)
    ax.grid(axis="x", linestyle=":", linewidth=0.5, alpha=0.7)
    ax.set_axisbelow(True)


def _marks(ax, makespan: float, lower_bound: float | None) -> list:
    from matplotlib.lines import Line2D

    ax.axvline(makespan, color="black", linewidth=1.2)
    marks = [Line2D([0], [0], color="black", linewidth=1.2, label=f"makespan {makespan:.1f} s")]
    if lower_bound:
        ax.axvline(lower_bound, color="firebrick", linestyle="--", linewidth=1.2)
        marks.append(
            Line2D(
                [0], [0], color="firebrick", linestyle="--", linewidth=1.2, label=f"proven bound {lower_bound:.1f} s"
            )
        )
    return marks


def _legends(fig, clips: list[str], colour: dict, marks: list) -> None:
    from matplotlib.patches import Patch

    stages = [Patch(facecolor=face, hatch=hatch, edgecolor="black", label=label) for label, hatch, face in LEGEND]
    fig.legend(
        handles=stages + marks,
        loc="upper left",
        bbox_to_anchor=(0.85, 0.93),
        fontsize=8,
        title="stage",
        title_fontsize=8,
        frameon=False,
    )
    if len(clips) <= 20:
        fig.legend(
            handles=[Patch(facecolor=colour[c], edgecolor="black", label=c) for c in clips],
            loc="lower left",
            bbox_to_anchor=(0.85, 0.05),
            fontsize=8,
            title="clip",
            title_fontsize=8,
            frameon=False,
        )


def _colours(plt, clips: list[str]) -> dict:
    cmap = plt.get_cmap("tab20" if len(clips) > 10 else "tab10")
    return {c: cmap(i % cmap.N) for i, c in enumerate(clips)}


def _pyplot() -> Any:
    """matplotlib's pyplot on the file-only Agg backend (no display on a server)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    return plt


def _save(fig, plt, path: Path) -> Path:
    fig.tight_layout(rect=(0, 0, 0.845, 1))
    with atomic_writer(Path(path), "wb") as handle:
        fig.savefig(handle, format="png")
    plt.close(fig)
    return Path(path)


def draw(
    schedule: Schedule,
    resources: Resources,
    path: Path,
    title: str,
    lower_bound: float | None = None,
) -> Path:
    """Write ``schedule`` as a PNG to ``path`` (atomically) and return the path."""
    plt = _pyplot()
    lanes = _lanes(resources)
    colour = _colours(plt, schedule.clips)
    span = schedule.makespan or 1.0
    fig, ax = plt.subplots(figsize=(15, 1.2 + 0.75 * len(lanes)), dpi=110)
    _plot(ax, schedule, lanes, colour, span, len(schedule.clips) <= 60)
    marks = _marks(ax, span, lower_bound)
    ax.set_xlabel("seconds from the start of the batch")
    ax.set_title(title, fontsize=11, loc="left")
    _legends(fig, schedule.clips, colour, marks)
    return _save(fig, plt, path)


def draw_comparison(
    design: Schedule,
    chosen: Schedule,
    resources: Resources,
    path: Path,
    title: str,
    lower_bound: float | None = None,
) -> Path:
    """The design's round-robin above the chosen schedule, on one time axis (PNG, atomically)."""
    plt = _pyplot()
    lanes = _lanes(resources)
    colour = _colours(plt, chosen.clips)
    span = max(design.makespan, chosen.makespan) or 1.0
    fig, axes = plt.subplots(2, 1, figsize=(15, 2.4 + 1.5 * len(lanes)), dpi=110, sharex=True)
    marks = []
    for ax, schedule, name in ((axes[0], design, "design's round-robin"), (axes[1], chosen, chosen.policy)):
        _plot(ax, schedule, lanes, colour, span, len(chosen.clips) <= 60)
        marks = _marks(ax, schedule.makespan, lower_bound)
        ax.set_title(
            f"{title} — {name}: {schedule.makespan:.1f} s, {schedule.clips_per_hour:.2f} clips/h",
            fontsize=10,
            loc="left",
        )
    axes[1].set_xlabel("seconds from the start of the batch")
    _legends(fig, chosen.clips, colour, marks[1:] if len(marks) > 1 else [])
    return _save(fig, plt, path)
