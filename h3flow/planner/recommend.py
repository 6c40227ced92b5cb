"""Pick a topology with the 15% rule and say so, with what each figure rests on (table or JSON).

The threshold is for *extra hosts* (the XTX box, a second decoder host): a topology that
uses an extra host must beat the best topology without it by at least the threshold in
clips/h. How Host A's own GPUs are split into pools is never "extra hardware": those
topologies compete on clips/h alone. Each extra host's gain is reported at the batch
size asked for, in steady state, and as the batch size from which it pays off
(:mod:`~h3flow.planner.payoff`), each with its basis: the best schedules found, proven
bounds, or throughput bounds. With a single topology asked for there is nothing to
compare: no recommendation is made.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from h3flow.planner.payoff import Gain, Group, Payoff, Side, payoff, resized
from h3flow.planner.search import Candidate
from h3flow.planner.timing import PlanClip
from h3flow.planner.topologies import METHODS, Evaluation, _blocker, _fewer_hosts, choose, evaluate, hosts, plan_all

__all__ = [
    "BASELINE_WHY",
    "METHODS",
    "Evaluation",
    "Recommendation",
    "choose",
    "evaluate",
    "hosts",
    "plan_all",
    "recommend",
    "report_json",
    "resized",
    "row",
]


@dataclass(frozen=True)
class Recommendation:
    name: str | None  # None: nothing to choose between (one topology asked for)
    sentence: str
    rejected: str | None = None  # a faster topology whose extra host does not pay at this batch size
    payoffs: tuple[Payoff, ...] = ()


def _extra(small: Candidate, big: Candidate) -> str:
    parts = [f"the {h} host" for h in sorted(big.extras - small.extras)]
    parts += [f"decoder {d}" for d in sorted(big.decoders - small.decoders)]
    return " and ".join(parts) or "no extra host"


def _side(e: Evaluation) -> Side:
    return Side(e.name, e.schedule.makespan if e.schedule else 0.0, e.proven)


def _basis(small: Evaluation, big: Evaluation) -> str:
    g = Gain(big.clips, _side(big), _side(small))
    if big.optimal and small.optimal:
        return "both proven optimal"
    if abs(g.high - g.low) < 0.0005:
        return f"proven {g.low:+.1%}"
    return f"proven between {g.low:+.1%} and {g.high:+.1%}"


def recommend(
    evals: list[Evaluation],
    threshold: float,
    clips: Sequence[PlanClip] | None = None,
    *,
    seconds: float = 0.5,
    single: bool = False,
) -> Recommendation | None:
    """The recommendation (:func:`choose`) and why; with ``clips``, each extra host's pay-off scanned over
    batch sizes within ``seconds``. ``single``: one topology was asked for — say so, recommend nothing."""
    ok = [e for e in evals if e.schedule is not None and not e.reference]
    if not ok:
        return None
    pct = f"{threshold:.0%}"
    if single:
        e = ok[0]
        return Recommendation(
            None,
            f"only {e.name} was planned: nothing to compare it with, so no recommendation "
            f"(--topology all or search plans the alternatives)",
        )
    rec = choose(ok, threshold)
    n = rec.clips
    why = f"{rec.rate:.2f} clips/h at {n} clips ({rec.steady:.2f} in steady state)"
    if len(ok) == 1:
        why = f"the only topology asked for that runs on this hardware, {why}"
    smaller = [s for s in ok if _fewer_hosts(s, rec)]
    if smaller:
        nearest = max(smaller, key=lambda s: (len(hosts(s.candidate)), s.rate))
        why += (
            f", {rec.rate / nearest.rate - 1:+.1%} over {nearest.name} ({_basis(nearest, rec)}; at least {pct}): "
            f"worth {_extra(nearest.candidate, rec.candidate)}"
        )
    rejected = None
    faster = [e for e in ok if e.rate > rec.rate * (1 + 1e-9)]
    if faster:  # the fastest of all did not pay for its extra host: say against what
        top = max(faster, key=lambda e: e.rate)
        base = _blocker(ok, top, threshold) or rec
        rejected = (
            f"{top.name} would add only {top.rate / base.rate - 1:+.1%} over {base.name} at {n} clips "
            f"({_basis(base, top)}; under {pct}): not worth {_extra(base.candidate, top.candidate)} "
            f"at this batch size"
        )
    payoffs = tuple(_payoffs(ok, rec, threshold, clips, time.perf_counter() + seconds)) if clips else ()
    modelled = sorted(rec.modelled)
    caveat = f" (rests on modelled times: {'; '.join(modelled)})" if modelled else ""
    parts = [f"{rec.name}: {why}"] + ([rejected] if rejected else []) + [p.sentence() for p in payoffs]
    return Recommendation(rec.name, "; ".join(parts) + "." + caveat, rejected, payoffs)


def _payoffs(
    ok: list[Evaluation], rec: Evaluation, threshold: float, clips: Sequence[PlanClip], deadline: float
) -> list[Payoff]:
    """For each extra host: the best topologies with and without it (around the recommendation)."""
    out = []
    every = sorted({h for e in ok for h in hosts(e.candidate)})
    plans = [(h, _group(ok, hosts(rec.candidate) | {h}), _group(ok, hosts(rec.candidate) - {h})) for h in every]
    todo = [(h, w, wo) for h, w, wo in plans if w is not None and wo is not None]
    for i, (host, with_, without) in enumerate(todo):
        share = (deadline - time.perf_counter()) / (len(todo) - i)
        assert with_ is not None and without is not None
        out.append(payoff(host, with_, without, clips, threshold, time.perf_counter() + share))
    return out


def _group(ok: list[Evaluation], wanted: frozenset[str]) -> Group | None:
    members = [e for e in ok if hosts(e.candidate) == wanted and e.planner is not None and e.search is not None]
    if not members:
        return None
    return Group(
        [(e.name, e.planner, e.search) for e in members if e.planner and e.search], {e.name: e.steady for e in members}
    )


# --------------------------------------------------------------------------- output
def row(ev: Evaluation, base: Evaluation | None, with_schedule: bool = True) -> dict[str, Any]:
    c = ev.candidate
    out: dict[str, Any] = {"topology": ev.name, "canonical": c.canonical, "feasible": c.feasible}
    if ev.reference:
        out["reference_only"] = True  # the baseline, planned for comparison: not a candidate
    if not c.feasible or ev.schedule is None:
        out["reason"] = c.reason
        return out
    s, res = ev.schedule, c.resources
    assert res is not None and ev.bound is not None and ev.design is not None
    util = s.utilisation(res.names)
    decoders = ev.decoder_names()
    out.update(
        method=ev.method,
        makespan_s=round(s.makespan, 3),
        clips_per_hour=round(s.clips_per_hour, 3),
        steady_state_clips_per_hour=round(ev.steady, 3),
        gain_over_baseline=round(s.clips_per_hour / base.rate - 1, 5) if base and base.rate else None,
        design_policy={
            "makespan_s": round(ev.design.makespan, 3),
            "clips_per_hour": round(ev.design.clips_per_hour, 3),
        },
        proven_bound_s=round(ev.proven, 3),
        proven_by=ev.proven_by,
        proven_optimal=ev.optimal,
        gap=ev.gap,
        analytic_bound_s=round(ev.bound.seconds, 3),
        analytic_bound_binding=ev.bound.binding,
        search_s=round(ev.best.seconds, 3) if ev.best else 0.0,
        utilisation={k: round(v, 4) for k, v in util.items()},
        decoder_idle_pct={d: round(100 * (1 - util[d]), 2) for d in decoders},
        decoder_idle_gaps_s={d: round(s.idle_gaps(d), 3) for d in decoders},
        pools={
            p.name: f"{p.degree}x{p.gpu_model}" + (f" (encoded on {p.encoder})" if p.encoder != p.name else "")
            for p in res.samplers
        },
        modelled=ev.modelled,
    )
    if with_schedule:
        out["schedule"] = s.per_clip()
    return out


def report_json(
    evals: list[Evaluation], base: Evaluation, rec: Recommendation | None, meta: dict[str, Any]
) -> dict[str, Any]:
    return {
        **meta,
        "baseline": {
            "topology": base.name,
            "clips_per_hour": round(base.rate, 3),
            "why": BASELINE_WHY,
        },
        "topologies": [row(e, base) for e in evals],
        "recommendation": {
            "topology": rec.name,
            "why": rec.sentence,
            "extra_hosts": [p.as_json() for p in rec.payoffs],
        }
        if rec
        else None,
    }


BASELINE_WHY = (
    "every GPU of the main sampler host in one pool and no extra sampler: the same cards as the "
    "other topologies in their simplest deployment, so the gain is what the topology alone buys"
)
