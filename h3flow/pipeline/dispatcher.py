"""The dispatcher: sends each clip to the pool that finishes it earliest, live.

It keeps each pool's queue filled to its concurrency limit in Prefect (one clip on the
GPUs, one queued ahead), hands sampled latents to the decoders, re-routes what a pool
that Prefect reports NOT_READY has not started, re-sends what crashed (a child run's
heartbeats stopped: Prefect's automation marked it Crashed) or arrived damaged, and
records the manifest after every change. It talks to Prefect only through
:class:`DispatchApi`, so the pools can live on other hosts and tests can stand in for
Prefect. Liveness, claiming, cancellation of the children and their GPU slots are
Prefect's (docs/pipeline.md): the dispatcher decides routing and retries, nothing else.

Retries here are for what a flow run cannot retry itself (docs/pipeline.md,
"Retries"): a child that crashed or vanished is sent again, elsewhere if its pool is
not ready; a latent found damaged on the decoder is sent again. Every other failure is
final for this run (``resume`` tries again later). A clip's submissions of each stage
are counted over all its children and capped at
:data:`~h3flow.core.contracts.MAX_SUBMISSIONS`.

The Prefect server can go away at any call (a restart, a dropped connection), either
before it acted or after it acted but before its answer arrived. So each pass makes its
calls first and changes its own state only after they answered, and a submission whose
answer was lost is sent again verbatim — same idempotency key — so Prefect hands back the
run it may already have created instead of making a second one. (A key names the clip,
the attempt and the pool: a different call never gets an old run back.)

One run has one live dispatcher: each pass reads the dispatcher's own flow run with its
children's, and a dispatcher whose run is no longer Running in Prefect (cancelled,
crashed by the silence automation, taken over by ``resume``) stops at once.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from h3flow.config.models import LocalConfig
from h3flow.config.settings import settings
from h3flow.core.batch import Clip
from h3flow.core.contracts import AHEAD, CLIP_TAG, MAX_SUBMISSIONS, pool_tag, run_tag
from h3flow.core.errors import H3FlowError
from h3flow.pipeline.automations import HEARTBEAT_S
from h3flow.pipeline.lifecycle import ClipState, move
from h3flow.pipeline.manifest import ClipRecord, Manifest
from h3flow.pipeline.params import Budget
from h3flow.pipeline.prefect_api import TERMINAL_STATES, UNAVAILABLE, RunState, Submission
from h3flow.pipeline.results import FailureKind, StageResult
from h3flow.planner.schedule import Schedule

if TYPE_CHECKING:
    from h3flow.planner.best import Best

POLL = 0.5
API_GIVE_UP_S = 120.0  # the Prefect API unavailable this long ends the dispatcher (resume continues)
POOL_CHECK_S = 3.0  # how often the work pools' status is read (one API call)
DEFAULT_SECONDS = {"sample": 30.0, "decode": 10.0}
SAMPLE_STAGES = ("encode", "sample", "transfer")  # the budgeted stages of a sample-clip run
DECODE_STAGES = ("decode",)
NOT_STARTED = {"SCHEDULED"}  # a child its pool's worker has not claimed: safe to withdraw
VANISHED = "its flow run no longer exists in Prefect (deleted?)"


class DispatchApi(Protocol):
    """The Prefect calls the dispatcher makes (real: :class:`~h3flow.pipeline.prefect_api.PrefectApi`)."""

    def submit(self, submission: Submission) -> str: ...
    def states(self, run_ids: list[str]) -> dict[str, RunState]: ...  # a run that no longer exists is absent
    def results(self, run_id: str) -> dict[str, StageResult]: ...
    def task_tries(self, run_id: str) -> dict[str, int]: ...
    def ready_pools(self, work_pools: list[str]) -> set[str]: ...
    def queue_limits(self, work_pools: list[str]) -> dict[str, int | None]: ...
    def withdraw(self, run_id: str, why: str) -> None: ...
    def cancel(self, run_id: str, why: str) -> None: ...
    def now(self) -> float: ...
    def pause(self, seconds: float) -> None: ...


@dataclass
class Child:
    flow_run_id: str
    kind: str  # "sample" | "decode"
    clip_id: str
    pool: str
    submitted: float
    claimed_seen: float | None = None  # when a pass first saw it Pending (claimed, not started)


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


class Superseded(H3FlowError):
    """This dispatcher's flow run is over in Prefect (crashed, or taken over by ``resume``): it stops acting."""


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
        stop_requested: Callable[[], str | None] = lambda: None,
        plan: Best | None = None,
        better_plan: Future[Best | None] | None = None,
    ) -> None:
        self.config = config
        self.config_path = config_path
        self.manifest = manifest
        self.api = api
        self.save = save
        self.choose = choose
        self.incarnation = incarnation  # this dispatcher's flow run: a resumed run gets fresh child keys
        self.own_id = own_flow_run_id  # the batch flow run: this dispatcher acts while it is Running
        self.log = log
        self.stop_requested = stop_requested  # the worker asks this run to stop (cancelled in Prefect)
        self.plan = plan  # the plan it follows (the batch flow publishes it at the end)
        self.better_plan = better_plan  # a searched plan, being made in a thread: taken when it is ready
        self.unanswered: dict[str, tuple[Submission, str, str]] = {}  # clip -> (sample sent, pool, decoder)
        self.children: dict[str, Child] = {}
        self.dirty: set[str] = set()  # clips changed since the last save
        self.api_down_since: float | None = None  # the last answer before the API went away
        self.api_answered: float | None = None  # when the API last answered a whole pass
        self.state = LiveState()
        self.slots: dict[str, int] = {}  # pool -> clips it may hold (its queue's concurrency limit)
        self.pools_lost_since: float | None = None
        self.pools_checked: float | None = None
        self.withdrawals: dict[str, int] = {}  # clip -> its children withdrawn (they never ran: not tries)

    # ------------------------------------------------------------------ bookkeeping
    def timed(self, call: Callable[..., Any], *args: Any) -> Any:
        """Per-clip dispatcher work (submitting a child, reading its results), summed in the manifest."""
        tick = self.api.now()
        try:
            return call(*args)
        finally:
            self.manifest.dispatch_overhead_s += self.api.now() - tick

    def in_flight(self, pool: str) -> int:
        return sum(1 for c in self.children.values() if c.pool == pool)

    def has_room(self, pool: str) -> bool:
        return self.in_flight(pool) < self.slots.get(pool, AHEAD)

    def live_pools(self, role: str) -> list[str]:
        pools = self.config.samplers if role == "sample" else self.config.decoders
        return [p.name for p in pools if p.name not in self.state.gone]

    def move(self, rec: ClipRecord, to: ClipState) -> None:
        """Every clip state change of the run: the lifecycle's table decides; the clip is saved next."""
        move(rec, to, rec.clip.id)
        self.dirty.add(rec.clip.id)

    @staticmethod
    def budget(rec: ClipRecord, stages: tuple[str, ...]) -> Budget:
        """Submissions each stage may still make for this clip."""
        return Budget(**{stage: max(0, MAX_SUBMISSIONS - rec.submissions.get(stage, 0)) for stage in stages})

    # ------------------------------------------------------------------ the loop
    def run(self) -> Manifest:
        """Dispatch until every clip is delivered or failed (or the run is cancelled); returns the
        manifest with its final state set but not yet saved (``wait`` ends when it sees that state)."""
        self.manifest.state = "running"
        self.manifest.started = self.manifest.started or self.api.now()
        self.restart_interrupted()
        self.slots = self.read_slots()
        self.beat()
        try:
            while not self.step():
                self.api.pause(POLL)
        except Superseded as exc:
            self.log(f"this dispatcher stops: {exc}")
            self.beat()  # its last facts; the dispatcher that took over loads them once this one has let go
            raise
        except Exception as exc:  # a defect, or the API gone for good: the children finish; resume continues
            self.manifest.state, self.manifest.error = "failed", f"the dispatcher stopped: {type(exc).__name__}: {exc}"
            self.manifest.finished = self.api.now()
            self.beat()
            raise
        self.manifest.finished = self.api.now()
        if self.manifest.state == "running":
            self.manifest.state = "failed" if self.manifest.failed else "completed"
        return self.manifest  # unsaved: the caller saves the final state once the report is out

    def read_slots(self) -> dict[str, int]:
        """Each pool's queue concurrency limit in Prefect (``h3flow deploy`` sets it to AHEAD)."""
        pools = {p.work_pool: p.name for p in self.config.pools}
        while True:
            try:
                limits = self.api.queue_limits(list(pools))
                self.api_answered = self.api.now()
                return {pools[wp]: limit or AHEAD for wp, limit in limits.items() if wp in pools}
            except UNAVAILABLE as exc:
                self.waiting_for_api(exc)
                self.api.pause(POLL)

    def waiting_for_api(self, exc: BaseException) -> None:
        """The API did not answer: wait for it, up to API_GIVE_UP_S since its last answer (a failing
        call may itself take long to fail: the outage is counted from the last answer, not from it)."""
        now = self.api.now()
        if self.api_down_since is None:
            self.api_down_since = self.api_answered if self.api_answered is not None else now
            self.log(f"Prefect API unavailable ({type(exc).__name__}: {exc}); waiting up to {API_GIVE_UP_S:.0f} s")
        if now - self.api_down_since > API_GIVE_UP_S:
            raise exc

    def step(self) -> bool:
        """One pass of the loop; True when the run is over. The API being briefly unavailable
        (a busy or restarting server) is waited out, up to ``API_GIVE_UP_S``."""
        try:
            self.take_better_plan()
            states = self.api.states([*self.children, *([self.own_id] if self.own_id else [])])
            if self.stopping(states):
                return True
            changed = self.collect(states)
            changed |= self.withdraw_stuck_claims(states)
            changed |= self.check_pools(states)
            changed |= self.submit_decodes()
            changed |= self.submit_samples()
            if changed:
                self.beat()
            if self.no_pool_left():
                role = "decoder" if not self.live_pools("decode") else "sampler pool"
                self.fail_run(f"no {role} is ready in Prefect: no worker of any {role} is online", states)
                return True
        except UNAVAILABLE as exc:
            self.waiting_for_api(exc)
            return False
        self.api_answered = self.api.now()
        if self.api_down_since is not None:
            self.log(f"Prefect API back: it had not answered for {self.api_answered - self.api_down_since:.0f} s")
            self.api_down_since = None
            for child in self.children.values():  # its worker may be starting it now that the API is back
                child.claimed_seen = None
        return not self.children and all(c.state in ("delivered", "failed") for c in self.manifest.clips.values())

    def take_better_plan(self) -> None:
        """Follow the searched plan once its thread has it (the first clips went by the heuristics')."""
        if self.better_plan is None or not self.better_plan.done():
            return
        best, self.better_plan = self.better_plan.result(), None
        if best is None:
            return
        from h3flow.pipeline.plan import record_plan

        self.plan = best
        record_plan(self.manifest, best)
        self.dirty |= set(self.manifest.clips)
        self.choose = planner_chooser(self.config, best.schedule)
        self.log(f"plan: {best.schedule.makespan:.1f} s, proven bound {best.proven:.1f} s ({best.method})")

    def beat(self) -> None:
        """Save the manifest (only the clips that changed), stamped with when."""
        self.manifest.heartbeat = self.api.now()
        self.save(self.manifest, self.dirty)
        self.dirty = set()

    def restart_interrupted(self) -> None:
        """Clips a dead dispatcher had in flight start over from their last finished step."""
        for rec in self.manifest.clips.values():
            if rec.state in ("sampling", "decoding"):
                self.move(rec, "pending" if rec.state == "sampling" else "sampled")

    def stopping(self, states: dict[str, RunState]) -> bool:
        """True once the batch run is being cancelled; raises :class:`Superseded` once it is over."""
        why = self.stop_requested()
        if self.own_id is not None:
            own, message = states.get(self.own_id, ("GONE", "its flow run no longer exists"))
            if own in ("CANCELLING", "CANCELLED"):
                why = why or message or "cancelled in Prefect"
            elif own != "RUNNING":
                raise Superseded(f"its flow run {self.own_id} is {own.lower()} in Prefect ({message or 'no reason'})")
        if why is None:
            return False
        self.cancel_children(why, states)
        for rec in self.manifest.clips.values():
            if rec.state not in ("delivered", "failed", "cancelled"):
                self.move(rec, "cancelled")
        self.children.clear()
        self.manifest.state = "cancelled"
        self.log(f"run cancelled ({why}): its clip runs are cancelled with it")
        return True

    def cancel_children(self, why: str, states: dict[str, RunState]) -> None:
        """Cancel the live children at once: what Prefect's cascade does once this run is Cancelled,
        but its server-side write is not retried before its next loop, and on SQLite it fails
        under load ("database is locked": twice in a row for all four clips of a measured run,
        which then ran to their end). The cascade stays the fallback (a dispatcher that died)."""
        for run_id in self.children:
            state = states.get(run_id, ("GONE", None))[0]
            if state in NOT_STARTED:
                self.api.withdraw(run_id, f"cancelled with its batch run: {why}")
            elif state in ("PENDING", "RUNNING", "PAUSED"):
                self.api.cancel(run_id, f"cancelled with its batch run: {why}")

    def tags(self, pool: str) -> list[str]:
        return [self.run_tag, pool_tag(pool), CLIP_TAG]

    @property
    def run_tag(self) -> str:
        return run_tag(self.manifest.run_id)

    def submit_samples(self) -> bool:
        changed = False
        pools = self.live_pools("sample")
        for rec in self.manifest.clips.values():
            if rec.state != "pending":
                continue
            free = [p for p in pools if self.has_room(p)]
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
            run_id = str(self.timed(self.api.submit, submission))
            del self.unanswered[rec.clip.id]
            self.move(rec, "sampling")
            rec.pool, rec.decoder = pool, decoder
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
            "budget": self.budget(rec, SAMPLE_STAGES).model_dump(),
        }
        key = self.child_key(rec, f"s{rec.attempts + 1}", pool)
        name = child_name(self.manifest.run_id, rec.clip.id, "sample", pool)
        return Submission(f"sample-clip/{pool}", params, key, name, self.tags(pool))

    def child_key(self, rec: ClipRecord, attempt: str, pool: str) -> str:
        """A child's idempotency key: one per call (the same call sent again after a lost answer gets the
        run Prefect may already have made; any other call, a new run). A withdrawn child does not count
        as an attempt, so the key counts withdrawals too: a clip withdrawn from a pool may go back to it."""
        withdrawn = self.withdrawals.get(rec.clip.id, 0)
        return f"{self.manifest.run_id}-{rec.clip.id}-{self.incarnation}-{attempt}{f'w{withdrawn}' if withdrawn else ''}-{pool}"

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
            if decoder is None or not self.has_room(decoder):
                continue
            params = {
                "run_id": self.manifest.run_id,
                "clip": rec.clip.model_dump(mode="json"),
                "latent_sha256": rec.latent_sha256,
                "decoder": decoder,
                "config_path": self.config_path,
                "budget": self.budget(rec, DECODE_STAGES).model_dump(),
            }
            key = self.child_key(rec, f"d{rec.decode_attempts + 1}", decoder)
            name = child_name(self.manifest.run_id, rec.clip.id, "decode", decoder)
            submission = Submission(f"decode-clip/{decoder}", params, key, name, self.tags(decoder))
            run_id = str(self.timed(self.api.submit, submission))  # a lost answer: the next pass sends this same call
            self.move(rec, "decoding")
            rec.decode_attempts += 1
            rec.timeline["decode_submitted"] = self.api.now()
            self.children[run_id] = Child(run_id, "decode", rec.clip.id, decoder, self.api.now())
            changed = True
        return changed

    def collect(self, states: dict[str, RunState]) -> bool:
        """Collect the children that ended; one that no longer exists (deleted in the UI) is re-sent
        like a crashed one."""
        changed = False
        for run_id, child in list(self.children.items()):
            vanished = run_id not in states
            state, message = ("CRASHED", VANISHED) if vanished else states[run_id]
            if state not in TERMINAL_STATES:
                continue
            results = {} if vanished else self.timed(self.api.results, run_id)
            tries = {} if vanished else self.tries_of(child, results)  # a vanished run's task runs went with it
            del self.children[run_id]
            rec = self.manifest.clips[child.clip_id]
            self.count_submissions(rec, tries)
            if state == "COMPLETED":
                self.completed(child, rec, results)
            else:
                self.failed(child, rec, state, message or state.lower(), results)
            changed = True
        return changed

    def tries_of(self, child: Child, results: dict[str, StageResult]) -> dict[str, int]:
        """A finished child's prompt submissions per stage: its results for the stages it finished,
        Prefect's task runs for the rest (it crashed or failed part-way)."""
        stages = SAMPLE_STAGES if child.kind == "sample" else DECODE_STAGES
        tries = {stage: r.tries for stage, r in results.items() if r.failure is None}
        if set(stages) <= set(tries):
            return tries
        return {**self.api.task_tries(child.flow_run_id), **tries}

    def count_submissions(self, rec: ClipRecord, tries: dict[str, int]) -> None:
        """Add a finished child's submissions to the clip's tally."""
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
            self.move(rec, "sampled")
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
            self.move(rec, "delivered")
            rec.timeline["delivered"] = now
            self.log(f"{rec.clip.id}: delivered {rec.output}")

    def failed(self, child: Child, rec: ClipRecord, state: str, message: str, results: dict[str, StageResult]) -> None:
        """Retry what only the dispatcher can (a crash, a latent damaged on the decoder); fail the rest."""
        rec.stages.update({stage: r for stage, r in results.items() if r.failure is None})
        kind, reason = failure_of(state, message, results)
        retry_as: ClipState | None = None
        if kind in (FailureKind.CRASHED, FailureKind.TIMEOUT):
            retry_as = "pending" if child.kind == "sample" else "sampled"
        elif kind is FailureKind.INTEGRITY and child.kind == "decode":
            retry_as = "pending"  # send the latent again (sampling is cached), never decode the damaged copy
        spent = self.spent(rec, "sample" if retry_as == "pending" else "decode")
        if retry_as is not None and spent:
            kind, reason, retry_as = FailureKind.BUDGET, f"{spent}; last: {kind.value}: {reason}", None
        if retry_as is None:
            self.move(rec, "failed")
            rec.failure, rec.error = kind, f"{child.kind} on {child.pool}: {kind.value}: {reason}"
            self.log(f"{rec.clip.id}: failed — {rec.error}")
            return
        if kind is FailureKind.INTEGRITY:
            rec.retransfer = True
        self.move(rec, retry_as)
        self.log(f"{rec.clip.id}: {child.kind} on {child.pool} {kind.value} ({reason}); sending it again")

    @staticmethod
    def spent(rec: ClipRecord, kind: str) -> str | None:
        """Why the clip may not be sent again as ``kind`` (its runs or a stage's submissions are used up)."""
        attempts = rec.attempts if kind == "sample" else rec.decode_attempts
        if attempts >= MAX_SUBMISSIONS:
            return f"{kind} sent {attempts} times"
        stages = SAMPLE_STAGES if kind == "sample" else DECODE_STAGES
        used = [s for s in stages if rec.submissions.get(s, 0) >= MAX_SUBMISSIONS]
        return f"{used[0]} submitted {rec.submissions[used[0]]} times" if used else None

    def check_pools(self, states: dict[str, RunState]) -> bool:
        """Prefect's work-pool status decides routing: a pool that is not READY (no worker online)
        gets nothing new, and the clips it has not started go elsewhere. What it has started is
        Prefect's to judge: a run whose heartbeats stop is marked Crashed, then sent again."""
        now = self.api.now()
        if self.pools_checked is not None and now - self.pools_checked < POOL_CHECK_S:
            return False
        ready = self.api.ready_pools([p.work_pool for p in self.config.pools])
        self.pools_checked = now
        changed = False
        for pool in self.config.pools:
            if pool.work_pool in ready:
                if pool.name in self.state.gone:
                    self.state.gone.discard(pool.name)
                    self.log(f"pool {pool.name} is ready again")
                    changed = True
                continue
            if pool.name not in self.state.gone:
                self.state.gone.add(pool.name)
                self.log(f"pool {pool.name} is not ready in Prefect (no worker online): routing around it")
                changed = True
            changed |= self.withdraw_unstarted(pool.name, states)
        return changed

    def withdraw_unstarted(self, pool: str, states: dict[str, RunState]) -> bool:
        """Cancel the children a not-ready pool has not claimed, and route their clips again (calls
        first: a call that fails leaves the rest for the next check)."""
        changed = False
        for run_id, child in list(self.children.items()):
            if child.pool == pool and states.get(run_id, ("", None))[0] in NOT_STARTED:
                self.withdraw(child, f"pool {pool} has no worker online")
                changed = True
        return changed

    def withdraw_stuck_claims(self, states: dict[str, RunState]) -> bool:
        """Withdraw a child that stays claimed (Pending) and unstarted past the silence window and a
        heartbeat. Prefect's automation for it (``NEVER_STARTED``) normally acts first; it misses a
        claim when the server went away with the claim's event (test_multihost: a server and database
        restart left two claims Pending for good). An h3flow worker starts a run within a second of
        claiming it, so one Pending this long is a claim whose worker never heard the answer."""
        now, window = self.api.now(), settings().silence_s + HEARTBEAT_S
        changed = False
        for run_id, child in list(self.children.items()):
            if states.get(run_id, ("", None))[0] != "PENDING":
                child.claimed_seen = None
            elif child.claimed_seen is None:
                child.claimed_seen = now
            elif now - child.claimed_seen > window:
                self.withdraw(child, f"claimed by a worker of pool {child.pool} and not started for {window:.0f} s")
                changed = True
        return changed

    def withdraw(self, child: Child, why: str) -> None:
        """Cancel an unstarted child and route its clip again; it was not a try (the call first)."""
        self.api.withdraw(child.flow_run_id, f"withdrawn: {why}; the clip is routed again")
        del self.children[child.flow_run_id]
        rec = self.manifest.clips[child.clip_id]
        self.withdrawals[rec.clip.id] = self.withdrawals.get(rec.clip.id, 0) + 1
        if child.kind == "sample":
            rec.attempts -= 1
            self.move(rec, "pending")
        else:
            rec.decode_attempts -= 1
            self.move(rec, "sampled")
        self.log(f"{rec.clip.id}: withdrawn from pool {child.pool} before it started ({why})")

    def no_pool_left(self) -> bool:
        """True once no decoder — or, with clips still to sample, no sampler — has been ready for decoder_gone_s."""
        waiting = any(c.state == "pending" for c in self.manifest.clips.values())
        if self.live_pools("decode") and (self.live_pools("sample") or not waiting):
            self.pools_lost_since = None
            return False
        now = self.api.now()
        self.pools_lost_since = self.pools_lost_since or now
        return now - self.pools_lost_since > settings().decoder_gone_s

    def fail_run(self, why: str, states: dict[str, RunState]) -> None:
        """The run cannot go on: what has not started is withdrawn; what runs finishes (resume uses it)."""
        for run_id in self.children:
            if states.get(run_id, ("", None))[0] in NOT_STARTED:
                self.api.withdraw(run_id, why)
        self.children.clear()
        self.manifest.state, self.manifest.error = "failed", why
        self.log(f"run failed: {why}")


def child_name(run_id: str, clip_id: str, kind: str, pool: str) -> str:
    """A child flow run's name: ``<run>/<clip> <kind> on <pool>`` (the UI and ``status`` read it)."""
    return f"{run_id}/{clip_id} {kind} on {pool}"


def failure_of(state: str, message: str, results: dict[str, StageResult]) -> tuple[FailureKind, str]:
    """A failed child's kind and reason: its failed stage's row says (a stage that fails publishes its
    row with its kind, ``bug`` included). A run that ended without such a row crashed, or could not
    reach the Prefect API to publish it (a server restart: "All connection attempts failed"): it is
    sent again like a crashed one, within the clip's budget."""
    for result in results.values():
        if result.failure is not None:
            return result.failure, result.error or message
    return FailureKind.CRASHED, message
