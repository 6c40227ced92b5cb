"""Modelled figures and the other fits: which ones a plan rests on, and what it would recommend under each.

The profile lists entries derived by a model rather than measured (``[modelled]``) and
other fits that meet the same measurements as well (``[alternatives]``). A plan *uses*
an entry or a fit when changing it changes a stage time of the batch on a feasible
topology. For every fit it uses, the topologies are planned again under it (heuristics
and a short search) and the recommendation compared: the plan prints both.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from h3flow.core.errors import ConfigError
from h3flow.planner.profile import Profile
from h3flow.planner.search import Candidate
from h3flow.planner.timing import PlanClip, Planner


@dataclass(frozen=True)
class Outcome:
    """The plan under another fit."""

    name: str
    why: str
    recommended: str | None
    same: bool  # the same topology as under the profile as given
    steady: dict[str, float]  # extra host -> its steady-state gain under this fit

    def sentence(self, recommended: str | None, steady: dict[str, float]) -> str:
        gains = ", ".join(
            f"the {h} host {g:+.1%} in steady state" + (f" (not {steady[h]:+.1%})" if h in steady else "")
            for h, g in sorted(self.steady.items())
        )
        verdict = (
            f"the recommendation holds ({recommended})"
            if self.same
            else f"the recommendation would be {self.recommended} instead of {recommended}"
        )
        return f"under the other fit '{self.name}' ({self.why}): {verdict}" + (f"; {gains}" if gains else "")

    def as_json(self) -> dict[str, Any]:
        return {
            "fit": self.name,
            "why": self.why,
            "recommendation": self.recommended,
            "same": self.same,
            "steady_state_gains": {h: round(g, 5) for h, g in self.steady.items()},
        }


def _times(profile: Profile, candidates: list[Candidate], clips: list[PlanClip]) -> list[tuple[float, ...]]:
    """Every stage time of one clip of each kind on every feasible topology (what a plan reads)."""
    kinds = list({(c.spec, c.frames): c for c in clips}.values())
    out = []
    for cand in candidates:
        if cand.resources is None:
            continue
        planner = Planner(profile, cand.resources)
        for clip in kinds:
            row: list[float] = []
            for pool in cand.resources.samplers:
                t = planner.sampler_times(clip, pool)
                row += [t.encode, t.offload, t.sample, t.handoff]
            for dec in cand.resources.decoders:
                row += list(planner.decoder_times(clip, dec))
            out.append(tuple(round(v, 9) for v in row))
    return out


def _changes(base: Profile, other: Profile, candidates: list[Candidate], clips: list[PlanClip]) -> bool:
    try:
        return _times(base, candidates, clips) != _times(other, candidates, clips)
    except ConfigError:
        return False


def _used(profile: Profile, entry: str, candidates: list[Candidate], clips: list[PlanClip]) -> bool:
    value = profile.entry(entry)
    if not isinstance(value, (int, float)):
        return False
    return _changes(profile, profile.with_entries({entry: value * 1.1}, profile.source), candidates, clips)


def modelled_entries(profile: Profile, candidates: list[Candidate], clips: list[PlanClip]) -> dict[str, str]:
    """The profile's modelled entries this plan reads: entry -> "value s: how it was derived"."""
    return {
        entry: f"{profile.entry(entry):g} s: {how}"
        for entry, how in profile.data.modelled.items()
        if _used(profile, entry, candidates, clips)
    }


def fitted_used(profile: Profile, candidates: list[Candidate], clips: list[PlanClip]) -> list[str]:
    """The profile's fitted entries (solved to meet the design's table, not measured) this plan reads."""
    return [entry for entry in profile.data.fitted if _used(profile, entry, candidates, clips)]


def fits_used(profile: Profile, candidates: list[Candidate], clips: list[PlanClip]) -> list[str]:
    """The other fits that change a stage time of this batch on some feasible topology."""
    return [name for name in profile.data.alternatives if _changes(profile, profile.variant(name), candidates, clips)]


def under(
    profile: Profile,
    name: str,
    candidates: list[Candidate],
    clips: list[PlanClip],
    method: str,
    threshold: float,
    seconds: float,
    recommended: str | None,
) -> Outcome:
    """Plan again under the fit ``name`` and say what it would recommend."""
    from h3flow.planner.topologies import choose, hosts, plan_all

    other = profile.variant(name)
    evals = plan_all(candidates, clips, other, method, seconds=seconds, threshold=threshold, design=False)
    ok = [e for e in evals if e.schedule is not None]
    rec = choose(ok, threshold) if ok else None
    steady: dict[str, float] = {}
    if rec is not None:
        mine = hosts(rec.candidate)
        for h in sorted({h for e in ok for h in hosts(e.candidate)}):
            best_with = max((e.steady for e in ok if hosts(e.candidate) == mine | {h}), default=0.0)
            best_without = max((e.steady for e in ok if hosts(e.candidate) == mine - {h}), default=0.0)
            if best_with and best_without:
                steady[h] = best_with / best_without - 1
    picked = rec.name if rec else None
    return Outcome(name, profile.data.alternatives[name].why, picked, picked == recommended, steady)
