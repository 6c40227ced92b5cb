"""Operator commands done on another host: the controller's side of the agent protocol.

Each function opens one verified SSH connection (:mod:`h3flow.ops.ssh`) and asks the
h3flow agent in the host's venv (:mod:`h3flow.ops.agent`) to do the work there, with
JSON in and out, so no operator text ever crosses a remote shell.
"""

from __future__ import annotations

import base64
import functools
from pathlib import Path
from typing import TYPE_CHECKING, Any

from h3flow.config.models import LocalConfig, load_local_config
from h3flow.core.errors import ConfigError, H3FlowError
from h3flow.core.paths import PATCHES_DIR
from h3flow.handoff.inventory import HostFiles
from h3flow.ops.comfy_install import PACK_SOURCE, _pack_files
from h3flow.ops.patches import PatchReport, agent_request, reports_from
from h3flow.ops.ssh import connected

if TYPE_CHECKING:
    from h3flow.core.batch import Batch
    from h3flow.pipeline.runs import BatchStager, Inventory, ManifestReader, RunLister, Stager


def patches_on_host(
    host: str,
    action: str,
    comfy_dir: Path | None,
    raylight_dir: Path | None,
    config_path: Path = Path("local.json"),
    patches_dir: Path = PATCHES_DIR,
) -> list[PatchReport]:
    """Check or apply the patches in a host's checkouts over SSH.

    The patch files travel with the request to the h3flow agent in the host's venv,
    which runs :func:`check_trees` / :func:`apply_trees` there (GNU patch on that host).
    The directories are paths on the host: the given ones, else the host's
    ``comfy_dir`` / ``raylight_dir`` from local.json.
    """
    config = load_local_config(config_path)
    if host not in config.hosts:
        raise H3FlowError(f"unknown host {host!r} (local.json has {', '.join(config.hosts)})")
    resolved = config.hosts[host]
    given = comfy_dir is not None or raylight_dir is not None
    comfy = str(comfy_dir) if given and comfy_dir else None if given else resolved.comfy_dir
    raylight = str(raylight_dir) if given and raylight_dir else None if given else resolved.raylight_dir
    if comfy is None and raylight is None:
        raise H3FlowError(
            f"host {host!r} has no comfy_dir or raylight_dir in local.json: give --comfy-dir / "
            "--raylight-dir (paths on that host)"
        )
    with connected(config, host) as runner:
        answer = runner.agent("patches", agent_request(action, comfy, raylight, patches_dir), timeout=300.0)
    return reports_from(answer)


def install_nodes_on_host(config_path: Path, host: str, comfy_dir: str | None = None) -> tuple[str, str]:
    """``h3flow nodes install --host``: this checkout's node pack into ``<comfy_dir>/custom_nodes/h3flow_nodes``
    on the host (the agent there runs the same ``install_node_pack``: identical files are left
    alone, a changed pack is replaced whole). Returns (installed | updated | unchanged, target)."""
    config = load_local_config(config_path)
    if host not in config.hosts:
        raise ConfigError(f"unknown host {host!r} (local.json has {', '.join(config.hosts)})")
    target = comfy_dir or config.hosts[host].comfy_dir
    if not target:
        raise ConfigError(f"host {host!r} has no comfy_dir in local.json: give --comfy-dir (a path on that host)")
    files = {rel: base64.b64encode(data).decode() for rel, data in _pack_files(PACK_SOURCE).items()}
    with connected(config, host) as runner:
        answer = runner.agent("nodes_install", {"comfy_dir": target, "files": files}, timeout=120.0)
    return answer["status"], answer["target"]


def store_inventory(
    config: LocalConfig,
    host: str,
    latents: list[str],
    outputs: list[tuple[str, str]],
    *,
    repair: bool = False,
) -> HostFiles:
    """Ask a host what its store and outputs hold, verified by SHA-256 there (for ``resume``).

    ``latents``: SHA-256s of latents that should be in the host's store; ``outputs``:
    ``(path, sha256)`` of MP4s that should be in its outputs (see
    :func:`h3flow.handoff.inventory.check_host_files`; ``repair`` moves damaged files aside
    there, so re-made ones can take their place). The embedded default (a local.json with a
    work_dir) answers here, a cluster host through its h3flow agent over SSH: no store is
    ever read as a local path of another host.
    """
    if host not in config.hosts:
        raise ConfigError(f"unknown host {host!r} (local.json has {', '.join(config.hosts)})")
    storage = config.hosts[host].storage
    request: dict[str, Any] = {
        "store_root": storage.root,
        "outputs_root": storage.outputs,
        "latents": list(latents),
        "outputs": [{"path": path, "sha256": sha} for path, sha in outputs],
        "repair": repair,
    }
    if config.work_dir:
        from h3flow.ops.agent import op_inventory

        answer = op_inventory(request)
    else:
        with connected(config, host) as runner:
            answer = runner.agent("inventory", request, timeout=600.0)
    return HostFiles.from_json(answer)


def cluster_inventory(config: LocalConfig) -> Inventory:
    """``resume``'s :data:`~h3flow.pipeline.runs.Inventory` for any config: each host checks its own files."""
    return functools.partial(store_inventory, config, repair=True)


def manifest_reader(config: LocalConfig) -> ManifestReader:
    """Run manifests where the dispatcher keeps them: this machine's runs_dir for the embedded
    default, the control host's (through its agent) on a cluster — no shared disk."""
    from h3flow.pipeline.manifest import Manifest
    from h3flow.pipeline.runs import local_manifests

    if config.work_dir:
        return local_manifests(config)

    def read(run_id: str) -> Manifest:
        with connected(config, config.control_host) as runner:
            answer = runner.agent("manifest", {"runs_dir": config.runs_dir, "run_id": run_id}, timeout=60.0)
        return Manifest.model_validate(answer["manifest"])

    return read


def run_lister(config: LocalConfig) -> RunLister:
    """``h3flow runs``: the runs under the dispatcher's runs_dir, wherever that is."""
    from h3flow.pipeline.runs import RunSummary, list_runs

    if config.work_dir:
        return functools.partial(list_runs, config)

    def listed(limit: int | None) -> list[RunSummary]:
        with connected(config, config.control_host) as runner:
            answer = runner.agent("runs", {"runs_dir": config.runs_dir, "limit": limit}, timeout=60.0)
        return [RunSummary.from_json(item) for item in answer["runs"]]

    return listed


def batch_stager(config: LocalConfig) -> BatchStager:
    """``run``'s :data:`~h3flow.pipeline.runs.BatchStager`: the embedded default writes the staged batch
    where its dispatcher reads it (this machine); a cluster sends it to the control host's agent,
    which stores it by content beside the staged images."""
    from h3flow.pipeline.runs import batch_in_place

    if config.work_dir:
        return batch_in_place

    def stage(config: LocalConfig, data: bytes, sha256: str) -> None:
        host = config.control_host
        with connected(config, host) as runner:
            runner.agent(
                "stage_inputs",
                {
                    "store_root": config.hosts[host].storage.root,
                    "images": {sha256: {"suffix": ".json", "data": base64.b64encode(data).decode()}},
                },
                timeout=300.0,
            )

    return stage


def image_stager(config: LocalConfig) -> Stager:
    """``run``'s :data:`~h3flow.pipeline.runs.Stager`: the embedded default's encoders read the
    images where they are; a cluster's get them, by content address, through each encoder
    host's agent (the encode stage then reads the staged copy)."""
    from h3flow.pipeline.runs import images_in_place

    if config.work_dir:
        return images_in_place

    def stage(config: LocalConfig, batch: Batch) -> Batch:
        images = {
            clip.image_sha256: {"suffix": clip.image.suffix, "data": base64.b64encode(clip.image.read_bytes()).decode()}
            for clip in batch.clips
            if clip.image_sha256
        }
        encoders = {config.pool(p.encoder_pool or p.name).host for p in config.samplers}
        encoders |= {p.host for p in config.samplers}  # a borrower's encode stage runs on its own host
        for host in sorted(encoders):
            with connected(config, host) as runner:
                runner.agent(
                    "stage_inputs", {"store_root": config.hosts[host].storage.root, "images": images}, timeout=300.0
                )
        return batch

    return stage
