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
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from h3flow.config.models import LocalConfig
from h3flow.config.settings import settings
from h3flow.core.batch import Clip
from h3flow.core.contracts import AHEAD, MAX_SUBMISSIONS, run_tag
from h3flow.core.errors import H3FlowError
from h3flow.core.files import file_intact
from h3flow.pipeline.manifest import ClipRecord, ClipState, Manifest
from h3flow.pipeline.results import FailureKind, StageResult

POLL = 0.5
POOL_CHECK_S = 3.0  # how often worker heartbeats are read (each is one API call per pool)
DEFAULT_SECONDS = {"sample": 30.0, "decode": 10.0}
TERMINAL = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}
SAMPLE_STAGES = ("encode", "sample", "transfer")  # the budgeted stages of a sample-clip run
DECODE_STAGES = ("decode",)


class DispatchApi(Protocol):
    """The Prefect calls the dispatcher makes (real: :class:`~h3flow.pipeline.prefect_api.PrefectApi`)."""

    def submit(
        self, deployment: str, parameters: dict[str, Any], idempotency_key: str, name: str, run_tag: str
    ) -> str: ...
    def states(self, run_ids: list[str]) -> dict[str, tuple[str, str | None]]: ...
    def results(self, run_id: str) -> dict[str, StageResult]: ...
    def task_tries(self, run_id: str) -> dict[str, int]: ...
    def worker_alive(self, work_pool: str) -> bool: ...
    def abandon(self, run_id: str, why: str) -> None: ...
    def now(self) -> float: ...
    def pause(self, seconds: float) -> None: ...


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


Chooser = Callable[[Clip, list[str], LiveState, float], str]


def earliest_finish(clip: Clip, pools: list[str], state: LiveState, now: float) -> str:
    """The pool that would finish this clip first, from the durations measured so far."""
    return min(
        pools, key=lambda p: (max(state.busy_until.get(p, now), now) + state.estimate(p, clip.spec, "sample"), p)
    )


def planner_chooser(config: LocalConfig) -> Chooser:
    """The planner's earliest-finish policy on the live state (profile times until measured ones exist).

    Falls back to :func:`earliest_finish` on measured times alone when the profile does
    not cover this cluster's devices.
    """
    from h3flow.planner import Planner, Resources, State, load_profile, make_policy

    try:
        profile = load_profile()
        planner = Planner(profile, Resources.from_config(config, profile.encoder_vram_gb))
    except H3FlowError:
        return earliest_finish
    policy = make_policy("earliest-finish", planner)
    samplers = {p.name for p in config.samplers}

    def choose(clip: Clip, free: list[str], live: LiveState, now: float) -> str:
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
        save: Callable[[Manifest], None],
        choose: Chooser = earliest_finish,
        incarnation: str = "d0",
    ) -> None:
        self.config = config
        self.config_path = config_path
        self.manifest = manifest
        self.api = api
        self.save = save
        self.choose = choose
        self.incarnation = incarnation  # this dispatcher's flow run: a resumed run gets fresh child keys
        self.children: dict[str, Child] = {}
        self.state = LiveState()
        self.retransfer: set[str] = set()
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
        """Dispatch until every clip is delivered or failed; returns the manifest with its
        final state set but not yet saved (``wait`` ends when it sees that state)."""
        self.manifest.state = "running"
        self.manifest.started = self.manifest.started or self.api.now()
        self.retransfer |= reconcile(self.config, self.manifest)
        self.save(self.manifest)
        while True:
            changed = self.poll_children()
            changed |= self.check_pools()
            changed |= self.submit_decodes()
            changed |= self.submit_samples()
            if changed:
                self.save(self.manifest)
            if not self.children and all(c.state in ("delivered", "failed") for c in self.manifest.clips.values()):
                break
            if self.no_pool_left():
                role = "decoder" if not self.live_pools("decode") else "sampler pool"
                self.fail_run(f"no {role} is alive: every {role}'s worker stopped heart-beating")
                break
            self.api.pause(POLL)
        self.manifest.finished = self.api.now()
        if self.manifest.state == "running":
            self.manifest.state = "failed" if self.manifest.failed else "completed"
        return self.manifest  # unsaved: the caller saves the final state once the report is out

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
            pool = self.choose(rec.clip, free, self.state, now)
            decoder = self.pick_decoder()
            rec.state, rec.pool, rec.decoder = "sampling", pool, decoder
            rec.attempts += 1
            rec.timeline["sample_submitted"] = now
            params = {
                "run_id": self.manifest.run_id,
                "clip": rec.clip.model_dump(mode="json"),
                "pool": pool,
                "decoder": decoder,
                "config_path": self.config_path,
                "retransfer": rec.clip.id in self.retransfer,
                "budget": self.budget(rec, SAMPLE_STAGES),
            }
            key = f"{self.manifest.run_id}-{rec.clip.id}-{self.incarnation}-s{rec.attempts}"
            name = f"{rec.clip.id}·sample·{pool}"
            run_id = self.timed(self.api.submit, f"sample-clip/{pool}", params, key, name, self.run_tag)
            self.children[run_id] = Child(run_id, "sample", rec.clip.id, pool, now)
            start = max(self.state.busy_until.get(pool, now), now)
            self.state.busy_until[pool] = start + self.state.estimate(pool, rec.clip.spec, "sample")
            changed = True
        return changed

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
            rec.state = "decoding"
            rec.decode_attempts += 1
            rec.timeline["decode_submitted"] = self.api.now()
            key = f"{self.manifest.run_id}-{rec.clip.id}-{self.incarnation}-d{rec.decode_attempts}"
            name = f"{rec.clip.id}·decode·{decoder}"
            run_id = self.timed(self.api.submit, f"decode-clip/{decoder}", params, key, name, self.run_tag)
            self.children[run_id] = Child(run_id, "decode", rec.clip.id, decoder, self.api.now())
            changed = True
        return changed

    def poll_children(self) -> bool:
        if not self.children:
            return False
        changed = False
        for run_id, (state, message) in self.api.states(list(self.children)).items():
            if state not in TERMINAL:
                continue
            child = self.children.pop(run_id)
            rec = self.manifest.clips[child.clip_id]
            results = self.timed(self.api.results, run_id)
            if state == "COMPLETED":
                self.completed(child, rec, results)
            else:
                self.failed(child, rec, state, message or state.lower(), results)
            changed = True
        return changed

    def count_submissions(self, run_id: str, rec: ClipRecord, results: dict[str, StageResult]) -> None:
        """Add a finished child's prompt submissions to the clip's tally (from Prefect if it crashed)."""
        tries = {stage: r.tries for stage, r in results.items() if r.failure is None}
        if set(tries) < set(SAMPLE_STAGES) and set(tries) < set(DECODE_STAGES):
            tries = {**self.api.task_tries(run_id), **tries}  # crashed or failed mid-stage: ask Prefect
        for stage, n in tries.items():
            rec.submissions[stage] = rec.submissions.get(stage, 0) + n

    def completed(self, child: Child, rec: ClipRecord, results: dict[str, StageResult]) -> None:
        self.count_submissions(child.flow_run_id, rec, results)
        rec.stages.update(results)
        now = self.api.now()
        needed = "transfer" if child.kind == "sample" else "decode"
        if needed not in results:
            raise H3FlowError(f"flow run {child.flow_run_id} completed without publishing its {needed} result")
        if child.kind == "sample":
            rec.latent_sha256 = results["transfer"].sha256
            rec.state = "sampled"
            rec.timeline["sampled"] = now
            self.retransfer.discard(rec.clip.id)
            self.state.measured.setdefault((child.pool, rec.clip.spec), []).append(now - child.submitted)
            if self.in_flight(child.pool) == 0:
                self.state.busy_until[child.pool] = now
        else:
            rec.output = results["decode"].path
            rec.output_sha256 = results["decode"].sha256
            rec.state = "delivered"
            rec.timeline["delivered"] = now

    def failed(self, child: Child, rec: ClipRecord, state: str, message: str, results: dict[str, StageResult]) -> None:
        """Retry what only the dispatcher can (a crash, a latent damaged on the decoder); fail the rest."""
        self.count_submissions(child.flow_run_id, rec, results)
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
            return
        if kind is FailureKind.INTEGRITY:
            self.retransfer.add(rec.clip.id)
        rec.state = retry_as

    def check_pools(self) -> bool:
        """A pool whose worker stopped heart-beating is gone: re-route what it held."""
        now = self.api.now()
        if self.pools_checked is not None and now - self.pools_checked < POOL_CHECK_S:
            return False
        self.pools_checked = now
        changed = False
        for pool in self.config.pools:
            alive = self.api.worker_alive(pool.work_pool)
            if alive and pool.name in self.state.gone:
                self.state.gone.discard(pool.name)
                changed = True
            elif not alive and pool.name not in self.state.gone:
                self.state.gone.add(pool.name)
                for run_id, child in list(self.children.items()):
                    if child.pool == pool.name:
                        self.api.abandon(run_id, f"pool {pool.name} is gone (its worker stopped heart-beating)")
                        del self.children[run_id]
                        rec = self.manifest.clips[child.clip_id]
                        self.count_submissions(run_id, rec, {})
                        rec.state = "pending" if child.kind == "sample" else "sampled"
                changed = True
        return changed

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
        for child_id in list(self.children):
            self.api.abandon(child_id, why)
        self.children.clear()
        self.manifest.state, self.manifest.error = "failed", why


def failure_of(state: str, message: str, results: dict[str, StageResult]) -> tuple[FailureKind, str]:
    """A failed child's kind and reason: the failed stage's row, else what its state says."""
    for result in results.values():
        if result.failure is not None:
            return result.failure, result.error or message
    if state in ("CRASHED", "CANCELLED"):
        return FailureKind.CRASHED, message
    return FailureKind.BUG, message


def latent_on_decoder(config: LocalConfig, decoder: str, sha: str) -> bool:
    from h3flow.handoff.store import LatentStore

    host = config.pool(decoder).host
    return file_intact(LatentStore(Path(config.hosts[host].storage.root)).path_for(sha), sha)


def reconcile(config: LocalConfig, manifest: Manifest) -> set[str]:
    """Trust the files, not the record: what is delivered, what is sampled, what is left.

    A delivered clip keeps its state only if its MP4 still hashes right; a clip whose
    latent is verified in the decoder's store needs only decoding; the rest sample again
    (where Prefect's cache makes the finished stages free). Returns the clips whose
    latent had reached the decoder but is now missing or damaged there: they are sent
    again, never decoded from the damaged copy.
    """
    resend: set[str] = set()
    for rec in manifest.clips.values():
        if rec.state == "delivered" and rec.output and file_intact(rec.output, rec.output_sha256):
            continue
        if rec.latent_sha256 and rec.decoder and latent_on_decoder(config, rec.decoder, rec.latent_sha256):
            rec.state = "sampled"
        elif rec.state != "failed":
            if rec.latent_sha256:
                resend.add(rec.clip.id)
            rec.state = "pending"
    return resend
