"""The simulator: a batch over a topology's resources under a policy -> a :class:`Schedule`.

Per clip: encode -> offload (on the clip's encoder pool) -> sample -> handoff write (on
its sampler pool) -> transfer (on the link to the decoder's host) -> decode -> mux (on
a decoder). Every resource does one stage at a time.

1. Dispatch, in the policy's order: the policy names a pool; the clip's sampler-side
   stages are booked on its encoder pool and pool as soon as each is free (each pool
   serves its requests in dispatch order, as a ComfyUI queue does). The policy's state
   also carries projected link and decoder times, as the live dispatcher's would.
2. Delivery, as the latents are written: each goes over its link in the order latents
   are handed off, to the decoder that would start it first; each decoder takes the
   latents in the order they arrive (one shared FIFO decode queue per decoder).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from h3flow.batch import Batch
from h3flow.errors import ConfigError
from h3flow.planner.policies import Policy, State, project
from h3flow.planner.timing import ClipLike, Planner

STAGES = ("encode", "offload", "sample", "handoff", "transfer", "decode", "mux")


@dataclass(frozen=True, slots=True)
class StageRun:
    clip: str
    stage: str
    resource: str
    start: float
    end: float


@dataclass
class Schedule:
    """Per clip, per stage: (resource, start, end). Times in seconds from the batch's start."""

    topology: str
    policy: str
    clips: list[str]
    runs: list[StageRun]
    pool_of: dict[str, str] = field(default_factory=dict)
    decoder_of: dict[str, str] = field(default_factory=dict)

    @property
    def makespan(self) -> float:
        return max((r.end for r in self.runs), default=0.0)

    @property
    def clips_per_hour(self) -> float:
        return len(self.clips) * 3600.0 / self.makespan if self.makespan > 0 else 0.0

    def busy(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for r in self.runs:
            out[r.resource] = out.get(r.resource, 0.0) + (r.end - r.start)
        return out

    def utilisation(self, resources: Iterable[str]) -> dict[str, float]:
        busy, span = self.busy(), self.makespan or 1.0
        return {name: busy.get(name, 0.0) / span for name in resources}

    def idle_gaps(self, resource: str) -> float:
        """Seconds ``resource`` sits idle between its first start and its last end."""
        runs = sorted((r for r in self.runs if r.resource == resource), key=lambda r: r.start)
        if not runs:
            return 0.0
        return (runs[-1].end - runs[0].start) - sum(r.end - r.start for r in runs)

    def by_clip(self) -> dict[str, list[StageRun]]:
        out: dict[str, list[StageRun]] = {c: [] for c in self.clips}
        for r in self.runs:
            out[r.clip].append(r)
        return out


def clips_of(batch_or_clips: Batch | Sequence[ClipLike]) -> list[ClipLike]:
    clips = list(batch_or_clips.clips if isinstance(batch_or_clips, Batch) else batch_or_clips)
    if not clips:
        raise ConfigError("nothing to plan: the batch has no clips")
    ids = [c.id for c in clips]
    if len(set(ids)) != len(ids):
        raise ConfigError("clip ids must be unique")
    return clips


def simulate(batch_or_clips: Batch | Sequence[ClipLike], planner: Planner, policy: Policy) -> Schedule:
    """Simulate the batch on ``planner``'s topology under ``policy``."""
    clips = clips_of(batch_or_clips)
    res = planner.resources
    policy.reset()
    free: dict[str, float] = {name: 0.0 for name in res.names}
    state = State(busy_until=free)
    runs: list[StageRun] = []
    sampled: list[tuple[float, int, ClipLike, str]] = []
    pool_of: dict[str, str] = {}

    # 1. dispatch: book the sampler side; keep projected delivery in the policy's view
    for i, clip in enumerate(policy.order(clips)):
        name = policy.choose_pool(clip, state)
        pool = res.pool(name)
        t = planner.sampler_times(clip, pool)
        p = project(planner, clip, name, state)
        enc_start = free[pool.encoder]
        encoded = enc_start + t.encode
        runs.append(StageRun(clip.id, "encode", pool.encoder, enc_start, encoded))
        runs.append(StageRun(clip.id, "offload", pool.encoder, encoded, encoded + t.offload))
        free[pool.encoder] = encoded + t.offload
        sample_start = max(free[name], encoded + t.offload)
        sampled_at = sample_start + t.sample
        runs.append(StageRun(clip.id, "sample", name, sample_start, sampled_at))
        runs.append(StageRun(clip.id, "handoff", name, sampled_at, sampled_at + t.handoff))
        free[name] = sampled_at + t.handoff
        free[p.link] = p.arrived
        free[p.decoder] = p.finished
        sampled.append((free[name], i, clip, name))
        pool_of[clip.id] = name

    # 2. delivery: links in handoff order, decoders in arrival order
    link_free = {lk.name: 0.0 for lk in res.links}
    dec_free = {d.name: 0.0 for d in res.decoders}
    arrivals: list[tuple[float, int, ClipLike, str]] = []
    for handed, i, clip, name in sorted(sampled, key=lambda s: (s[0], s[1])):
        pool = res.pool(name)
        best = None
        for dec in res.decoders:
            link = res.link(pool.host, dec.host)
            start = max(handed, link_free[link.name])
            arrived = start + planner.transfer_time(clip, link)
            decode, mux = planner.decoder_times(clip, dec)
            key = (max(arrived, dec_free[dec.name]) + decode + mux, arrived)
            if best is None or key < best[0]:
                best = (key, dec, link, start, arrived)
        assert best is not None
        _, dec, link, start, arrived = best
        runs.append(StageRun(clip.id, "transfer", link.name, start, arrived))
        link_free[link.name] = arrived
        dec_free[dec.name] = best[0][0]  # projected, so later latents spread over decoders
        arrivals.append((arrived, i, clip, dec.name))
    dec_free = {d.name: 0.0 for d in res.decoders}
    decoder_of: dict[str, str] = {}
    for arrived, _, clip, name in sorted(arrivals, key=lambda a: (a[0], a[1])):
        decode, mux = planner.decoder_times(clip, _decoder(planner, name))
        start = max(arrived, dec_free[name])
        runs.append(StageRun(clip.id, "decode", name, start, start + decode))
        runs.append(StageRun(clip.id, "mux", name, start + decode, start + decode + mux))
        dec_free[name] = start + decode + mux
        decoder_of[clip.id] = name
    return Schedule(res.topology, policy.name, [c.id for c in clips], runs, pool_of, decoder_of)


def _decoder(planner: Planner, name: str):  # noqa: ANN202 - tiny lookup
    return next(d for d in planner.resources.decoders if d.name == name)
