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
from collections.abc import Sequence
from dataclasses import dataclass

from h3flow.core.batch import Batch
from h3flow.core.errors import ConfigError
from h3flow.planner.instance import Instance
from h3flow.planner.policies import EarliestFinish, Policy, RoundRobin, State, project
from h3flow.planner.resources import SamplerPool
from h3flow.planner.schedule import STAGES, Schedule, StageRun
from h3flow.planner.sequence import AHEAD, deliver, delivery_runs
from h3flow.planner.timing import ClipLike, PlanClip, Planner, SamplerTimes

__all__ = ["AHEAD", "POLICIES", "STAGES", "Schedule", "StageRun", "clips_of", "make_policy", "simulate"]


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
    res = planner.resources
    inst = Instance.of(planner, clips)
    index = {c.id: j for j, c in enumerate(clips)}
    pools = {p.name: i for i, p in enumerate(res.samplers)}
    handed = [0.0] * len(clips)
    pool_of = [0] * len(clips)
    for job in sim.jobs:
        j = index[job.clip.id]
        handed[j], pool_of[j] = job.handed or 0.0, pools[job.pool.name]
    order = [index[job.clip.id] for job in sorted(sim.jobs, key=lambda jb: (jb.handed, jb.seq))]
    delivery = deliver(inst, handed, pool_of, order)
    runs = sim.runs + delivery_runs(inst, delivery)
    ids = [c.id for c in clips]
    return Schedule(
        res.topology,
        policy.name,
        ids,
        runs,
        {c: res.samplers[pool_of[j]].name for j, c in enumerate(ids)},
        {c: res.decoders[delivery.decoder[j]].name for j, c in enumerate(ids)},
    )


# the simulator's policies ("best" is not one: it is a schedule, h3flow.planner.best)
POLICIES: dict[str, type[EarliestFinish] | type[RoundRobin]] = {"earliest-finish": EarliestFinish, "design": RoundRobin}


def make_policy(name: str, planner: Planner) -> Policy:
    try:
        return POLICIES[name](planner)
    except KeyError:
        raise ConfigError(f"unknown policy {name!r} (known: {', '.join(POLICIES)})") from None
