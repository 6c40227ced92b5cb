"""An independent check of a schedule: it shares no code with the simulator.

It checks what any real execution must satisfy: every clip runs every stage once, in
order (precedence); each stage runs on the right resource (encode/offload on the
clip's encoder pool, sample/handoff on its pool, transfer on the link from the pool's
host to the decoder's host, decode/mux on one decoder) and lasts at least its profile
time; no resource does two things at once; a sampler pool holds one clip at a time.
"""

from __future__ import annotations

import itertools
from bisect import bisect_left, bisect_right
from collections.abc import Sequence

from h3flow.planner.timing import ClipLike, Planner

ORDER = ("encode", "offload", "sample", "handoff", "transfer", "decode", "mux")
EPS = 1e-6


def validate(schedule, planner: Planner, clips: Sequence[ClipLike]) -> list[str]:
    """Every violation found, as one line each; empty when the schedule is valid."""
    problems: list[str] = []
    res = planner.resources
    pools = {p.name: p for p in res.samplers}
    decoders = {d.name: d for d in res.decoders}
    links = {(lk.source, lk.target): lk.name for lk in res.links}
    link_named = {lk.name: lk for lk in res.links}
    by_clip: dict[str, dict[str, list]] = {}
    for run in schedule.runs:
        if run.end < run.start - EPS:
            problems.append(f"{run.clip} {run.stage}: ends before it starts")
        by_clip.setdefault(run.clip, {}).setdefault(run.stage, []).append(run)
    if set(by_clip) != {c.id for c in clips}:
        problems.append(f"clips scheduled {sorted(by_clip)} != clips asked {sorted(c.id for c in clips)}")
    holds: dict[str, list[tuple[float, float, str]]] = {}
    for clip in clips:
        stages = by_clip.get(clip.id, {})
        if sorted(stages) != sorted(ORDER) or any(len(v) != 1 for v in stages.values()):
            problems.append(
                f"{clip.id}: stages {sorted((s, len(v)) for s, v in stages.items())}, want each of {ORDER} once"
            )
            continue
        run = {s: v[0] for s, v in stages.items()}
        for before, after in itertools.pairwise(ORDER):
            if run[after].start < run[before].end - EPS:
                problems.append(
                    f"{clip.id}: {after} starts at {run[after].start:.3f} before {before} ends at {run[before].end:.3f}"
                )
        pool = pools.get(run["sample"].resource)
        decoder = decoders.get(run["decode"].resource)
        if pool is None or decoder is None:
            where = f"sampled on {run['sample'].resource!r} / decoded on {run['decode'].resource!r}"
            problems.append(f"{clip.id}: {where}: not a sampler / decoder")
            continue
        expect_resource = {
            "encode": pool.encoder,
            "offload": pool.encoder,
            "handoff": pool.name,
            "transfer": links.get((pool.host, decoder.host)),
            "mux": decoder.name,
        }
        for stage, want in expect_resource.items():
            if run[stage].resource != want:
                problems.append(f"{clip.id}: {stage} on {run[stage].resource!r}, want {want!r}")
        t = planner.sampler_times(clip, pool)
        link = link_named.get(run["transfer"].resource)
        decode, mux = planner.decoder_times(clip, decoder)
        minimum = {
            "encode": t.encode,
            "offload": t.offload,
            "sample": t.sample,
            "handoff": t.handoff,
            "transfer": planner.transfer_time(clip, link) if link else 0.0,
            "decode": decode,
            "mux": mux,
        }
        for stage, least in minimum.items():
            took = run[stage].end - run[stage].start
            if took < least - EPS:
                problems.append(f"{clip.id}: {stage} took {took:.3f} s, less than its profile time {least:.3f} s")
        first = "encode" if pool.encoder == pool.name else "sample"
        holds.setdefault(pool.name, []).append((run[first].start, run["handoff"].end, clip.id))
    # no resource does two things at once
    per_resource: dict[str, list] = {}
    for r in schedule.runs:
        per_resource.setdefault(r.resource, []).append(r)
    for name, runs in per_resource.items():
        runs.sort(key=lambda r: (r.start, r.end))
        for a, b in itertools.pairwise(runs):
            if b.start < a.end - EPS:
                first, second = f"[{a.start:.3f}, {a.end:.3f}]", f"[{b.start:.3f}, {b.end:.3f}]"
                problems.append(f"{name}: {a.clip} {a.stage} {first} overlaps {b.clip} {b.stage} {second}")
    # a pool holds one clip at a time: nothing else runs on it while it holds one
    for name, spans in holds.items():
        runs = per_resource.get(name, [])  # sorted by start, and (unless reported above) disjoint
        starts, ends = [r.start for r in runs], [r.end for r in runs]
        for start, end, cid in spans:
            for r in runs[bisect_right(ends, start + EPS) : bisect_left(starts, end - EPS)]:
                if r.clip != cid:
                    problems.append(
                        f"{name}: {r.clip} {r.stage} runs while the pool holds {cid} [{start:.3f}, {end:.3f}]"
                    )
    return problems
