"""The dispatcher's decisions, against an in-memory stand-in for the Prefect API.

The stand-in (:class:`FakePrefect`) is the one fake here, for speed: it runs each
pool's children one at a time on a simulated clock, so routing, pools that stop being
ready, re-routing, retries and budgets are checked in milliseconds. The same dispatcher
runs against the real server in tests/test_pipeline.py, test_faults.py and test_multihost.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from h3flow.config.adapt import adapt
from h3flow.config.models import LocalConfig, load_host_map
from h3flow.core.batch import Clip
from h3flow.core.contracts import AHEAD, MAX_SUBMISSIONS, pool_tag, run_tag
from h3flow.pipeline.dispatcher import POLL, Dispatcher, Submission, Superseded
from h3flow.pipeline.manifest import Manifest, new_manifest
from h3flow.pipeline.prefect_api import RunState
from h3flow.pipeline.results import FailureKind, StageResult

ROOT = Path(__file__).resolve().parents[1]
IMAGE = ROOT / "examples" / "images" / "landscape.png"
SHA = "ab" * 32


@pytest.fixture(scope="module")
def config() -> LocalConfig:
    return adapt(load_host_map(ROOT / "examples" / "host-map.example.json"), "four_four_plus_one")


@dataclass
class Run:
    id: str
    deployment: str
    params: dict[str, Any]
    key: str
    name: str
    tags: list[str]
    pool: str
    submitted: float
    state: str = "SCHEDULED"
    message: str | None = None
    started: float | None = None
    results: dict[str, StageResult] = field(default_factory=dict)
    tries: dict[str, int] = field(default_factory=dict)


Outcome = tuple[str, dict[str, StageResult]]  # final state, published results
SILENCE_S = 75.0  # the silence automation: a run of a dead worker is Crashed this long after its last beat


class FakePrefect:
    """Prefect as the dispatcher sees it, on a simulated clock: each pool's worker claims its queue's
    runs FIFO and runs them one at a time (its GPU slot), ``seconds[kind]`` each.

    ``script(run) -> Outcome`` decides how a child ends (default: completes). Pools in ``dead``
    have no worker online: Prefect reports them not ready, their unclaimed runs wait in the
    queue, and a run they had started is marked Crashed by the silence automation ``SILENCE_S``
    after the pool died. ``batch`` is the batch flow run's own state (the dispatcher reads it).
    """

    def __init__(self, seconds: dict[str, float] | None = None) -> None:
        self.t = 1000.0
        self.seconds = {"sample": 10.0, "decode": 4.0, **(seconds or {})}
        self.runs: dict[str, Run] = {}
        self.dead: dict[str, float] = {}  # pool -> when it died
        self.script: Any = None
        self.withdrawn: list[tuple[str, str]] = []
        self.cancelled: list[tuple[str, str]] = []
        self.batch = "RUNNING"
        self.serial = 0

    def kill(self, pool: str) -> None:
        self.dead.setdefault(pool, self.t)

    # -- the DispatchApi
    def submit(self, s: Submission) -> str:
        for run in self.runs.values():  # Prefect's idempotency: one run per flow and key
            if run.key == s.key and run.deployment.split("/")[0] == s.deployment.split("/")[0]:
                return run.id
        run_id = f"fr-{self.serial}"
        self.serial += 1
        pool = s.deployment.split("/")[1]
        self.runs[run_id] = Run(run_id, s.deployment, s.parameters, s.key, s.name, s.tags, pool, self.t)
        return run_id

    def states(self, run_ids: list[str]) -> dict[str, RunState]:
        own = {"batch-run": (self.batch, None)}
        return {
            r: own[r] if r in own else (self.runs[r].state, self.runs[r].message)
            for r in run_ids
            if r in own or r in self.runs
        }

    def results(self, run_id: str) -> dict[str, StageResult]:
        return self.runs[run_id].results

    def task_tries(self, run_id: str) -> dict[str, int]:
        return dict(self.runs[run_id].tries)

    def ready_pools(self, work_pools: list[str]) -> set[str]:
        return {wp for wp in work_pools if wp.removeprefix("h3-") not in self.dead}

    def queue_limits(self, work_pools: list[str]) -> dict[str, int | None]:
        return dict.fromkeys(work_pools, AHEAD)

    def withdraw(self, run_id: str, why: str) -> None:
        self.runs[run_id].state, self.runs[run_id].message = "CANCELLED", why
        self.withdrawn.append((run_id, why))

    def cancel(self, run_id: str, why: str) -> None:
        self.runs[run_id].state, self.runs[run_id].message = "CANCELLING", why
        self.cancelled.append((run_id, why))

    def now(self) -> float:
        return self.t

    def pause(self, seconds: float) -> None:
        self.t += seconds
        assert self.t < 1000.0 + 3600, "the run never ended (an hour of simulated time)"
        self.advance()

    # -- the simulated pools
    def advance(self) -> None:
        for pool in {r.pool for r in self.runs.values()}:
            queue = sorted((r for r in self.runs.values() if r.pool == pool), key=lambda r: r.submitted)
            if pool in self.dead:
                for run in queue:
                    if run.state == "RUNNING" and self.t - self.dead[pool] >= SILENCE_S:
                        run.state, run.message = "CRASHED", "no heartbeat for 75 s (h3flow's silence automation)"
                continue
            running = next((r for r in queue if r.state == "RUNNING"), None)
            if running is not None:
                kind = "sample" if running.deployment.startswith("sample") else "decode"
                if self.t - (running.started or 0) >= self.seconds[kind]:
                    running.state, running.results = self.finish(running)
                    running = None
            if running is None:
                waiting = next((r for r in queue if r.state == "SCHEDULED"), None)
                if waiting is not None:
                    waiting.state, waiting.started = "RUNNING", self.t

    def finish(self, run: Run) -> Outcome:
        if self.script is not None:
            got = self.script(run)
            if got is not None:
                return got
        return completed(run)

    def of(self, kind: str, clip: str | None = None) -> list[Run]:
        return [
            r for r in self.runs.values() if r.deployment.startswith(kind) and clip in (None, r.params["clip"]["id"])
        ]


def completed(run: Run) -> Outcome:
    if run.deployment.startswith("sample"):
        cid = run.params["clip"]["id"]
        stages = {
            s: StageResult(stage=s, pool=run.pool, sha256=SHA, path=f"/s/{cid}.{s}", size=1, tries=1)
            for s in ("encode", "sample", "transfer")
        }
        return "COMPLETED", stages
    cid = run.params["clip"]["id"]
    return "COMPLETED", {
        "decode": StageResult(stage="decode", pool=run.pool, sha256=SHA, path=f"/out/{cid}.mp4", tries=1)
    }


def failed(stage: str, kind: FailureKind, why: str) -> Outcome:
    return "FAILED", {stage: StageResult(stage=stage, failure=kind, error=why)}


def batch(n: int) -> Manifest:
    clips = [Clip(id=f"c{i}", prompt="pan left", image=IMAGE, spec="sd", seed=i) for i in range(n)]
    return new_manifest("run-1", "b", clips, "local.json")


class Saved:
    """The ``save`` callback: a copy of the manifest at every save."""

    def __init__(self) -> None:
        self.snapshots: list[Manifest] = []

    def __call__(self, manifest: Manifest, changed: set[str]) -> None:
        if self.snapshots:  # every clip whose record differs from the last save is among ``changed``
            last = self.snapshots[-1].clips
            moved = {cid for cid, rec in manifest.clips.items() if rec != last[cid]}
            assert moved <= changed, f"changed but not marked: {moved - changed}"
        self.snapshots.append(manifest.model_copy(deep=True))

    def states(self, clip: str) -> list[str]:
        seen: list[str] = []
        for snap in self.snapshots:
            state = snap.clips[clip].state
            if not seen or seen[-1] != state:
                seen.append(state)
        return seen


def dispatch(config: LocalConfig, api: FakePrefect, manifest: Manifest, saved: Saved | None = None) -> Manifest:
    saved = saved or Saved()
    return Dispatcher(config, "/cfg/local.json", manifest, api, saved).run()


# --------------------------------------------------------------------------- routing
def test_clips_go_to_both_pools_a_queue_ahead_each_and_every_change_is_saved(config: LocalConfig) -> None:
    api, saved = FakePrefect(), Saved()
    in_flight_seen: list[int] = []
    original_submit = api.submit

    def watching_submit(s: Submission) -> str:
        run_id = original_submit(s)
        for pool in ("a0", "a1"):
            in_flight_seen.append(
                sum(1 for r in api.of("sample") if r.pool == pool and r.state in ("SCHEDULED", "RUNNING"))
            )
        return run_id

    api.submit = watching_submit  # type: ignore[method-assign]
    result = dispatch(config, api, batch(6), saved)
    assert result.state == "completed" and len(result.delivered) == 6
    pools = [r.pool for r in api.of("sample")]
    assert pools.count("a0") == 3 and pools.count("a1") == 3  # equal pools share the batch
    assert max(in_flight_seen) == AHEAD  # each pool's queue limit in Prefect
    assert all(run_tag("run-1") in r.tags and pool_tag(r.pool) in r.tags for r in api.runs.values())
    assert {r.name for r in api.of("sample", "c0")} == {f"run-1/c0 sample on {api.of('sample', 'c0')[0].pool}"}
    assert {r.deployment for r in api.runs.values()} == {"sample-clip/a0", "sample-clip/a1", "decode-clip/b"}
    lifecycle = ["pending", "sampling", "sampled", "decoding", "delivered"]
    for clip in result.clips:
        seen = saved.states(clip)  # "sampled" may last less than one loop: the decode is queued at once
        assert seen in (lifecycle, [s for s in lifecycle if s != "sampled"]), (clip, seen)
    assert result.clips["c0"].output == "/out/c0.mp4" and result.clips["c0"].latent_sha256 == SHA
    # each pool samples its 3 clips back to back (30 s); two latents arrive together every 10 s
    # and the one decoder takes 4 s each: the last decode ends at 38 s, plus a few poll intervals
    assert result.finished - result.started == pytest.approx(38.0, abs=6 * POLL)


def test_the_decode_is_queued_to_the_decoder_the_clip_was_routed_with(config: LocalConfig) -> None:
    api = FakePrefect()
    result = dispatch(config, api, batch(2))
    for run in api.of("decode"):
        clip = result.clips[run.params["clip"]["id"]]
        assert run.pool == clip.decoder == "b" and run.params["latent_sha256"] == SHA
        assert run.params["budget"]["decode"] == MAX_SUBMISSIONS


# --------------------------------------------------------------------------- pools that stop being ready
def kill_a0_at_15s(api: FakePrefect) -> None:
    """Pool a0's worker goes offline 15 s into the run (Prefect reports the pool not ready)."""
    original = api.advance

    def advance() -> None:
        if api.t >= 1015.0:
            api.kill("a0")
        original()

    api.advance = advance  # type: ignore[method-assign]


def test_a_pool_that_is_not_ready_gets_nothing_new_and_its_clips_go_elsewhere(config: LocalConfig) -> None:
    """What a0 had not started is withdrawn and routed again at once; what it was running is left
    to Prefect, whose silence automation marks it Crashed: then it is sent again too."""
    api = FakePrefect()
    kill_a0_at_15s(api)
    logged: list[str] = []
    result = Dispatcher(config, "/cfg", batch(6), api, Saved(), log=logged.append).run()
    assert result.state == "completed" and len(result.delivered) == 6
    late_a0 = [r for r in api.of("sample") if r.pool == "a0" and r.submitted > 1015.0 + POLL]
    assert not late_a0, "nothing is sent to a pool once Prefect says it is not ready"
    assert api.withdrawn and all(api.runs[r].pool == "a0" and api.runs[r].started is None for r, _ in api.withdrawn)
    crashed = [r for r in api.of("sample") if r.state == "CRASHED"]
    assert len(crashed) == 1 and crashed[0].pool == "a0", "the clip a0 was sampling is crashed by Prefect, not by us"
    moved = {r.params["clip"]["id"] for r in crashed} | {api.runs[r].params["clip"]["id"] for r, _ in api.withdrawn}
    for clip in moved:
        assert result.clips[clip].pool == "a1" and result.clips[clip].state == "delivered"
    withdrawn_clip = api.runs[api.withdrawn[0][0]].params["clip"]["id"]
    assert result.clips[withdrawn_clip].submissions.get("sample", 0) == 1, "a withdrawn run never ran: not a try"
    assert any("not ready in Prefect" in line for line in logged)


def test_no_decoder_ready_fails_the_run_after_the_grace_period(
    config: LocalConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("H3FLOW_DECODER_GONE_S", "12")
    api = FakePrefect()
    api.kill("b")
    result = dispatch(config, api, batch(3))
    assert result.state == "failed" and "no decoder is ready" in (result.error or "")
    assert not api.of("sample"), "nothing is sampled while no decoder could take it"
    assert result.finished - result.started == pytest.approx(12.0, abs=3 * POLL)


def test_no_sampler_left_with_clips_waiting_fails_the_run(config: LocalConfig, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("H3FLOW_DECODER_GONE_S", "8")
    api = FakePrefect()
    original = api.advance

    def kill_samplers_at_5s() -> None:
        if api.t >= 1005.0:
            api.kill("a0")
            api.kill("a1")
        original()

    api.advance = kill_samplers_at_5s  # type: ignore[method-assign]
    result = dispatch(config, api, batch(6))
    assert result.state == "failed" and "no sampler pool is ready" in (result.error or "")
    assert not [r for r in api.of("sample") if r.state == "SCHEDULED"], "what never started is withdrawn"


def test_a_claim_left_pending_for_good_is_withdrawn_and_routed_again(
    config: LocalConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker's claim whose answer it never heard, with the claim's event lost with the server:
    the run stays Pending and Prefect's automation never marks it. Past the silence window and a
    heartbeat the dispatcher withdraws it and routes the clip again; it never ran, so not a try."""
    monkeypatch.setenv("H3FLOW_SILENCE_S", "40")
    api = FakePrefect()
    original = api.advance
    lost: list[str] = []

    def advance() -> None:
        original()
        for run in api.of("sample", "c0"):  # the first claim of c0: Pending, and nobody will start it
            if run.state == "RUNNING" and not lost:
                run.state, run.started = "PENDING", None
                lost.append(run.id)

    api.advance = advance  # type: ignore[method-assign]
    logged: list[str] = []
    result = Dispatcher(config, "/cfg", batch(4), api, Saved(), log=logged.append).run()
    assert result.state == "completed" and len(result.delivered) == 4
    assert [run_id for run_id, _ in api.withdrawn] == lost
    assert "not started for 70 s" in api.withdrawn[0][1], api.withdrawn
    again = [r for r in api.of("sample", "c0") if r.id not in lost]
    assert len(again) == 1 and again[0].state == "COMPLETED"
    assert again[0].submitted - api.runs[lost[0]].submitted == pytest.approx(70.0, abs=4 * POLL)
    assert result.clips["c0"].attempts == 1, "the withdrawn claim never ran: not a try"
    assert any("c0: withdrawn" in line for line in logged)


# --------------------------------------------------------------------------- failures and retries
def test_a_latent_damaged_on_the_decoder_is_sent_again_not_decoded(config: LocalConfig) -> None:
    api = FakePrefect()
    damaged = {"c1"}

    def script(run: Run) -> Outcome | None:
        if run.deployment.startswith("decode") and run.params["clip"]["id"] in damaged:
            damaged.discard(run.params["clip"]["id"])
            return failed("decode", FailureKind.INTEGRITY, "latent abc on host-b is missing or damaged")
        return None

    api.script = script
    result = dispatch(config, api, batch(3))
    assert result.state == "completed" and len(result.delivered) == 3
    samples = api.of("sample", "c1")
    assert [r.params["retransfer"] for r in samples] == [False, True]
    assert len(api.of("decode", "c1")) == 2 and len(api.of("decode", "c0")) == 1


def test_a_transient_failure_is_not_retried_by_the_dispatcher(config: LocalConfig) -> None:
    """The task layer already spent its tries; the clip fails with the kind and reason, the rest go on."""
    api = FakePrefect()

    def script(run: Run) -> Outcome | None:
        if run.deployment.startswith("sample") and run.params["clip"]["id"] == "c0":
            run.tries = {"encode": 1, "sample": 4}
            return failed("sample", FailureKind.TRANSIENT, "ComfyUI at http://a:8188: connection refused")
        return None

    api.script = script
    result = dispatch(config, api, batch(3))
    assert result.state == "failed" and len(result.delivered) == 2
    c0 = result.clips["c0"]
    assert len(api.of("sample", "c0")) == 1
    assert c0.state == "failed" and c0.failure is FailureKind.TRANSIENT
    assert c0.error and "transient" in c0.error and "connection refused" in c0.error


def test_bad_input_fails_the_clip_at_once(config: LocalConfig) -> None:
    api = FakePrefect()

    def script(run: Run) -> Outcome | None:
        if run.deployment.startswith("sample") and run.params["clip"]["id"] == "c1":
            return failed("encode", FailureKind.INPUT, "image /x.png does not exist")
        return None

    api.script = script
    result = dispatch(config, api, batch(2))
    assert result.clips["c1"].failure is FailureKind.INPUT and len(api.of("sample", "c1")) == 1


def test_crashes_are_retried_until_the_submission_budget_is_spent(config: LocalConfig) -> None:
    """A child that keeps dying mid-sample is sent again with what is left of the budget, then fails."""
    api = FakePrefect()

    def script(run: Run) -> Outcome | None:
        if run.deployment.startswith("sample") and run.params["clip"]["id"] == "c0":
            run.tries = {"encode": 1, "sample": 1}  # Prefect's task runs: it died during its first sample try
            return "CRASHED", {}
        return None

    api.script = script
    result = dispatch(config, api, batch(2))
    sent = api.of("sample", "c0")
    assert len(sent) == MAX_SUBMISSIONS
    assert [r.params["budget"]["sample"] for r in sent] == [4, 3, 2, 1]
    assert len({r.key for r in sent}) == MAX_SUBMISSIONS  # a fresh idempotency key per attempt
    c0 = result.clips["c0"]
    assert c0.state == "failed" and c0.failure is FailureKind.BUDGET and c0.submissions["sample"] == 4
    assert result.clips["c1"].state == "delivered"


def test_a_crash_after_some_stages_published_still_counts_every_try(config: LocalConfig) -> None:
    """A child that crashed after publishing its encode result: its sample tries are read from
    Prefect's task runs too, so the cap holds (before: only a child that published nothing was
    looked up, and three crashes gave 10 real sample tries with a full budget on every resend)."""
    api = FakePrefect()

    def script(run: Run) -> Outcome | None:
        if run.deployment.startswith("sample") and run.params["clip"]["id"] == "c0":
            run.tries = {"encode": 1, "sample": min(3, run.params["budget"]["sample"])}  # then the process died
            return "CRASHED", {"encode": StageResult(stage="encode", sha256=SHA, path="/s/e", size=1, tries=1)}
        return None

    api.script = script
    result = dispatch(config, api, batch(1))
    sent = api.of("sample", "c0")
    assert [r.params["budget"]["sample"] for r in sent] == [4, 1], "3 sample tries counted after the first crash"
    assert sum(r.tries["sample"] for r in sent) == MAX_SUBMISSIONS, "the cap on real submissions holds"
    c0 = result.clips["c0"]
    assert c0.failure is FailureKind.BUDGET and c0.submissions["sample"] == MAX_SUBMISSIONS


def test_a_child_deleted_in_prefect_is_sent_again_not_waited_on(config: LocalConfig) -> None:
    """A child run that no longer exists (deleted in the UI) is sent again like a crashed one."""
    api = FakePrefect()
    deleted: list[str] = []
    original = api.advance

    def delete_c0_mid_sample() -> None:
        original()
        running = [r for r in api.of("sample", "c0") if r.state == "RUNNING"]
        if running and not deleted:
            deleted.append(running[0].id)
            del api.runs[running[0].id]

    api.advance = delete_c0_mid_sample  # type: ignore[method-assign]
    logged: list[str] = []
    result = Dispatcher(config, "/cfg", batch(2), api, Saved(), log=logged.append).run()
    assert deleted and result.state == "completed" and len(result.delivered) == 2
    assert len(api.of("sample", "c0")) == 1 and result.clips["c0"].attempts == 2
    assert any("no longer exists" in line for line in logged)


def test_a_resumed_run_gets_fresh_child_keys(config: LocalConfig) -> None:
    api = FakePrefect()
    first = Dispatcher(config, "/cfg", batch(1), api, Saved(), incarnation="aaaa").run()
    keys_before = {r.key for r in api.runs.values()}
    again = first.model_copy(deep=True)
    again.clips["c0"].state, again.clips["c0"].attempts = "pending", 0
    Dispatcher(config, "/cfg", again, api, Saved(), incarnation="bbbb").run()
    assert len(api.of("sample", "c0")) == 2 and not keys_before & {r.key for r in api.of("sample")[1:]}


# --------------------------------------------------------------------------- one live dispatcher, cancel, the story
def test_a_dispatcher_whose_run_is_over_in_prefect_stops_at_once(config: LocalConfig) -> None:
    """Its batch run crashed (the silence automation, after a stall) or was taken over: it submits
    nothing more, whatever it had planned."""
    api = FakePrefect()
    original = api.advance

    def crash_at_12s() -> None:
        if api.t >= 1012.0:
            api.batch = "CRASHED"
        original()

    api.advance = crash_at_12s  # type: ignore[method-assign]
    saved = Saved()
    with pytest.raises(Superseded):
        Dispatcher(config, "/cfg", batch(6), api, saved, own_flow_run_id="batch-run").run()
    assert not [r for r in api.runs.values() if r.submitted > 1012.0 + POLL], "nothing submitted once superseded"
    assert saved.snapshots[-1].state == "running", "it leaves the run's state to the dispatcher that took over"


def test_cancelling_the_batch_run_stops_the_dispatcher_and_cancels_its_live_children(config: LocalConfig) -> None:
    """Prefect's cascade would cancel them too once the batch run is Cancelled, but its write is
    not retried before its next loop and fails under load on SQLite: the dispatcher asks at once."""
    api = FakePrefect()
    original = api.advance

    def cancel_at_12s() -> None:
        if api.t >= 1012.0:
            api.batch = "CANCELLING"
        original()

    api.advance = cancel_at_12s  # type: ignore[method-assign]
    saved = Saved()
    result = Dispatcher(config, "/cfg", batch(6), api, saved, own_flow_run_id="batch-run").run()
    assert result.state == "cancelled" and result.finished - 1012.0 <= 2 * POLL
    live = {r.id for r in api.runs.values() if r.state in ("CANCELLING", "CANCELLED")}
    assert live and {run_id for run_id, _ in api.cancelled + api.withdrawn} == live
    assert all(r.state in ("COMPLETED", "CANCELLING", "CANCELLED") for r in api.runs.values())
    assert not [r for r in api.runs.values() if r.submitted > 1012.0 + POLL]
    states = {rec.state for rec in result.clips.values()}
    assert states <= {"delivered", "cancelled"} and "cancelled" in states


def test_the_batch_run_tells_each_clips_story(config: LocalConfig) -> None:
    api = FakePrefect()
    logged: list[str] = []
    Dispatcher(config, "/cfg", batch(2), api, Saved(), log=logged.append).run()
    for clip in ("c0", "c1"):
        story = [line for line in logged if line.startswith(f"{clip}:")]
        assert [line.split(":")[1].split()[0] for line in story] == ["routed", "sampled", "delivered"], story


def test_a_briefly_unavailable_api_is_waited_out(config: LocalConfig) -> None:
    import httpx

    api = FakePrefect()
    original = api.states

    def flaky(run_ids: list[str]) -> dict[str, RunState]:
        if 1005.0 <= api.t < 1035.0:
            raise httpx.ConnectError("connection refused")  # the server restarting
        return original(run_ids)

    api.states = flaky  # type: ignore[method-assign]
    logged: list[str] = []
    result = Dispatcher(config, "/cfg", batch(4), api, Saved(), log=logged.append).run()
    assert result.state == "completed" and len(result.delivered) == 4
    assert any("API unavailable" in line for line in logged)
    assert any("API back: it had not answered for 30 s" in line for line in logged), logged


def test_an_outage_is_counted_from_the_last_answer_even_when_calls_are_slow_to_fail(config: LocalConfig) -> None:
    """During an outage each call first hangs for 25 s (the client's timeouts and retries) and then
    fails: the outage is still told from the API's last answer (before: from the first failure's
    end, so a 153 s outage was logged as 83 s)."""
    import httpx

    api = FakePrefect()
    original = api.states

    def hanging(run_ids: list[str]) -> dict[str, RunState]:
        if 1005.0 <= api.t < 1105.0:
            api.t += 25.0  # the call takes that long to fail
            raise httpx.ReadTimeout("timed out")
        return original(run_ids)

    api.states = hanging  # type: ignore[method-assign]
    logged: list[str] = []
    result = Dispatcher(config, "/cfg", batch(4), api, Saved(), log=logged.append).run()
    assert result.state == "completed" and len(result.delivered) == 4
    (back,) = [line for line in logged if "API back" in line]
    seconds = int(back.split("for ")[1].split(" s")[0])
    assert 100 <= seconds <= 102, back


def test_an_api_gone_for_good_or_a_defect_fails_the_run_it_does_not_cancel_it(config: LocalConfig) -> None:
    import httpx

    api = FakePrefect()

    def down(run_ids: list[str]) -> dict[str, RunState]:
        raise httpx.ConnectError("connection refused")

    api.states = down  # type: ignore[method-assign]
    saved = Saved()
    with pytest.raises(httpx.ConnectError):
        Dispatcher(config, "/cfg", batch(2), api, saved).run()
    assert saved.snapshots[-1].state == "failed" and "ConnectError" in (saved.snapshots[-1].error or "")
    assert not api.withdrawn, "children are left to finish: resume picks up their results"


API_CALLS = ("submit", "states", "results", "task_tries", "ready_pools", "queue_limits", "withdraw")


class OneCallFails(FakePrefect):
    """The ``at``-th Prefect call fails as a restarting server makes it fail: refused before the
    server acted, or (``answer_lost``) after it acted but before its answer arrived."""

    def __init__(self, at: int, answer_lost: bool) -> None:
        super().__init__()
        self.at, self.answer_lost, self.calls = at, answer_lost, 0

    def __getattribute__(self, name: str) -> Any:
        method = super().__getattribute__(name)
        if name not in API_CALLS:
            return method

        def call(*args: Any) -> Any:
            import httpx

            self.calls += 1
            if self.calls != self.at:
                return method(*args)
            if self.answer_lost:
                method(*args)
            raise httpx.RemoteProtocolError("Server disconnected without sending a response.")

        return call


@pytest.mark.parametrize("answer_lost", [False, True], ids=["refused", "answer-lost"])
@pytest.mark.parametrize("a0_dies", [False, True], ids=["plain", "a0-dies"])
def test_a_prefect_call_failing_at_any_point_of_a_run_loses_and_repeats_nothing(
    config: LocalConfig, answer_lost: bool, a0_dies: bool
) -> None:
    """Every call of a whole run fails in turn (the server restarted at that moment): each run
    still delivers every clip, with one completed sample and decode run per clip, and nothing
    left queued on a ready pool."""
    clean = OneCallFails(at=0, answer_lost=False)
    if a0_dies:
        kill_a0_at_15s(clean)
    dispatch(config, clean, batch(4))
    assert clean.calls > 50
    for at in range(1, clean.calls + 1):
        api = OneCallFails(at, answer_lost)
        if a0_dies:
            kill_a0_at_15s(api)
        result = dispatch(config, api, batch(4))
        assert result.state == "completed" and len(result.delivered) == 4, (at, result.clips)
        for clip in result.clips:
            for kind in ("sample", "decode"):
                done = [r for r in api.of(kind, clip) if r.state == "COMPLETED"]
                assert len(done) == 1 and (a0_dies or len(api.of(kind, clip)) == 1), (at, clip, kind)
        left = [r.name for r in api.runs.values() if r.state in ("SCHEDULED", "RUNNING") and r.pool not in api.dead]
        assert not left, (at, left)


def test_the_searched_plan_is_taken_once_its_thread_has_it(config: LocalConfig) -> None:
    """The first clips go by the heuristics' plan; the searched one, made in a thread, is followed
    (and recorded in the manifest) from the pass after it is ready: no clip waits for the search."""
    from concurrent.futures import Future

    from h3flow.pipeline.plan import clips_of, plan_clips

    manifest = batch(4)
    better: Future = Future()
    api = FakePrefect()
    original = api.advance

    def search_done_at_5s() -> None:
        if api.t >= 1005.0 and not better.done():
            better.set_result(plan_clips(clips_of(manifest), config, 0.0))
        original()

    api.advance = search_done_at_5s  # type: ignore[method-assign]
    logged: list[str] = []
    dispatcher = Dispatcher(config, "/cfg", manifest, api, Saved(), log=logged.append, better_plan=better)
    result = dispatcher.run()
    assert [r.submitted for r in api.of("sample")][:2] == [1000.0, 1000.0], "the first clips did not wait"
    assert dispatcher.plan is better.result() and dispatcher.better_plan is None
    assert result.planned_makespan == round(better.result().schedule.makespan, 3)
    assert all(rec.planned for rec in result.clips.values()) and any(line.startswith("plan:") for line in logged)


@pytest.mark.parametrize("published", [{}, {"encode": StageResult(stage="encode", sha256=SHA, path="/s/e", size=1)}])
def test_a_child_that_failed_without_publishing_its_failed_stage_is_sent_again(
    config: LocalConfig, published: dict[str, StageResult]
) -> None:
    """A failing stage publishes its row with its kind: a failed run without one (none at all, or only
    its finished stages') could not reach the API at its end (an outage), and is sent again."""
    api = FakePrefect()
    lost = {"c0"}

    def script(run: Run) -> Outcome | None:
        if run.deployment.startswith("sample") and run.params["clip"]["id"] in lost:
            lost.clear()
            return "FAILED", published
        return None

    api.script = script
    result = dispatch(config, api, batch(2))
    assert result.state == "completed" and len(api.of("sample", "c0")) == 2


def test_a_stage_that_lost_the_prefect_api_is_a_crash_the_dispatcher_sends_again() -> None:
    """The server restarted under a running task: its engine raises httpx's "All connection attempts
    failed" (before: kind `bug`, and the clip failed for good)."""
    import httpx

    from h3flow.pipeline.results import classify

    assert classify(httpx.ConnectError("All connection attempts failed")) is FailureKind.CRASHED
    assert FailureKind.CRASHED.dispatcher_retries
