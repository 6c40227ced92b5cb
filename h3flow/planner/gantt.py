"""A Gantt chart of a schedule: one lane per resource, one colour per clip (matplotlib, PNG).

Sampling and decoding are solid bars; encode + offload are hatched so a borrowed encode
(the XTX's clips on Host A's first pool) stands out; the handoff, transfer and mux are
thin. matplotlib is imported here only, so planning without a chart never loads it.
"""

from __future__ import annotations

from pathlib import Path

from h3flow.core.fsutil import atomic_writer
from h3flow.planner.resources import Resources
from h3flow.planner.simulate import Schedule

STYLE = {  # stage -> (bar height as a share of the lane, hatch, alpha)
    "encode": (0.78, "////", 0.55),
    "offload": (0.78, "....", 0.45),
    "sample": (0.78, "", 0.95),
    "handoff": (0.78, "", 0.95),
    "transfer": (0.78, "", 0.95),
    "decode": (0.78, "", 0.95),
    "mux": (0.78, "xxx", 0.6),
}


def draw(
    schedule: Schedule,
    resources: Resources,
    path: Path,
    title: str,
    lower_bound: float | None = None,
) -> Path:
    """Write ``schedule`` as a PNG to ``path`` (atomically) and return the path."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    lanes = [
        (p.name, p.label + (f"\nencoded on {p.encoder}" if p.encoder != p.name else "")) for p in resources.samplers
    ]
    lanes += [(lk.name, lk.label) for lk in resources.links]
    lanes += [(d.name, d.label) for d in resources.decoders]
    row = {name: i for i, (name, _) in enumerate(lanes)}
    clips = schedule.clips
    cmap = plt.get_cmap("tab20" if len(clips) > 10 else "tab10")
    colour = {c: cmap(i % cmap.N) for i, c in enumerate(clips)}
    span = schedule.makespan or 1.0

    fig_h = 1.2 + 0.75 * len(lanes)
    fig, ax = plt.subplots(figsize=(15, fig_h), dpi=110)
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
        if run.stage in ("sample", "decode") and len(clips) <= 60 and (run.end - run.start) > span * 0.028:
            ax.text(
                run.start + (run.end - run.start) / 2, y, run.clip, ha="center", va="center", fontsize=8, color="black"
            )
    marks = [Line2D([0], [0], color="black", linewidth=1.2, label=f"makespan {span:.1f} s")]
    ax.axvline(span, color="black", linewidth=1.2)
    if lower_bound:
        ax.axvline(lower_bound, color="firebrick", linestyle="--", linewidth=1.2)
        marks.append(
            Line2D([0], [0], color="firebrick", linestyle="--", linewidth=1.2, label=f"lower bound {lower_bound:.1f} s")
        )
    ax.set_yticks(range(len(lanes)))
    ax.set_yticklabels([label for _, label in lanes], fontsize=9)
    ax.set_ylim(len(lanes) - 0.4, -0.7)
    ax.set_xlim(0, span * 1.02)
    ax.set_xlabel("seconds from the start of the batch")
    ax.grid(axis="x", linestyle=":", linewidth=0.5, alpha=0.7)
    ax.set_axisbelow(True)
    ax.set_title(title, fontsize=11, loc="left")
    stages = [
        Patch(facecolor="lightgrey", hatch="////", edgecolor="black", label="encode"),
        Patch(facecolor="lightgrey", hatch="....", edgecolor="black", label="offload"),
        Patch(facecolor="grey", edgecolor="black", label="sample / transfer / decode"),
        Patch(facecolor="lightgrey", hatch="xxx", edgecolor="black", label="mux"),
        *marks,
    ]
    fig.legend(
        handles=stages,
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
            bbox_to_anchor=(0.85, 0.08),
            fontsize=8,
            title="clip",
            title_fontsize=8,
            frameon=False,
        )
    fig.tight_layout(rect=(0, 0, 0.845, 1))
    with atomic_writer(Path(path), "wb") as handle:
        fig.savefig(handle, format="png")
    plt.close(fig)
    return Path(path)
