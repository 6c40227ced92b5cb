"""The simulator: a batch over a topology's resources under a policy -> a :class:`Schedule`.

Per clip: encode -> offload (on the clip's encoder pool) -> sample -> handoff write (on
its sampler pool) -> transfer (on the link to the decoder's host) -> decode -> mux (on
a decoder). Every resource does one stage at a time. The rules mirror the live pipeline:

- Dispatch: each sampler pool holds at most ``ahead`` (2) clips in flight — one
  running, one queued — like the live dispatcher. Whenever a slot frees (and at the
  start) the policy is asked where the next clip goes; ``None`` means "wait".
- A pool that encodes for itself runs each clip's encode, offload, sample and handoff
  back to back (one ComfyUI prompt chain, one clip at a time).
- A pool that borrows an encoder (the XTX box) asks its encoder pool to encode a clip
  as soon as the clip is dispatched to it; the encoder pool serves such borrowed
  encodes, in request order, before it starts its own next clip (an encode is short
  and each one unblocks a whole sampler). The borrower samples its clips in order.
- Delivery: latents cross their link in the order they are written, to the decoder
  that would start them first; each decoder takes latents in arrival order (one FIFO
  decode queue). Sampler pools never wait for the decoder (latents queue on disk).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import TypeVar

from h3flow.core.batch import Batch
from h3flow.core.errors import ConfigError
from h3flow.planner.policies import EarliestFinish, Policy, Projection, RoundRobin, State, project
from h3flow.planner.resources import SamplerPool
from h3flow.planner.timing import ClipLike, PlanClip, Planner, SamplerTimes

C = TypeVar("C", bound=ClipLike)

STAGES = ("encode", "offload", "sample", "handoff", "transfer", "decode", "mux")
AHEAD = 2  # clips in flight per sampler pool: one running, one queued (as the live dispatcher)


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

    @cached_property
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
        runs = [r for r in self.runs if r.resource == resource]
        if not runs:
            return 0.0
        span = max(r.end for r in runs) - min(r.start for r in runs)
        return max(0.0, span - sum(r.end - r.start for r in runs))

    def by_clip(self) -> dict[str, list[StageRun]]:
        out: dict[str, list[StageRun]] = {c: [] for c in self.clips}
        for r in self.runs:
            out[r.clip].append(r)
        return out


def clips_of(batch_or_clips: Batch | Sequence[ClipLike]) -> list[PlanClip]:
    """The batch's clips as :class:`PlanClip` (spec and frame count computed once)."""
    clips = [PlanClip.of(c) for c in (batch_or_clips.clips if isinstance(batch_or_clips, Batch) else batch_or_clips)]
    if not clips:
        raise ConfigError("nothing to plan: the batch has no clips")
    if len({c.id for c in clips}) != len(clips):
        raise ConfigError("clip ids must be unique")
    return clips


@dataclass(slots=True)
class _Job:
    clip: PlanClip
    seq: int
    pool: SamplerPool
    times: SamplerTimes
    encoded: float | None = None  # a borrowed encode's end, once started
    handed: float | None = None  # the handoff's end, once sampling started


class _Sim:
    def __init__(self, planner: Planner, policy: Policy, ahead: int) -> None:
        self.planner, self.policy, self.ahead = planner, policy, ahead
        res = planner.resources
        self.pools = res.samplers
        self.free_at = {p.name: 0.0 for p in self.pools}  # when each pool's GPUs are next free
        self.inflight: dict[str, deque[_Job]] = {p.name: deque() for p in self.pools}
        self.waiting: dict[str, deque[_Job]] = {p.name: deque() for p in self.pools}  # not started yet
        self.borrowed: dict[str, deque[_Job]] = {p.name: deque() for p in self.pools}
        self.est = {name: 0.0 for name in res.names}  # projected busy-until, the policy's view
        self.runs: list[StageRun] = []
        self.jobs: list[_Job] = []

    # ------------------------------------------------------------------ dispatch
    def full(self, now: float) -> frozenset[str]:
        out = []
        for name, jobs in self.inflight.items():
            while jobs and jobs[0].handed is not None and jobs[0].handed <= now:
                jobs.popleft()  # a pool hands its clips off in the order they were dispatched
            if len(jobs) >= self.ahead:
                out.append(name)
        return frozenset(out)

    def state(self, now: float) -> State:
        full = self.full(now)
        if not getattr(self.policy, "needs_state", True):
            return State(full=full)
        busy = {name: max(value, self.free_at.get(name, 0.0)) - now for name, value in self.est.items()}
        encode_free = {}
        for p in self.pools:
            wait = max(self.free_at[p.name] - now, 0.0)
            for j in self.borrowed[p.name]:
                wait += j.times.encode + j.times.offload
            encode_free[p.name] = wait
        return State(busy_until=busy, full=full, encode_free=encode_free)

    def dispatch(self, now: float, pending: deque[PlanClip]) -> None:
        planner = self.planner
        tracks = getattr(self.policy, "needs_state", True)
        while pending:
            state = self.state(now)
            name = self.policy.choose_pool(pending[0], state)
            if name is None:
                return
            clip = pending.popleft()
            pool = planner.resources.pool(name)
            job = _Job(clip, len(self.jobs), pool, planner.sampler_times(clip, pool))
            self.jobs.append(job)
            self.inflight[name].append(job)
            self.waiting[name].append(job)
            if pool.encoder != name:
                self.borrowed[pool.encoder].append(job)
            if tracks:  # keep the projected busy-until times that the policy reads
                p = getattr(self.policy, "projections", {}).get(name) or project(planner, clip, name, state)
                if pool.encoder != name:
                    self.est[pool.encoder] = max(self.est[pool.encoder], now) + job.times.encode + job.times.offload
                self.est[name] = now + p.handed_off
                self.est[p.link] = now + p.arrived
                self.est[p.decoder] = now + p.finished

    # ------------------------------------------------------------------ GPU work
    def start_work(self, now: float) -> None:
        progress = True
        while progress:
            progress = False
            for pool in self.pools:
                name = pool.name
                if self.free_at[name] > now:
                    continue
                if self.borrowed[name]:  # borrowed encodes first
                    job = self.borrowed[name].popleft()
                    t = job.times
                    self.runs.append(StageRun(job.clip.id, "encode", name, now, now + t.encode))
                    job.encoded = now + t.encode + t.offload
                    self.runs.append(StageRun(job.clip.id, "offload", name, now + t.encode, job.encoded))
                    self.free_at[name] = job.encoded
                    progress = True
                    continue
                if not self.waiting[name]:
                    continue
                job = self.waiting[name][0]
                t = job.times
                if pool.encoder == name:
                    self.runs.append(StageRun(job.clip.id, "encode", name, now, now + t.encode))
                    self.runs.append(StageRun(job.clip.id, "offload", name, now + t.encode, now + t.encode + t.offload))
                    start = now + t.encode + t.offload
                elif job.encoded is not None and job.encoded <= now:
                    start = now
                else:
                    continue
                self.waiting[name].popleft()
                self.runs.append(StageRun(job.clip.id, "sample", name, start, start + t.sample))
                job.handed = start + t.sample + t.handoff
                self.runs.append(StageRun(job.clip.id, "handoff", name, start + t.sample, job.handed))
                self.free_at[name] = job.handed
                progress = True

    def run(self, clips: list[PlanClip]) -> None:
        pending = deque(clips)
        now, release = 0.0, 0.0
        while True:
            if pending and now >= release:  # decisions change only when a slot frees
                self.dispatch(now, pending)
            self.start_work(now)
            if pending:
                heads = [
                    j[0].handed for j in self.inflight.values() if j and j[0].handed is not None and j[0].handed > now
                ]
                release = min(heads, default=now)
            later = [t for t in self.free_at.values() if t > now]
            if not later:
                if pending or any(self.waiting.values()):
                    raise ConfigError(f"policy {self.policy.name!r} left clips undispatched with every pool idle")
                return
            now = min(later)


def simulate(
    batch_or_clips: Batch | Sequence[ClipLike], planner: Planner, policy: Policy, *, ahead: int = AHEAD
) -> Schedule:
    """Simulate the batch on ``planner``'s topology under ``policy``."""
    clips = clips_of(batch_or_clips)
    policy.reset()
    sim = _Sim(planner, policy, ahead)
    sim.run(policy.order(clips))
    runs = sim.runs
    res = planner.resources
    decoders = {d.name: d for d in res.decoders}

    # delivery: links in handoff order, decoders in arrival order
    link_free = {lk.name: 0.0 for lk in res.links}
    projected = {d.name: 0.0 for d in res.decoders}
    arrivals: list[tuple[float, int, ClipLike, str]] = []
    for job in sorted(sim.jobs, key=lambda j: (j.handed, j.seq)):
        best = None
        for dec in res.decoders:
            link = res.link(job.pool.host, dec.host)
            start = max(job.handed or 0.0, link_free[link.name])
            arrived = start + planner.transfer_time(job.clip, link)
            decode, mux = planner.decoder_times(job.clip, dec)
            key = (max(arrived, projected[dec.name]) + decode + mux, arrived)
            if best is None or key < best[0]:
                best = (key, dec.name, link.name, start, arrived)
        assert best is not None
        key, dec_name, link_name, start, arrived = best
        runs.append(StageRun(job.clip.id, "transfer", link_name, start, arrived))
        link_free[link_name] = arrived
        projected[dec_name] = key[0]
        arrivals.append((arrived, job.seq, job.clip, dec_name))
    dec_free = {d.name: 0.0 for d in res.decoders}
    decoder_of: dict[str, str] = {}
    for arrived, _, clip, name in sorted(arrivals, key=lambda a: (a[0], a[1])):
        decode, mux = planner.decoder_times(clip, decoders[name])
        start = max(arrived, dec_free[name])
        runs.append(StageRun(clip.id, "decode", name, start, start + decode))
        runs.append(StageRun(clip.id, "mux", name, start + decode, start + decode + mux))
        dec_free[name] = start + decode + mux
        decoder_of[clip.id] = name
    pool_of = {j.clip.id: j.pool.name for j in sim.jobs}
    return Schedule(res.topology, policy.name, [c.id for c in clips], runs, pool_of, decoder_of)


class BestOf:
    """Simulate each candidate policy on the batch, then act as the one that finishes it first."""

    name = "best"

    def __init__(self, planner: Planner, candidates: Sequence[type] = (EarliestFinish, RoundRobin)) -> None:
        self.planner = planner
        self.candidates: list[Policy] = [c(planner) for c in candidates]
        self.chosen: Policy = self.candidates[0]
        self.schedules: dict[str, Schedule] = {}  # candidate name -> its Schedule, after order()

    def reset(self) -> None:
        self.chosen.reset()

    def order(self, clips: Sequence[C]) -> list[C]:
        self.schedules = {}
        for candidate in self.candidates:
            self.schedules[candidate.name] = simulate(clips, self.planner, candidate)
        ranked = sorted(
            enumerate(self.candidates), key=lambda ic: (round(self.schedules[ic[1].name].makespan, 6), ic[0])
        )
        self.chosen = ranked[0][1]
        self.chosen.reset()
        return self.chosen.order(clips)

    def choose_pool(self, clip: ClipLike, state: State) -> str | None:
        return self.chosen.choose_pool(clip, state)

    @property
    def needs_state(self) -> bool:
        return getattr(self.chosen, "needs_state", True)

    @property
    def projections(self) -> dict[str, Projection]:
        return getattr(self.chosen, "projections", {})


POLICIES = {"best": BestOf, "earliest-finish": EarliestFinish, "design": RoundRobin}


def make_policy(name: str, planner: Planner) -> Policy:
    try:
        return POLICIES[name](planner)
    except KeyError:
        raise ConfigError(f"unknown policy {name!r} (known: {', '.join(POLICIES)})") from None
