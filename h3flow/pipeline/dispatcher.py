"""The dispatcher: sends each clip to the pool that finishes it earliest, live.

It keeps, per sampler pool, one clip running and one queued ahead (so a worker's
process start-up overlaps the running clip), hands sampled latents to the decoder
queue, notices pools that die (their worker stops heart-beating) and re-routes their
clips, re-sends latents the decoder found damaged, and writes the manifest after
every change. It talks to Prefect only through deployments and the API, so the pools
can live on other hosts.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from h3flow.config.models import LocalConfig
from h3flow.config.settings import settings
from h3flow.core.batch import Clip
from h3flow.core.errors import H3FlowError
from h3flow.core.files import file_intact
from h3flow.core.fsutil import sha256_file
from h3flow.pipeline.manifest import ClipRecord, Manifest, StageRecord, save_manifest
from h3flow.pipeline.prefect_api import PrefectApi
from h3flow.planner.schedule import Schedule

AHEAD = 2  # in flight per pool: one running + one queued ahead
MAX_ATTEMPTS = 4
POLL = 0.5
POOL_CHECK_S = 3.0  # how often worker heartbeats are read (each is one API call per pool)
DEFAULT_SECONDS = {"sample": 30.0, "decode": 10.0}
TERMINAL = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}


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
    def __init__(
        self,
        config: LocalConfig,
        config_path: str,
        manifest: Manifest,
        api: PrefectApi,
        choose: Chooser = earliest_finish,
        on_change: Callable[[Manifest], None] | None = None,
    ) -> None:
        self.config = config
        self.config_path = config_path
        self.manifest = manifest
        self.api = api
        self.choose = choose
        self.on_change = on_change
        self.children: dict[str, Child] = {}
        self.state = LiveState()
        self.retransfer: set[str] = set()
        self.pools_lost_since: float | None = None
        self.pools_checked = 0.0

    # ------------------------------------------------------------------ bookkeeping
    def save(self) -> None:
        save_manifest(self.config.runs_dir, self.manifest)
        if self.on_change:
            self.on_change(self.manifest)

    @property
    def run_tag(self) -> str:
        return f"h3flow-run:{self.manifest.run_id}"

    def timed(self, call: Callable[..., Any], *args: Any) -> Any:
        """Per-clip dispatcher work (submitting a child, reading its records), summed in the manifest."""
        tick = time.perf_counter()
        try:
            return call(*args)
        finally:
            self.manifest.dispatch_overhead_s += time.perf_counter() - tick

    def in_flight(self, pool: str) -> int:
        return sum(1 for c in self.children.values() if c.pool == pool)

    def live_pools(self, role: str) -> list[str]:
        pools = self.config.samplers if role == "sample" else self.config.decoders
        return [p.name for p in pools if p.name not in self.state.gone]

    # ------------------------------------------------------------------ the loop
    def run(self) -> Manifest:
        """Dispatch until every clip is delivered or failed; returns the manifest with its
        final state set but not yet saved (``wait`` ends when it sees that state)."""
        self.manifest.state = "running"
        self.manifest.started = self.manifest.started or time.time()
        self.retransfer |= reconcile(self.config, self.manifest)
        self.save()
        while True:
            changed = self.poll_children()
            changed |= self.check_pools()
            changed |= self.submit_decodes()
            changed |= self.submit_samples()
            if changed:
                self.save()
            if not self.children and all(c.state in ("delivered", "failed") for c in self.manifest.clips.values()):
                break
            if self.no_pool_left():
                role = "decoder" if not self.live_pools("decode") else "sampler pool"
                self.fail_run(f"no {role} is alive: every {role}'s worker stopped heart-beating")
                break
            self.api.pause(POLL)
        self.manifest.finished = time.time()
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
            now = time.time()
            pool = self.choose(rec.clip, free, self.state, now)
            if pool is None:
                continue
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
            }
            run_id = self.timed(
                self.api.submit,
                f"sample-clip/{pool}",
                params,
                f"{self.manifest.run_id}-{rec.clip.id}-s{rec.attempts}",
                f"{rec.clip.id}·sample·{pool}",
                self.run_tag,
            )
            self.children[run_id] = Child(run_id, "sample", rec.clip.id, pool, now)
            start = max(self.state.busy_until.get(pool, now), now)
            self.state.busy_until[pool] = start + self.state.estimate(pool, rec.clip.spec, "sample")
            changed = True
        return changed

    def pick_decoder(self) -> str:
        decoders = self.live_pools("decode")
        return min(decoders, key=lambda d: (self.in_flight(d), d))

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
            }
            rec.state = "decoding"
            rec.timeline["decode_submitted"] = time.time()
            key = f"{self.manifest.run_id}-{rec.clip.id}-d{rec.attempts}-{len(self.children)}-{time.time():.0f}"
            run_id = self.timed(
                self.api.submit, f"decode-clip/{decoder}", params, key, f"{rec.clip.id}·decode·{decoder}", self.run_tag
            )
            self.children[run_id] = Child(run_id, "decode", rec.clip.id, decoder, time.time())
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
            if state == "COMPLETED":
                self.completed(child, rec, self.timed(self.api.records, run_id))
            else:
                self.failed(child, rec, state, message or state.lower())
            changed = True
        return changed

    def completed(self, child: Child, rec: ClipRecord, records: dict[str, dict[str, Any]]) -> None:
        for stage, data in records.items():
            rec.stages[stage] = StageRecord(
                host=data.get("host"),
                pool=data.get("pool", child.pool),
                sha256=data.get("sha256"),
                path=data.get("path"),
                started=data.get("started"),
                seconds=data.get("seconds"),
                cached=bool(data.get("cached", False)),
            )
        if child.kind == "sample":
            rec.latent_sha256 = records["transfer"]["sha256"]
            rec.state = "sampled"
            rec.timeline["sampled"] = time.time()
            self.retransfer.discard(rec.clip.id)
            took = time.time() - child.submitted
            self.state.measured.setdefault((child.pool, rec.clip.spec), []).append(took)
            self.state.busy_until[child.pool] = (
                time.time() if self.in_flight(child.pool) == 0 else self.state.busy_until.get(child.pool, time.time())
            )
        else:
            rec.output = records["decode"]["path"]
            rec.output_sha256 = records["decode"]["sha256"]
            rec.state = "delivered"
            rec.timeline["delivered"] = time.time()

    def failed(self, child: Child, rec: ClipRecord, state: str, message: str) -> None:
        corrupt = "latent-corrupt" in message
        if child.kind == "decode" and corrupt:
            self.retransfer.add(rec.clip.id)  # damaged on the decoder: send it again, never decode it
            rec.state = "pending"
            return
        if rec.attempts >= MAX_ATTEMPTS or not self.retryable(state, message):
            rec.state, rec.error = "failed", f"{child.kind} on {child.pool}: {message}"
            return
        rec.state = "pending" if child.kind == "sample" else "sampled"
        if child.kind == "decode":
            rec.attempts += 1

    @staticmethod
    def retryable(state: str, message: str) -> bool:
        bad_input = ("ConfigError", "invalid", "unknown spec", "does not exist")
        return state in ("CRASHED", "CANCELLED") or not any(word in message for word in bad_input)

    def check_pools(self) -> bool:
        """A pool whose worker stopped heart-beating is gone: re-route what it held."""
        if time.monotonic() - self.pools_checked < POOL_CHECK_S:
            return False
        self.pools_checked = time.monotonic()
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
                        rec.state = "pending" if child.kind == "sample" else "sampled"
                changed = True
        return changed

    def no_pool_left(self) -> bool:
        """True once no decoder — or, with clips still to sample, no sampler — has been alive for DECODER_GONE_S."""
        waiting = any(c.state == "pending" for c in self.manifest.clips.values())
        if self.live_pools("decode") and (self.live_pools("sample") or not waiting):
            self.pools_lost_since = None
            return False
        self.pools_lost_since = self.pools_lost_since or time.time()
        return time.time() - self.pools_lost_since > settings().decoder_gone_s

    def fail_run(self, why: str) -> None:
        for child_id in list(self.children):
            self.api.abandon(child_id, why)
        self.children.clear()
        self.manifest.state, self.manifest.error = "failed", why


def latent_on_decoder(config: LocalConfig, decoder: str, sha: str) -> bool:
    from h3flow.handoff.store import LatentStore

    host = config.pool(decoder).host
    path = LatentStore(Path(config.hosts[host].storage.root)).path_for(sha)
    return path.exists() and sha256_file(path) == sha


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
