"""``h3flow plan``'s report for people: tables that fit the terminal, text that wraps at words.

Nothing is ever cut: a table whose columns do not fit the width is split into several
tables that each repeat the topology column, and sentences wrap between words (ids,
figures and ``host-a->host-b`` stay whole). Piped, the width is rich's default (80
columns, or ``$COLUMNS``), the same as a terminal's.
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Callable, Sequence

from rich.console import Console
from rich.table import Table
from rich.text import Text

from h3flow.config.adapt import main_sampler_host
from h3flow.config.models import HostMap
from h3flow.planner.recommend import Evaluation, Recommendation

GAP = 2  # spaces between columns

Row = Sequence[str]


def print_report(evals: list[Evaluation], base: Evaluation, rec: Recommendation | None, out: dict, hm: HostMap) -> None:
    console = Console(highlight=False)
    width = console.width
    say = _sayer(console, width)
    say(f"plan: {out['batch']} on {out['hardware']}", style="bold")
    search = (
        f"{out['time_limit_s']:g} s of search in all (heuristics, local search, CP-SAT)"
        if out["policy"] == "best"
        else f"the {out['policy']} policy alone"
    )
    profile = "the shipped default" if out["profile"].endswith("profile-default.toml") else out["profile"]
    say(f"policy {out['policy']}: {search}; profile: {profile}", indent=2)
    console.print()
    rows = {r["topology"]: r for r in out["topologies"]}
    feasible = [e for e in evals if e.schedule is not None]
    names = [e.name for e in feasible]
    marks = [_mark(e, rec, out) for e in feasible]
    main: list[list[str]] = []
    detail: list[list[str]] = []
    for ev, name, mark in zip(feasible, names, marks, strict=True):
        r = rows[ev.name]
        gain = r["gain_over_baseline"]
        is_base = ev is base or ev.candidate.canonical == base.candidate.canonical
        main.append(
            [
                f"{mark:<2}{name}",
                f"{r['clips_per_hour']:.2f}",
                f"{r['steady_state_clips_per_hour']:.2f}",
                "base" if is_base else (f"{gain:+.1%}" if gain is not None else "-"),
                f"{r['makespan_s']:.1f}",
                f"{r['proven_bound_s']:.1f}",
                _gap(ev),
            ]
        )
        idle = ", ".join(
            f"{d} {pct:.0f}% idle, {r['decoder_idle_gaps_s'][d]:.0f} s gaps" for d, pct in r["decoder_idle_pct"].items()
        )
        detail.append([name, ev.method, f"{r['design_policy']['clips_per_hour']:.2f}", idle])
    fit_table(
        console,
        width,
        [
            ("  topology", "left"),
            ("clips/h", "right"),
            ("steady", "right"),
            ("vs base", "right"),
            ("makespan", "right"),
            ("bound", "right"),
            ("gap", "right"),
        ],
        main,
        keep=1,
    )
    console.print()
    fit_table(
        console,
        width,
        [("topology", "left"), ("found by", "left"), ("design RR", "right"), ("decoder", "left")],
        detail,
        keep=1,
    )
    console.print()
    say("busy share of the makespan:", style="bold")
    for ev, name in zip(feasible, names, strict=True):
        r = rows[ev.name]
        lenders = {p.encoder for p in ev.candidate.resources.samplers if p.encoder != p.name}  # type: ignore[union-attr]
        parts = [
            f"{k} {100 * v:.0f}%" + (" (encodes for others)" if k in lenders else "")
            for k, v in r["utilisation"].items()
        ]
        say(f"{name}: " + " · ".join(parts), indent=2, hang=4)
    console.print()
    for line in not_planned([e for e in evals if e.schedule is None]):
        say(line, style="dim", hang=2)
    say(baseline_line(base, hm), hang=2)
    modelled = sorted({f"{k} = {v}" for e in feasible for k, v in e.modelled.items()})
    modelled += [f"{k} = {v}" for k, v in out.get("profile_modelled", {}).items()]
    if modelled:
        say("modelled, not measured: " + "; ".join(modelled), style="yellow", hang=2)
    if out["profile_fitted"]:
        say(
            "fitted to the design's table, not measured: "
            + ", ".join(out["profile_fitted"])
            + " (`h3flow calibrate` refits them from real runs)",
            style="dim",
            hang=2,
        )
    console.print()
    if rec is None:
        say("no topology can run this batch on this hardware", style="bold red")
    elif rec.name is None:
        say(rec.sentence, style="bold", hang=2)
    else:
        say("recommended: " + rec.sentence, style="bold green", hang=2)
    for sentence in out.get("other_fits_said", []):
        say(sentence[0].upper() + sentence[1:] + ".", style="yellow", hang=2)
    console.print()
    legend = ["★ recommended"] if rec is not None and rec.name else []
    legend += ["• the topology of local.json"] if out["current_topology"] else []
    legend += [
        "clips/h: at this batch size",
        "steady: what a long batch of this mix approaches (throughput bound)",
        "vs base: gain over the baseline",
        "makespan: seconds, first encode to last mux",
        "bound: seconds no schedule beats (proven)",
        "gap: makespan over bound, 'optimal' only when proven; a topology that cannot be the fastest of those "
        "using the same hosts keeps its heuristic plan",
        "design RR: clips/h under the design's round-robin",
    ]
    say(" · ".join(legend), style="dim")
    if "gantt" in out:
        say(f"Gantt chart of {out['gantt']['topology']}: {out['gantt']['path']}")
    if "compare" in out:
        say(f"design's round-robin against the plan, {out['compare']['topology']}: {out['compare']['path']}")


def _sayer(console: Console, width: int) -> Callable[..., None]:
    def say(text: str, *, style: str | None = None, indent: int = 0, hang: int | None = None) -> None:
        """Print ``text`` wrapped between words at the console's width."""
        lines = textwrap.wrap(
            text,
            width=max(width, 20),
            initial_indent=" " * indent,
            subsequent_indent=" " * (indent + (hang if hang is not None else 0)),
            break_long_words=False,
            break_on_hyphens=False,
        )
        for line in lines or [""]:
            console.print(Text(line, style=style or ""), soft_wrap=True)

    return say


def _mark(ev: Evaluation, rec: Recommendation | None, out: dict) -> str:
    mark = "★" if rec and rec.name == ev.name else ""
    if out["current_topology"] and ev.candidate.canonical == _canonical(out["current_topology"]):
        mark += "•"
    return mark


def _canonical(name: str) -> str:
    from h3flow.config.topology import parse_topology

    return parse_topology(name).canonical


def _gap(ev: Evaluation) -> str:
    if ev.optimal:
        return "optimal"
    if ev.gap < 0.0001:
        return "<0.01%"
    return f"{ev.gap:.2%}"


def fit_table(
    console: Console,
    width: int,
    columns: list[tuple[str, str]],
    rows: list[list[str]],
    *,
    keep: int,
) -> None:
    """Print ``rows`` under ``columns`` (header, justify) as one table, or as several that each repeat the first
    ``keep`` columns, so that every table fits ``width`` and no cell is cut."""
    widths = [max([len(h)] + [Text(r[i]).cell_len for r in rows]) for i, (h, _) in enumerate(columns)]

    def size(cols: list[int]) -> int:
        return sum(widths[i] for i in cols) + GAP * (len(cols) - 1)

    groups: list[list[int]] = []
    current = list(range(keep))
    for i in range(keep, len(columns)):
        if size([*current, i]) <= width or len(current) == keep:
            current.append(i)
        else:
            groups.append(current)
            current = [*range(keep), i]
    groups.append(current)
    for n, cols in enumerate(groups):
        if n:
            console.print()
        table = Table(box=None, header_style="bold", pad_edge=False, padding=(0, GAP // 2), collapse_padding=False)
        for i in cols:
            header, justify = columns[i]
            table.add_column(header, justify=justify, no_wrap=True, min_width=widths[i], overflow="fold")  # type: ignore[arg-type]
        for r in rows:
            table.add_row(*[r[i] for i in cols])
        console.print(table, width=width)


_GPUS = re.compile(r"needs (\d+) GPUs on '([^']+)', which has (\d+)")


def not_planned(evals: list[Evaluation]) -> list[str]:
    """The topologies that cannot run here, one line per kind of reason (named, never cut)."""
    groups: dict[str, list[str]] = {}
    for ev in evals:
        reason = ev.candidate.reason or "cannot run"
        m = _GPUS.search(reason)
        if m:
            key = f"need more GPUs than {m.group(2)} has ({m.group(3)})"
        elif "DiT" in reason:
            key = "have a pool too small for the DiT"
        elif "text encoder" in reason:
            key = "have no pool that can hold the text encoder for another"
        else:
            key = reason
        groups.setdefault(key, []).append(ev.name)
    lines = []
    for key, names in groups.items():
        shown = names if len(names) <= 6 else [*names[:5], f"... {len(names) - 5} more"]
        what = "topology" if len(names) == 1 else "topologies"
        verb = key if len(names) > 1 else _singular(key)
        lines.append(f"not planned, {len(names)} {what} {verb}: {', '.join(shown)}")
    return lines


def _singular(key: str) -> str:
    return re.sub(r"^(need|have)\b", lambda m: {"need": "needs", "have": "has"}[m.group(1)], key)


def baseline_line(base: Evaluation, hm: HostMap) -> str:
    host = main_sampler_host(hm)
    models = sorted({g.model for g in host.gpus})
    cards = f"{len(host.gpus)} × {'/'.join(models)}" if host.gpus else "its GPUs"
    rate = f"{base.rate:.2f} clips/h" if base.schedule else "cannot run"
    return (
        f"base (the 'vs base' column) is {base.name}: all {cards} GPUs of {host.name} in one pool and no extra "
        f"sampler host, the simplest deployment of the same cards ({rate}); a gain over it is what the "
        f"topology alone buys"
    )
