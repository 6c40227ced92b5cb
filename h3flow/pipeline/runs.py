"""Run control: deploy, start a run, follow it, resume it, list runs — what the CLI, demo and benchmarks call.

No shared disk is assumed. ``start_run`` validates the batch, hashes and stages its
images where the encoders will read them, and submits the ``batch/run`` deployment with
the clips inline; the dispatcher creates the run's manifest on its own host and is its
only writer. ``watch_run`` follows a run through Prefect alone (the batch flow run and
its children). Reading a manifest and checking what each host's store holds are
passed in (:data:`ManifestReader`, :data:`Inventory`): here, on this machine's disk
(the embedded default); the CLI passes the host agents' versions for a cluster.
``list_runs`` is every run under runs_dir; ``run_flow_runs`` / ``run_logs`` / ``cancel_run``
ask Prefect about one run's flow runs (:mod:`h3flow.pipeline.prefect_api`).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from h3flow.config.models import LocalConfig, load_local_config
from h3flow.core.batch import Batch, load_batch, with_image_hashes
from h3flow.core.contracts import DISPATCHER_TAG, H3FLOW_TAG, run_tag
from h3flow.core.errors import H3FlowError
from h3flow.handoff.inventory import HostFiles, check_host_files
from h3flow.pipeline.lifecycle import ClipState
from h3flow.pipeline.manifest import Manifest, load_manifest, new_run_id
from h3flow.pipeline.params import ResumePlan, StagedBatch
from h3flow.pipeline.prefect_api import PrefectApi, RunProgress, prefect_api
from h3flow.pipeline.run_report import summary

if TYPE_CHECKING:
    from h3flow.pipeline.prefect_api import LogLine, RunFlowRun

ManifestReader = Callable[[str], Manifest]
"""run id -> that run's manifest, wherever the dispatcher keeps it."""

Inventory = Callable[[str, list[str], list[tuple[str, str]]], HostFiles]
"""(host, latent SHA-256s, (output path, SHA-256)s) -> what that host really holds; damage moved aside."""

RunLister = Callable[[int | None], list["RunSummary"]]
"""limit -> the newest runs, wherever the dispatcher keeps them."""

Stager = Callable[[LocalConfig, Batch], Batch]
"""Puts a batch's images where the encoder hosts read them; returns the batch as they will see it."""


def deploy_everything(config_path: Path, config: LocalConfig | None = None) -> list[str]:
    """Work pools, deployments and blocks on the config's server (``deploy``, and ``start``
    when it starts something): an API that does not answer is an error, never a reason to
    start a temporary server."""
    from h3flow.pipeline.blocks import remove_secret_block, save_host_blocks
    from h3flow.pipeline.deployments import deploy_all
    from h3flow.pipeline.prefect_api import prefect_api, require_api

    config = config or load_local_config(config_path)
    require_api(config)
    names = deploy_all(config, config_path)
    with prefect_api(config):
        save_host_blocks(config)
        remove_secret_block(config)
    return names


# --------------------------------------------------------------------------- starting
def images_in_place(config: LocalConfig, batch: Batch) -> Batch:
    """The embedded default: the encoders run on this machine and read the images where they are."""
    return batch


def submit_dispatcher(config: LocalConfig, config_path: Path, run_id: str, parameters: dict[str, Any]) -> str:
    """Start the dispatcher as a run of ``batch/run``, named after the run and tagged with it."""
    import httpx
    from prefect.deployments import run_deployment

    try:
        with prefect_api(config):
            run = run_deployment(
                "batch/run",
                parameters={"run_id": run_id, "config_path": str(config_path.resolve()), **parameters},
                timeout=0,
                as_subflow=False,
                flow_run_name=run_id,
                tags=[run_tag(run_id), H3FLOW_TAG, DISPATCHER_TAG],
            )
    except (httpx.ConnectError, httpx.TimeoutException) as exc:
        raise H3FlowError(
            f"cannot reach Prefect at {config.prefect.api_url} ({type(exc).__name__}): is `h3flow start` done?"
        ) from None
    except Exception as exc:  # noqa: BLE001 - any other refusal: nothing started; say what Prefect said, briefly
        said = " ".join(str(exc).split())
        raise H3FlowError(
            f"Prefect at {config.prefect.api_url} refused the run: {said[:300]}{'...' if len(said) > 300 else ''}"
        ) from None
    return str(getattr(run, "id", ""))


BatchStager = Callable[[LocalConfig, bytes, str], None]
"""Puts a validated batch (its JSON bytes, their SHA-256) where the dispatcher reads it."""


def batch_in_place(config: LocalConfig, data: bytes, sha256: str) -> None:
    """The embedded default: the dispatcher's host is this machine."""
    from h3flow.core.files import file_intact
    from h3flow.core.fsutil import atomic_path

    target = StagedBatch.path(config, sha256)
    if not file_intact(target, sha256):
        with atomic_path(target) as tmp:
            Path(tmp).write_bytes(data)


def start_run(
    batch_file: Path, config_path: Path, stage: Stager = images_in_place, stage_batch: BatchStager = batch_in_place
) -> str:
    """Validate, stage and submit a batch; returns the run id (nothing runs if the batch is bad).

    The batch travels by reference: its validated JSON (image paths as the encoders will
    read them, each image's SHA-256) is staged by content on the dispatcher's host, and the
    run gets its SHA-256 — whatever its size, the submission is a few hundred bytes.
    """
    import hashlib

    config = load_local_config(config_path)
    batch = stage(config, with_image_hashes(load_batch(batch_file)))
    run_id = new_run_id(batch.name)
    data = batch.model_dump_json().encode()
    sha = hashlib.sha256(data).hexdigest()
    stage_batch(config, data, sha)
    staged = StagedBatch(sha256=sha, clips=len(batch.clips), name=batch.name)
    submit_dispatcher(config, config_path, run_id, {"staged": staged.model_dump()})
    return run_id


# --------------------------------------------------------------------------- reading
def local_manifests(config: LocalConfig) -> ManifestReader:
    """Manifests from this machine's runs_dir (where the dispatcher of the embedded default writes)."""
    return lambda run_id: load_manifest(config.runs_dir, run_id)


def load_run(run_id: str, config_path: Path, read: ManifestReader | None = None) -> Manifest:
    config = load_local_config(config_path)
    return (read or local_manifests(config))(run_id)


def manifest_json(manifest: Manifest) -> dict[str, Any]:
    """``status --json``: the summary plus every clip's record."""
    return {**summary(manifest), "clips": {k: v.model_dump(mode="json") for k, v in manifest.clips.items()}}


def watch_run(
    run_id: str,
    config_path: Path,
    on_update: Callable[[RunProgress], None] | None = None,
    timeout: float | None = None,
    every: float = 1.0,
) -> RunProgress:
    """Follow a run through the Prefect API until its dispatcher is done; a server that is down is
    reported (``UNREACHABLE``) and waited for, never mistaken for the end of the run."""
    config = load_local_config(config_path)
    deadline = None if timeout is None else time.monotonic() + timeout
    api: PrefectApi | None = None
    with prefect_api(config):
        while True:
            try:
                api = api or PrefectApi()
                progress = api.run_progress(run_id)
            except H3FlowError:
                raise
            except Exception as exc:  # noqa: BLE001 - the server is down or restarting: say so, keep waiting
                if api is not None:
                    api.close()
                    api = None
                progress = RunProgress("UNREACHABLE", 0, 0, None, f"Prefect at {config.prefect.api_url}: {exc}")
            if on_update is not None:
                on_update(progress)
            if progress.finished:
                if api is not None:
                    api.close()
                return progress
            if deadline and time.monotonic() > deadline:
                raise H3FlowError(f"run {run_id} still running after {timeout:g} s")
            time.sleep(every)  # the poll interval of a reader, not synchronisation


@dataclass(frozen=True)
class RunSummary:
    """One line of ``h3flow runs``."""

    run_id: str
    batch: str
    state: str  # the manifest's, or "unreadable"
    clips: int
    counts: dict[str, int]  # clips per state
    created: str | None  # ISO 8601
    updated: str | None
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "batch": self.batch,
            "state": self.state,
            "clips": self.clips,
            "counts": self.counts,
            "created": self.created,
            "updated": self.updated,
            "error": self.error,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RunSummary:
        return cls(**data)


def list_runs(config: LocalConfig, limit: int | None = 20) -> list[RunSummary]:
    """The runs under this machine's runs_dir (the embedded default's; a cluster's are on the
    dispatcher's host: :func:`h3flow.ops.remote.run_lister`)."""
    return list_runs_in(Path(config.runs_dir), limit)


def list_runs_in(root: Path, limit: int | None = 20) -> list[RunSummary]:
    """The runs under ``root``, most recently changed first (at most ``limit``; None: all).

    Only the manifests listed are read; one that cannot be read is listed as "unreadable".
    """
    found = [(path.stat().st_mtime, path.parent.name) for path in root.glob("*/manifest.json")] if root.is_dir() else []
    out: list[RunSummary] = []
    for _, run_id in sorted(found, reverse=True)[:limit]:
        try:
            manifest = load_manifest(root, run_id)
        except H3FlowError as exc:
            out.append(RunSummary(run_id, "?", "unreadable", 0, {}, None, None, str(exc)))
            continue
        counts = Counter(rec.state for rec in manifest.clips.values())
        out.append(
            RunSummary(
                run_id=run_id,
                batch=manifest.batch_name,
                state=manifest.state,
                clips=len(manifest.clips),
                counts=dict(sorted(counts.items())),
                created=manifest.created,
                updated=manifest.updated,
                error=manifest.error,
            )
        )
    return out


def run_flow_runs(config: LocalConfig, manifest: Manifest) -> list[RunFlowRun]:
    """The run's flow runs in Prefect: its batch runs, then its clips' children."""
    from h3flow.pipeline.prefect_api import run_flow_runs as read

    return read(config, manifest.run_id, manifest.flow_run_ids)


def run_logs(config: LocalConfig, manifest: Manifest, clip: str | None = None) -> list[LogLine]:
    """The Prefect logs of the run's batch flow runs, or (``clip``) of that clip's children."""
    from h3flow.pipeline.prefect_api import flow_run_logs

    if clip is not None and clip not in manifest.clips:
        raise H3FlowError(f"run {manifest.run_id} has no clip {clip!r} (clips: {', '.join(manifest.clips)})")
    runs = [r for r in run_flow_runs(config, manifest) if r.clip == clip]
    return flow_run_logs(config, runs)


def cancel_run(config: LocalConfig, manifest: Manifest) -> list[RunFlowRun]:
    """Cancel the run's batch flow runs and its children that have not ended (see
    :func:`h3flow.pipeline.prefect_api.cancel_run_flow_runs`)."""
    from h3flow.pipeline.prefect_api import cancel_run_flow_runs

    return cancel_run_flow_runs(config, manifest.run_id, manifest.flow_run_ids)


# --------------------------------------------------------------------------- resuming
@dataclass(frozen=True)
class Resumption:
    """What ``resume`` found, per clip: the state to continue from, and whether to re-send its latent."""

    states: dict[str, ClipState]
    resend: set[str]
    repaired: list[str]  # one line per damaged file moved aside

    def count(self, state: str) -> int:
        return sum(1 for s in self.states.values() if s == state)


def local_inventory(config: LocalConfig) -> Inventory:
    """Check files on this machine (every host of the embedded default is this machine)."""

    def check(host: str, latents: list[str], outputs: list[tuple[str, str]]) -> HostFiles:
        return check_host_files(Path(config.hosts[host].storage.root), latents, outputs, repair=True)

    return check


def reconcile(manifest: Manifest, config: LocalConfig, inventory: Inventory) -> Resumption:
    """Trust the files, not the record: ask each decoder host what it holds, verified by SHA-256.

    A delivered clip stays delivered only if its MP4 still hashes right; a clip whose
    latent is intact on its decoder needs only decoding; every other clip samples again
    (Prefect's cache makes its finished stages free) and re-sends its latent. Damaged
    files are moved aside by the host, never decoded or served, and made again.
    """
    by_host: dict[str, tuple[list[str], list[tuple[str, str]]]] = {}
    for rec in manifest.clips.values():
        if rec.decoder is None:
            continue
        latents, outputs = by_host.setdefault(config.pool(rec.decoder).host, ([], []))
        if rec.latent_sha256:
            latents.append(rec.latent_sha256)
        if rec.output and rec.output_sha256:
            outputs.append((rec.output, rec.output_sha256))
    found = {host: inventory(host, latents, outputs) for host, (latents, outputs) in by_host.items()}
    states: dict[str, ClipState] = {}
    resend: set[str] = set()
    repaired = [line for files in found.values() for line in files.repaired]
    for cid, rec in manifest.clips.items():
        files = found.get(config.pool(rec.decoder).host) if rec.decoder else None
        if files and rec.output and files.outputs.get(rec.output) == "ok" and rec.state == "delivered":
            states[cid] = "delivered"
        elif files and rec.latent_sha256 and files.latents.get(rec.latent_sha256) == "ok":
            states[cid] = "sampled"
        else:
            states[cid] = "pending"
            if rec.latent_sha256:
                resend.add(cid)
    return Resumption(states, resend, repaired)


def resume_run(
    run_id: str, config_path: Path, read: ManifestReader | None = None, inventory: Inventory | None = None
) -> Resumption:
    """Verify what exists and start the run's dispatcher again for the rest.

    Refused while the run's dispatcher is not over in Prefect: Prefect decides that (its
    worker's report, or the silence automation once its heartbeats stop), so a dispatcher
    that is only slow is never taken for a dead one, and one run never has two.
    """
    config = load_local_config(config_path)
    manifest = (read or local_manifests(config))(run_id)
    with prefect_api(config):
        api = PrefectApi()
        try:
            alive = api.live_dispatcher(run_id)
        finally:
            api.close()
    if alive is not None:
        state = alive.state_name or (alive.state_type.value.title() if alive.state_type else "Pending")
        raise H3FlowError(
            f"run {run_id} is still running (its dispatcher, flow run {alive.id}, is {state} in Prefect, which marks "
            f"it Crashed if it falls silent): wait for it, or `h3flow cancel {run_id}` first"
        )
    found = reconcile(manifest, config, inventory or local_inventory(config))
    if found.count("delivered") < len(found.states):
        plan = ResumePlan(states=found.states, resend=sorted(found.resend))
        submit_dispatcher(config, config_path, run_id, {"resume": plan.model_dump(mode="json")})
    return found
