"""``h3flow plan``: read the hardware and the batch, evaluate topologies, print, draw."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Annotated, Optional

import typer

from h3flow.cli.base import SET_UP, ConfigOpt, app, config_file, console, find_config, operator_command
from h3flow.cli.plan_view import print_report
from h3flow.config.models import HostMap, load_host_map, load_local_config
from h3flow.core.batch import load_batch
from h3flow.core.errors import ConfigError
from h3flow.core.specs import get_spec
from h3flow.planner.alternatives import fits_used, fitted_used, modelled_entries, under
from h3flow.planner.best import DEFAULT_TIME_LIMIT
from h3flow.planner.profile import DEFAULT_PROFILE, load_profile
from h3flow.planner.recommend import METHODS, plan_all, recommend, report_json
from h3flow.planner.search import baseline, build, candidates
from h3flow.planner.timing import PlanClip
from h3flow.planner.topologies import leaders, leading

DEFAULT_CLIPS = 6
JSON_INDENT_CLIPS = 100


def hardware(host_map: Path | None, config: Path | None) -> tuple[HostMap, str, str | None]:
    """(host map, where it came from, the config's current topology)."""
    from h3flow.config.adapt import host_map_of

    if host_map and config:
        raise ConfigError("give --host-map or --config, not both")
    if host_map:
        return load_host_map(host_map), str(host_map), None
    path = find_config(config)
    if path is None:
        raise ConfigError(
            "no hardware to plan for: pass --host-map host-map.json (e.g. examples/host-map.example.json) "
            "or --config local.json (none in $H3FLOW_CONFIG, ./local.json or ./.h3flow/local.json)"
        )
    local = load_local_config(config_file(path))
    return host_map_of(local), str(path), local.topology


def batch_clips(spec: str | None, batch: Path | None, clips: int | None) -> tuple[list[PlanClip], str]:
    if spec and batch:
        raise ConfigError("give --spec or --batch, not both")
    if batch:
        if clips is not None:
            raise ConfigError("--clips goes with --spec; a --batch file plans its own clips")
        loaded = load_batch(batch, check_images=False)
        return [PlanClip.of(c) for c in loaded.clips], f"batch {batch} ({len(loaded.clips)} clips)"
    name = spec or "sd"
    get_spec(name)
    n = DEFAULT_CLIPS if clips is None else clips
    if n < 1:
        raise ConfigError("--clips must be at least 1")
    return [PlanClip.make(f"{name}-{i + 1:02d}", name) for i in range(n)], f"{n} x {name} clips of 5 s"


def run_plan(
    *,
    spec: str | None = None,
    batch: Path | None = None,
    clips: int | None = None,
    topology: str = "all",
    profile: Path | None = None,
    threshold: float = 0.15,
    gantt: Path | None = None,
    as_json: bool = False,
    host_map: Path | None = None,
    config: Path | None = None,
    policy: str = "best",
    time_limit: float = DEFAULT_TIME_LIMIT,
    compare: Path | None = None,
) -> dict:
    if policy not in METHODS:
        raise ConfigError(f"unknown policy {policy!r} (known: {', '.join(METHODS)})")
    if not 0 <= threshold < 10:
        raise ConfigError(f"--threshold {threshold} is not a fraction such as 0.15")
    if not 0 <= time_limit <= 3600:
        raise ConfigError(f"--time-limit {time_limit}: give seconds from 0 (heuristics only) to 3600")
    for flag, path in (("--gantt", gantt), ("--compare", compare)):
        if path is not None and path.suffix.lower() != ".png":
            raise ConfigError(f"{flag} {path}: the chart is a PNG; name the file *.png")
    began = time.perf_counter()
    hm, source, current = hardware(host_map, config)
    plan_clips, what = batch_clips(spec, batch, clips)
    prof = load_profile(profile)
    cands = candidates(hm, topology, prof)
    base_cand = baseline(hm, prof)
    names = {c.canonical for c in cands}
    if topology == "all" and current:  # the config's own topology is always a candidate
        own = build(hm, current, prof)
        if own.canonical not in names:
            cands.append(own)
            names.add(own.canonical)
    reference = frozenset() if base_cand.canonical in names else frozenset({base_cand.canonical})
    if reference:  # the baseline, planned for the 'vs base' column only
        cands.append(base_cand)
    single = topology not in ("all", "search")
    asked = [c for c in cands if c.canonical not in reference]
    fits = fits_used(prof, asked, plan_clips) if policy == "best" and not single else []
    clock = Clock(began + time_limit - reserve(len(plan_clips), sum(c.feasible for c in cands), as_json))
    evals = plan_all(
        cands,
        plan_clips,
        prof,
        policy,
        seconds=clock.share(1.0 if single else 0.7),
        threshold=threshold,
        reference=reference,
        prove_until=None if single else clock.deadline,
    )
    same = [
        e for e in evals if (e.candidate.canonical, e.candidate.decoders) == (base_cand.canonical, base_cand.decoders)
    ]
    base = same[0]
    lead = None if single else leading(evals, threshold)
    if lead is not None:  # its bound goes on rising beside the pay-off scan and the other fits
        lead.prove_beside(clock.deadline)
    try:
        rec = recommend(evals, threshold, plan_clips, seconds=clock.share(0.6 if fits else 1.0), single=single)
        outcomes = []
        if rec and rec.name:
            for i, name in enumerate(fits):
                seconds = clock.share(1 / (len(fits) - i))
                outcomes.append(under(prof, name, leaders(evals), plan_clips, policy, threshold, seconds, rec.name))
    finally:
        if lead is not None:
            lead.settle()
    meta = {
        "hardware": source,
        "profile": str(profile or DEFAULT_PROFILE),
        "profile_fitted": fitted_used(prof, cands, plan_clips),
        "profile_modelled": modelled_entries(prof, cands, plan_clips),
        "batch": what,
        "clips": len(plan_clips),
        "policy": policy,
        "time_limit_s": time_limit,
        "threshold": threshold,
        "current_topology": current,
    }
    out = report_json(evals, base, rec, meta)
    out["other_fits"] = [o.as_json() for o in outcomes]
    if rec is not None:
        steady = {p.host: p.steady_gain for p in rec.payoffs}
        out["other_fits_said"] = [o.sentence(rec.name, steady) for o in outcomes]
    target = next((e for e in evals if rec and e.name == rec.name), None) or next(
        (e for e in evals if e.schedule), None
    )
    if gantt or compare:
        if target is None or target.schedule is None or target.design is None:
            raise ConfigError("no feasible topology to draw")
        from h3flow.planner.gantt import draw, draw_comparison

        resources = target.candidate.resources
        assert resources is not None  # a recommended topology is feasible
        s = target.schedule
        title = f"{target.name} — {what} — {target.method} — {s.makespan:.1f} s, {s.clips_per_hour:.2f} clips/h"
        for flag, path in (("--gantt", gantt), ("--compare", compare)):
            if path is None:
                continue
            try:
                if path is gantt:
                    draw(s, resources, path, title, target.proven)
                else:
                    draw_comparison(target.design, s, resources, path, f"{target.name} — {what}", target.proven)
            except OSError as exc:
                raise ConfigError(f"{flag} {path}: cannot write: {exc}") from None
        if gantt:
            out["gantt"] = {"topology": target.name, "path": str(gantt)}
        if compare:
            out["compare"] = {"topology": target.name, "path": str(compare)}
    if as_json:  # indented for people up to 100 clips; above, compact (json's fast encoder: megabytes of schedule)
        sys.stdout.write(json.dumps(out, indent=2 if len(plan_clips) <= JSON_INDENT_CLIPS else None) + "\n")
    else:
        print_report(evals, base, rec, out, hm)
    return out


class Clock:
    """The plan's time: every phase searches for a share of what is left before ``deadline``."""

    def __init__(self, deadline: float) -> None:
        self.deadline = deadline

    def share(self, fraction: float) -> float:
        return max(0.0, self.deadline - time.perf_counter()) * fraction


def reserve(clips: int, topologies: int, as_json: bool) -> float:
    """Seconds kept back from the search for validating and printing the plan (measured: ~0.05 ms per clip and
    feasible topology to validate, ~0.02 more to write as JSON; an infeasible one has no schedule)."""
    return 0.05 + clips * topologies * (7e-5 if as_json else 5e-5)


@app.command(rich_help_panel=SET_UP)
@operator_command
def plan(
    spec: Annotated[Optional[str], typer.Option(help="Plan --clips clips of this spec: sd | hd (default sd).")] = None,
    batch: Annotated[Optional[Path], typer.Option(help="Plan the clips of this batch file instead.")] = None,
    clips: Annotated[Optional[int], typer.Option(help="How many clips of --spec (default 6, the design's).")] = None,
    topology: Annotated[
        str,
        typer.Option(help="A topology (four_four_plus_one, 4+2+2+xtx), 'all' named ones, or 'search' every partition."),
    ] = "all",
    profile: Annotated[Optional[Path], typer.Option(help="Stage-time profile TOML (default: the shipped one).")] = None,
    threshold: Annotated[float, typer.Option(help="Extra hardware must add at least this share of clips/h.")] = 0.15,
    gantt: Annotated[
        Optional[Path], typer.Option(help="Write the recommended topology's Gantt chart here (PNG).")
    ] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the plan as JSON.")] = False,
    host_map: Annotated[Optional[Path], typer.Option("--host-map", help="The hardware, as a host-map.json.")] = None,
    config: Annotated[
        Optional[Path],
        typer.Option(
            "--config",
            "-c",
            help="The hardware, as a local.json (default: $H3FLOW_CONFIG, else ./local.json, else ./.h3flow/local.json).",
        ),
    ] = None,
    policy: Annotated[
        str,
        typer.Option(help="best (heuristics + local search + CP-SAT) | earliest-finish | design (round-robin)."),
    ] = "best",
    time_limit: Annotated[
        float,
        typer.Option("--time-limit", help="Seconds for the whole plan: the search stops in time (0: heuristics only)."),
    ] = DEFAULT_TIME_LIMIT,
    compare: Annotated[
        Optional[Path],
        typer.Option(help="Write the design's round-robin and the chosen schedule, one above the other (PNG)."),
    ] = None,
) -> None:
    """Step 3: plan topologies offline (schedule, proven bound, gap) and recommend one."""
    run_plan(
        spec=spec,
        batch=batch,
        clips=clips,
        topology=topology,
        profile=profile,
        threshold=threshold,
        gantt=gantt,
        as_json=json_out,
        host_map=host_map,
        config=config,
        policy=policy,
        time_limit=time_limit,
        compare=compare,
    )


@app.command(rich_help_panel=SET_UP)
@operator_command
def calibrate(
    run_ids: Annotated[list[str], typer.Argument(help="Finished runs to learn stage times from.")],
    output: Annotated[Path, typer.Option("-o", "--output", help="The calibrated profile (TOML).")] = Path(
        "profile.toml"
    ),
    base: Annotated[Optional[Path], typer.Option(help="Profile to start from (default: the shipped one).")] = None,
    config: ConfigOpt = None,
) -> None:
    """Fit the planner's profile from the measured stage durations of runs (`plan --profile` reads it)."""
    from h3flow.pipeline.calibration import run_calibrate

    for note in run_calibrate(run_ids, config_file(config), output, base):
        console.print(f"  {note}")
    console.print(f"[green]✓[/] wrote {output}")
