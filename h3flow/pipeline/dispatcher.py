"""The dispatcher: sends each clip to the pool that finishes it earliest, live.

It keeps, per sampler pool, one clip running and one queued ahead (so a worker's
process start-up overlaps the running clip), hands sampled latents to the decoder
queue, notices pools that die (their worker stops heart-beating) and re-routes their
clips, re-sends latents the decoder found damaged, and records the manifest after
every change. It talks to Prefect only through :class:`DispatchApi` (deployments and
the API), so the pools can live on other hosts and tests can stand in for Prefect.

Retries here are for what a flow run cannot retry itself (docs/pipeline.md,
"Retries"): a child whose process or pool died (CRASHED) is sent again, elsewhere if
its pool is gone; a latent found damaged on the decoder (INTEGRITY) is sent again.
Every other failure is final for this run (``resume`` tries again later). A clip's
submissions of each stage are counted over all its children and capped at
:data:`~h3flow.core.contracts.MAX_SUBMISSIONS`.

The Prefect server can go away at any call (a restart, a dropped connection), either
before it acted or after it acted but before its answer arrived. So each pass makes its
calls first and changes its own state only after they answered, and a submission whose
answer was lost is sent again verbatim — same idempotency key — so Prefect hands back the
run it may already have created instead of making a second one. (A key names the clip,
the attempt and the pool: a different call never gets an old run back.)
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from h3flow.config.models import LocalConfig
from h3flow.config.settings import settings
from h3flow.core.batch import Clip
from h3flow.core.contracts import AHEAD, CLIPS_QUEUE, MAX_SUBMISSIONS, pool_tag, run_tag
from h3flow.core.errors import H3FlowError
from h3flow.pipeline.manifest import HEARTBEAT_S, ClipRecord, ClipState, Manifest
from h3flow.pipeline.prefect_api import TERMINAL_STATES, UNAVAILABLE
from h3flow.pipeline.results import FailureKind, StageResult
from h3flow.planner.schedule import Schedule

POLL = 0.5
API_GIVE_UP_S = 120.0  # the Prefect API unavailable this long ends the dispatcher (resume continues)
POOL_CHECK_S = 3.0  # how often worker heartbeats are read (each is one API call per pool)
# After API errors a Prefect worker backs off between heartbeats (critical_service_loop: its
# 5 s interval doubles per 3 failures, to 40 s ±30 %): once the API is back, no pool is judged
# gone before its worker had this long to beat again.
HEARTBEAT_CATCH_UP_S = 60.0
DEFAULT_SECONDS = {"sample": 30.0, "decode": 10.0}
STOPPING = {"CANCELLING", "CANCELLED"}
SAMPLE_STAGES = ("encode", "sample", "transfer")  # the budgeted stages of a sample-clip run
DECODE_STAGES = ("decode",)


class DispatchApi(Protocol):
    """The Prefect calls the dispatcher makes (real: :class:`~h3flow.pipeline.prefect_api.PrefectApi`)."""

    def submit(
        self,
        deployment: str,
        parameters: dict[str, Any],
        idempotency_key: str,
        name: str,
        tags: list[str],
        work_queue: str | None = None,
    ) -> str: ...
    def states(self, run_ids: list[str]) -> dict[str, tuple[str, str | None]]: ...
    def results(self, run_id: str) -> dict[str, StageResult]: ...
    def task_tries(self, run_id: str) -> dict[str, int]: ...
    def worker_alive(self, work_pool: str) -> bool: ...
    def abandon(self, run_id: str, why: str) -> None: ...
    def cancel(self, run_id: str, why: str) -> None: ...
    def stop_runner(self, run_id: str) -> None: ...
    def now(self) -> float: ...
    def pause(self, seconds: float) -> None: ...


@dataclass(frozen=True)
class Submission:
    """One child flow run to create: kept until Prefect answers, so a retry is the same call."""

    deployment: str
    parameters: dict[str, Any]
    key: str
    name: str
    tags: list[str]
    work_queue: str | None = None


@dataclass
class Child:
    flow_run_id: str
    kind: str  # "sample" | "decode"
    clip_id: str
    pool: str
    submitted: float


@dataclass
class LiveState:
    """What the policy sees: when each pool is free, what it measured, which pools are gone."""

    busy_until: dict[str, float] = field(default_factory=dict)
    measured: dict[tuple[str, str], list[float]] = field(default_factory=dict)  # (pool, spec) -> seconds
    gone: set[str] = field(default_factory=set)

    def estimate(self, pool: str, spec: str, kind: str) -> float:
        seen = self.measured.get((pool, spec))
        if seen:
            return sum(seen) / len(seen)
        others = [v for (p, s), vals in self.measured.items() if s == spec for v in vals]
        return sum(others) / len(others) if others else DEFAULT_SECONDS[kind]


Chooser = Callable[[Clip, list[str], LiveState, float], str | None]  # None: not yet (its planned pool is full)


def earliest_finish(clip: Clip, pools: list[str], state: LiveState, now: float) -> str:
    """The pool that would finish this clip first, from the durations measured so far."""
    return min(
        pools, key=lambda p: (max(state.busy_until.get(p, now), now) + state.estimate(p, clip.spec, "sample"), p)
    )


def planner_chooser(config: LocalConfig, plan: Schedule | None = None) -> Chooser:
    """The planner's policy on the live state (profile times until measured ones exist): the plan's
    pool for each clip when a plan is given (adapted online: dead pools, measured durations), else
    earliest-finish.

    Falls back to :func:`earliest_finish` on measured times alone when the profile does
    not cover this cluster's devices.
    """
    from h3flow.planner import FollowPlan, Planner, Resources, State, load_profile, make_policy

    try:
        profile = load_profile()
        planner = Planner(profile, Resources.from_config(config))
    except H3FlowError:
        return earliest_finish
    policy = FollowPlan.of(planner, plan) if plan is not None else make_policy("earliest-finish", planner)
    samplers = {p.name for p in config.samplers}

    def choose(clip: Clip, free: list[str], live: LiveState, now: float) -> str | None:
        state = State(
            busy_until={name: max(0.0, t - now) for name, t in live.busy_until.items()},
            gone=set(live.gone),
            full=samplers - set(free),
            measured={(pool, "sample", spec): sum(v) / len(v) for (pool, spec), v in live.measured.items()},
        )
        try:
            chosen = policy.choose_pool(clip, state)
        except H3FlowError:
            chosen = None
        if chosen is None and plan is not None and clip.id in plan.pool_of:
            return None  # its planned pool has no free slot yet: the clip waits for it
        return chosen if chosen in free else earliest_finish(clip, free, live, now)

    return choose


class Dispatcher:
    """One run's dispatch loop; ``save`` records the manifest after every change."""

    def __init__(
        self,
        config: LocalConfig,
        config_path: str,
        manifest: Manifest,
        api: DispatchApi,
        save: Callable[[Manifest, set[str]], None],
        choose: Chooser = earliest_finish,
        incarnation: str = "d0",
        own_flow_run_id: str | None = None,
        log: Callable[[str], None] = lambda line: None,
    ) -> None:
        self.config = config
        self.config_path = config_path
        self.manifest = manifest
        self.api = api
        self.save = save
        self.choose = choose
        self.incarnation = incarnation  # this dispatcher's flow run: a resumed run gets fresh child keys
        self.own_id = own_flow_run_id  # the batch flow run: cancelling it stops everything
        self.log = log
        self.runners: dict[str, str] = {}  # pool -> its pool-runner flow run
        self.runner_deaths: dict[str, int] = {}
        self.runner_serial = 0
        self.unanswered: dict[str, tuple[Submission, str, str]] = {}  # clip -> (sample sent, pool, decoder)
        self.children: dict[str, Child] = {}
        self.dirty: set[str] = set()  # clips changed since the last save
        self.api_down_since: float | None = None
        self.api_back_at: float | None = None
        self.state = LiveState()
        self.pools_lost_since: float | None = None
        self.pools_checked: float | None = None

    # ------------------------------------------------------------------ bookkeeping
    def timed(self, call: Callable[..., Any], *args: Any) -> Any:
        """Per-clip dispatcher work (submitting a child, reading its results), summed in the manifest."""
        tick = self.api.now()
        try:
            return call(*args)
        finally:
            self.manifest.dispatch_overhead_s += self.api.now() - tick

    def send(self, submission: Submission) -> str:
        """Create a child flow run (its answer may be lost: callers keep ``submission`` to send it again)."""
        s = submission
        return str(self.timed(self.api.submit, s.deployment, s.parameters, s.key, s.name, s.tags, s.work_queue))

    def in_flight(self, pool: str) -> int:
        return sum(1 for c in self.children.values() if c.pool == pool)

    def live_pools(self, role: str) -> list[str]:
        pools = self.config.samplers if role == "sample" else self.config.decoders
        return [p.name for p in pools if p.name not in self.state.gone]

    @staticmethod
    def budget(rec: ClipRecord, stages: tuple[str, ...]) -> dict[str, int]:
        """Submissions each stage may still make for this clip."""
        return {stage: MAX_SUBMISSIONS - rec.submissions.get(stage, 0) for stage in stages}

    # ------------------------------------------------------------------ the loop
    def run(self) -> Manifest:
        """Dispatch until every clip is delivered or failed (or the run is cancelled); returns the
        manifest with its final state set but not yet saved (``wait`` ends when it sees that state)."""
        self.manifest.state = "running"
        self.manifest.started = self.manifest.started or self.api.now()
        self.restart_interrupted()
        self.beat()
        try:
            while not self.step():
                self.api.pause(POLL)
        except Exception as exc:  # a defect, or the API gone for good: the children finish; resume continues
            self.manifest.state, self.manifest.error = "failed", f"the dispatcher stopped: {type(exc).__name__}: {exc}"
            self.manifest.finished = self.api.now()
            with contextlib.suppress(Exception):
                self.beat()
            raise
        except BaseException:  # cancelled (the worker's SIGTERM, Ctrl-C): take the children along
            with contextlib.suppress(Exception):
                self.stop_everything("the batch run was stopped")
            self.manifest.state = "cancelled"
            self.manifest.finished = self.api.now()
            with contextlib.suppress(Exception):
                self.beat()
            raise
        for pool, runner in self.runners.items():
            try:
                self.api.stop_runner(runner)
            except UNAVAILABLE as exc:  # it also stops by itself once it sees the batch run over
                self.log(f"pool {pool}: could not tell its runner to stop ({type(exc).__name__}); it stops on its own")
        self.manifest.finished = self.api.now()
        if self.manifest.state == "running":
            self.manifest.state = "failed" if self.manifest.failed else "completed"
        return self.manifest  # unsaved: the caller saves the final state once the report is out

    def step(self) -> bool:
        """One pass of the loop; True when the run is over. The API being briefly unavailable
        (a busy or restarting server) is waited out, up to ``API_GIVE_UP_S``."""
        try:
            if self.cancelled():
                return True
            changed = self.poll_children()
            changed |= self.check_pools()
            changed |= self.ensure_runners()
            changed |= self.submit_decodes()
            changed |= self.submit_samples()
            if changed or self.api.now() - (self.manifest.heartbeat or 0) >= HEARTBEAT_S:
                self.beat()
            if self.no_pool_left():
                role = "decoder" if not self.live_pools("decode") else "sampler pool"
                self.fail_run(f"no {role} is alive: every {role}'s worker stopped heart-beating")
                return True
        except UNAVAILABLE as exc:
            now = self.api.now()
            if self.api_down_since is None:
                self.api_down_since = now
                self.log(f"Prefect API unavailable ({type(exc).__name__}: {exc}); waiting up to {API_GIVE_UP_S:.0f} s")
            if now - self.api_down_since > API_GIVE_UP_S:
                raise
            return False
        if self.api_down_since is not None:
            self.api_back_at = self.api.now()
            self.log(f"Prefect API back after {self.api_back_at - self.api_down_since:.0f} s")
            self.api_down_since = None
        return not self.children and all(c.state in ("delivered", "failed") for c in self.manifest.clips.values())

    def beat(self) -> None:
        """Save the manifest, stamped: a save is also the dispatcher's heartbeat (resume reads it)."""
        self.manifest.heartbeat = self.api.now()
        self.save(self.manifest, self.dirty)
        self.dirty = set()

    def restart_interrupted(self) -> None:
        """Clips a dead dispatcher had in flight start over from their last finished step."""
        for rec in self.manifest.clips.values():
            if rec.state in ("sampling", "decoding"):
                rec.state = "pending" if rec.state == "sampling" else "sampled"
                self.dirty.add(rec.clip.id)

    def cancelled(self) -> bool:
        """True once the batch run is being cancelled: every child and runner is cancelled too."""
        if self.own_id is None:
            return False
        state = self.api.states([self.own_id]).get(self.own_id, ("RUNNING", None))[0]
        if state not in STOPPING:
            return False
        self.stop_everything("the batch run was cancelled")
        self.manifest.state = "cancelled"
        self.log("run cancelled: every child and pool runner cancelled")
        return True

    def stop_everything(self, why: str) -> None:
        for run_id in [*self.children, *self.runners.values()]:
            self.api.cancel(run_id, why)
        self.children.clear()
        self.runners.clear()

    def ensure_runners(self) -> bool:
        """One pool-runner per live pool (started once; started again if it died or left)."""
        changed = False
        for pool in [*self.live_pools("sample"), *self.live_pools("decode")]:
            if pool in self.runners:
                continue
            deaths = self.runner_deaths.get(pool, 0)
            if deaths >= MAX_SUBMISSIONS:
                self.state.gone.add(pool)
                self.log(f"pool {pool}: its runner died {deaths} times; the pool is out of this run")
                changed = True
                continue
            params = {
                "run_id": self.manifest.run_id,
                "pool": pool,
                "batch_flow_run_id": self.own_id,
                "config_path": self.config_path,
            }
            key = f"{self.manifest.run_id}-runner-{pool}-{self.incarnation}-{self.runner_serial + 1}"
            name = f"{self.manifest.run_id}/runner·{pool}"
            self.runners[pool] = self.send(Submission(f"pool-runner/{pool}", params, key, name, self.tags(pool)))
            self.runner_serial += 1
            changed = True
        return changed

    def tags(self, pool: str) -> list[str]:
        return [self.run_tag, pool_tag(pool)]

    def submit_samples(self) -> bool:
        changed = False
        pools = self.live_pools("sample")
        for rec in self.manifest.clips.values():
            if rec.state != "pending":
                continue
            free = [p for p in pools if self.in_flight(p) < AHEAD]
            if not free or not self.live_pools("decode"):
                break
            now = self.api.now()
            sent = self.unanswered.get(rec.clip.id)
            if sent is not None and sent[1] in pools and sent[2] in self.live_pools("decode"):
                if sent[1] not in free:
                    continue  # the run may exist in that pool's queue: wait for room there, never a second one
                submission, pool, decoder = sent  # its answer was lost: the same call again
            else:
                chosen = self.choose(rec.clip, free, self.state, now)
                if chosen is None:
                    continue
                pool, decoder = chosen, self.pick_decoder()
                submission = self.sample_submission(rec, pool, decoder)
                self.unanswered[rec.clip.id] = (submission, pool, decoder)
            run_id = self.send(submission)
            del self.unanswered[rec.clip.id]
            self.dirty.add(rec.clip.id)
            rec.state, rec.pool, rec.decoder = "sampling", pool, decoder
            rec.attempts += 1
            rec.timeline["sample_submitted"] = now
            self.children[run_id] = Child(run_id, "sample", rec.clip.id, pool, now)
            again = f" (attempt {rec.attempts})" if rec.attempts > 1 else ""
            self.log(f"{rec.clip.id}: routed to {pool}{again}, decoder {decoder}")
            start = max(self.state.busy_until.get(pool, now), now)
            self.state.busy_until[pool] = start + self.state.estimate(pool, rec.clip.spec, "sample")
            changed = True
        return changed

    def sample_submission(self, rec: ClipRecord, pool: str, decoder: str) -> Submission:
        params = {
            "run_id": self.manifest.run_id,
            "clip": rec.clip.model_dump(mode="json"),
            "pool": pool,
            "decoder": decoder,
            "config_path": self.config_path,
            "retransfer": rec.retransfer,
            "budget": self.budget(rec, SAMPLE_STAGES),
        }
        key = f"{self.manifest.run_id}-{rec.clip.id}-{self.incarnation}-s{rec.attempts + 1}-{pool}"  # per call
        name = f"{self.manifest.run_id}/{rec.clip.id}·sample·{pool}"
        return Submission(f"sample-clip/{pool}", params, key, name, self.tags(pool), CLIPS_QUEUE)

    @property
    def run_tag(self) -> str:
        return run_tag(self.manifest.run_id)

    def pick_decoder(self) -> str:
        """The live decoder with the fewest clips headed its way (sampling, sampled or decoding):
        counting only decode runs in flight sent a whole first wave of samples to one decoder."""
        decoders = self.live_pools("decode")
        load = dict.fromkeys(decoders, 0)
        for rec in self.manifest.clips.values():
            if rec.decoder in load and rec.state in ("sampling", "sampled", "decoding"):
                load[rec.decoder] += 1
        return min(decoders, key=lambda d: (load[d], d))

    def submit_decodes(self) -> bool:
        changed = False
        for rec in self.manifest.clips.values():
            if rec.state != "sampled":
                continue
            decoder = rec.decoder if rec.decoder in self.live_pools("decode") else None
            if decoder is None or self.in_flight(decoder) >= AHEAD:
                continue
            params = {
                "run_id": self.manifest.run_id,
                "clip_id": rec.clip.id,
                "latent_sha256": rec.latent_sha256,
                "decoder": decoder,
                "config_path": self.config_path,
                "budget": self.budget(rec, DECODE_STAGES),
            }
            key = f"{self.manifest.run_id}-{rec.clip.id}-{self.incarnation}-d{rec.decode_attempts + 1}-{decoder}"
            name = f"{self.manifest.run_id}/{rec.clip.id}·decode·{decoder}"
            run_id = self.send(
                Submission(f"decode-clip/{decoder}", params, key, name, self.tags(decoder), CLIPS_QUEUE)
            )  # a lost answer: the next pass sends this same call (same decoder, same key)
            self.dirty.add(rec.clip.id)
            rec.state = "decoding"
            rec.decode_attempts += 1
            rec.timeline["decode_submitted"] = self.api.now()
            self.children[run_id] = Child(run_id, "decode", rec.clip.id, decoder, self.api.now())
            changed = True
        return changed

    def poll_children(self) -> bool:
        """Collect finished children; notice runners that died (their clips were lost with them)."""
        watched = [*self.children, *self.runners.values()]
        if not watched:
            return False
        changed = False
        states = self.api.states(watched)
        for pool, runner in list(self.runners.items()):
            state, message = states.get(runner, ("PENDING", None))
            if state not in TERMINAL_STATES:
                continue
            lost = f"the runner of pool {pool} ended while running it"
            for run_id, child in self.children.items():  # what it had taken is lost; the queue waits
                if child.pool == pool and states.get(run_id, ("", None))[0] in ("PENDING", "RUNNING"):
                    self.api.abandon(run_id, lost)
                    states[run_id] = ("CRASHED", lost)
            del self.runners[pool]
            if state != "COMPLETED":  # a runner that left on its own is simply started again when needed
                self.runner_deaths[pool] = self.runner_deaths.get(pool, 0) + 1
            self.log(f"pool {pool}: its runner ended ({state.lower()}: {message or 'no reason given'})")
            changed = True
        for run_id, child in list(self.children.items()):
            state, message = states.get(run_id, ("PENDING", None))
            if state not in TERMINAL_STATES:
                continue
            results = self.timed(self.api.results, run_id)
            tries = self.tries_of(run_id, results)
            del self.children[run_id]
            rec = self.manifest.clips[child.clip_id]
            self.count_submissions(rec, tries)
            if state == "COMPLETED":
                self.completed(child, rec, results)
            else:
                self.failed(child, rec, state, message or state.lower(), results)
            changed = True
        return changed

    def tries_of(self, run_id: str, results: dict[str, StageResult]) -> dict[str, int]:
        """A finished child's prompt submissions per stage: its results, else (it crashed or
        failed mid-stage) what Prefect's task runs show."""
        tries = {stage: r.tries for stage, r in results.items() if r.failure is None}
        if set(tries) < set(SAMPLE_STAGES) and set(tries) < set(DECODE_STAGES):
            tries = {**self.api.task_tries(run_id), **tries}
        return tries

    def count_submissions(self, rec: ClipRecord, tries: dict[str, int]) -> None:
        """Add a finished child's submissions to the clip's tally.

        Every path that changes a clip after its child ends goes through here, so it marks the clip changed.
        """
        self.dirty.add(rec.clip.id)
        for stage, n in tries.items():
            rec.submissions[stage] = rec.submissions.get(stage, 0) + n

    def completed(self, child: Child, rec: ClipRecord, results: dict[str, StageResult]) -> None:
        rec.stages.update(results)
        now = self.api.now()
        needed = "transfer" if child.kind == "sample" else "decode"
        if needed not in results:
            raise H3FlowError(f"flow run {child.flow_run_id} completed without publishing its {needed} result")
        if child.kind == "sample":
            rec.latent_sha256 = results["transfer"].sha256
            rec.state = "sampled"
            rec.timeline["sampled"] = now
            rec.retransfer = False
            self.state.measured.setdefault((child.pool, rec.clip.spec), []).append(now - child.submitted)
            if self.in_flight(child.pool) == 0:
                self.state.busy_until[child.pool] = now
            sampled = results.get("sample")
            how = "cached" if sampled and sampled.cached else f"{(sampled and sampled.seconds) or 0:.1f} s"
            self.log(
                f"{rec.clip.id}: sampled on {child.pool} ({how}), latent {(rec.latent_sha256 or '?')[:12]} sent to {rec.decoder}"
            )
        else:
            rec.output = results["decode"].path
            rec.output_sha256 = results["decode"].sha256
            rec.state = "delivered"
            rec.timeline["delivered"] = now
            self.log(f"{rec.clip.id}: delivered {rec.output}")

    def failed(self, child: Child, rec: ClipRecord, state: str, message: str, results: dict[str, StageResult]) -> None:
        """Retry what only the dispatcher can (a crash, a latent damaged on the decoder); fail the rest."""
        rec.stages.update({stage: r for stage, r in results.items() if r.failure is None})
        kind, reason = failure_of(state, message, results)
        retry_as: ClipState | None = None
        if kind is FailureKind.CRASHED:
            retry_as = "pending" if child.kind == "sample" else "sampled"
        elif kind is FailureKind.INTEGRITY and child.kind == "decode":
            retry_as = "pending"  # send the latent again (sampling is cached), never decode the damaged copy
        attempts = rec.attempts if retry_as == "pending" else rec.decode_attempts
        if retry_as is not None and attempts >= MAX_SUBMISSIONS:
            kind, reason, retry_as = FailureKind.BUDGET, f"tried {attempts} times; last: {kind.value}: {reason}", None
        if retry_as is None:
            rec.state, rec.failure, rec.error = "failed", kind, f"{child.kind} on {child.pool}: {kind.value}: {reason}"
            self.log(f"{rec.clip.id}: failed — {rec.error}")
            return
        if kind is FailureKind.INTEGRITY:
            rec.retransfer = True
        rec.state = retry_as
        self.log(f"{rec.clip.id}: {child.kind} on {child.pool} {kind.value} ({reason}); sending it again")

    def check_pools(self) -> bool:
        """A pool whose worker stopped heart-beating is gone: re-route what it held."""
        now = self.api.now()
        if self.pools_checked is not None and now - self.pools_checked < POOL_CHECK_S:
            return False
        alive = {pool.name: self.api.worker_alive(pool.work_pool) for pool in self.config.pools}
        self.pools_checked = now
        catching_up = self.api_down_since is not None or (  # this pass is the first since an outage, or soon after
            self.api_back_at is not None and now - self.api_back_at < HEARTBEAT_CATCH_UP_S
        )
        changed = False
        for pool, up in alive.items():
            if up and pool in self.state.gone:
                self.state.gone.discard(pool)
                changed = True
            elif not up and pool not in self.state.gone and not catching_up:  # no beat could land in an outage
                self.pool_gone(pool)
                changed = True
        return changed

    def pool_gone(self, pool: str) -> None:
        """Abandon a dead pool's runner and children, then send its clips elsewhere (calls first:
        if one fails, the next check finds the pool still to handle)."""
        if pool in self.runners:
            self.api.abandon(self.runners[pool], f"pool {pool} is gone")
        lost = {run_id: child for run_id, child in self.children.items() if child.pool == pool}
        tries = {}
        for run_id in lost:
            self.api.abandon(run_id, f"pool {pool} is gone (its worker stopped heart-beating)")
            tries[run_id] = self.tries_of(run_id, {})
        self.state.gone.add(pool)
        self.runners.pop(pool, None)
        self.log(f"pool {pool} is gone (its worker stopped heart-beating); re-routing its clips")
        for run_id, child in lost.items():
            del self.children[run_id]
            rec = self.manifest.clips[child.clip_id]
            self.count_submissions(rec, tries[run_id])
            rec.state = "pending" if child.kind == "sample" else "sampled"

    def no_pool_left(self) -> bool:
        """True once no decoder — or, with clips still to sample, no sampler — has been alive for decoder_gone_s."""
        waiting = any(c.state == "pending" for c in self.manifest.clips.values())
        if self.live_pools("decode") and (self.live_pools("sample") or not waiting):
            self.pools_lost_since = None
            return False
        now = self.api.now()
        self.pools_lost_since = self.pools_lost_since or now
        return now - self.pools_lost_since > settings().decoder_gone_s

    def fail_run(self, why: str) -> None:
        for run_id in [*self.children, *self.runners.values()]:
            self.api.abandon(run_id, why)
        self.children.clear()
        self.runners.clear()
        self.manifest.state, self.manifest.error = "failed", why
        self.log(f"run failed: {why}")


def failure_of(state: str, message: str, results: dict[str, StageResult]) -> tuple[FailureKind, str]:
    """A failed child's kind and reason: the failed stage's row, else what its state says."""
    for result in results.values():
        if result.failure is not None:
            return result.failure, result.error or message
    if state in ("CRASHED", "CANCELLED"):
        return FailureKind.CRASHED, message
    return FailureKind.BUG, message
