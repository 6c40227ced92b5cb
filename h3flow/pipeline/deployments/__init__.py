"""Work pools, concurrency limits, the silence automation, deployments and ``prefect.yaml``,
all derived from local.json.

``h3flow deploy`` creates, per pool, a work pool of the ``h3flow`` worker type whose
default queue holds ``AHEAD`` clips at a time, a global concurrency limit of 1 for its
GPUs (``h3flow-gpu-<pool>``, the Concurrency page) and a deployment
(``sample-clip/<pool>`` or ``decode-clip/<decoder>``); the control pool and
``batch/run`` (and, when local.json has a schedule, the cron ``batch/inbox``); and the
automations that mark a silent flow run Crashed (:mod:`h3flow.pipeline.automations`).
It writes the matching ``prefect.yaml``, so ``prefect deploy --all`` gives the same
deployments.
"""

from __future__ import annotations

import contextlib
import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from h3flow.config.models import LocalConfig
from h3flow.core.contracts import AHEAD, CLIP_TAG, DISPATCHER_TAG, H3FLOW_TAG, WORKER_TYPE, gpu_limit
from h3flow.core.fsutil import atomic_write_text
from h3flow.core.paths import ENTRYPOINTS, SOURCE_DIR


@dataclass(frozen=True)
class DeploymentSpec:
    flow: str
    name: str
    work_pool: str
    parameters: dict[str, Any]
    cron: str | None = None
    timezone: str | None = None

    @property
    def full_name(self) -> str:
        return f"{self.flow}/{self.name}"

    @property
    def tags(self) -> list[str]:
        """Every run of it carries these: the silence automations tell clips from dispatchers by them."""
        return [H3FLOW_TAG, DISPATCHER_TAG if self.flow == "batch" else CLIP_TAG]


def deployment_specs(config: LocalConfig, config_path: Path) -> list[DeploymentSpec]:
    """The deployments: no job variables, as the h3flow worker runs every flow run in its own
    environment (the pool's devices and H3FLOW_CONFIG, set by ``h3flow start``)."""
    cfg = {"config_path": str(Path(config_path).absolute())}
    specs: list[DeploymentSpec] = []
    for pool in config.pools:
        flow = "sample-clip" if pool.role == "sample" else "decode-clip"
        specs.append(DeploymentSpec(flow, pool.name, pool.work_pool, cfg))
    specs.append(DeploymentSpec("batch", "run", config.control_work_pool, cfg))
    if config.prefect.schedule:
        sched = config.prefect.schedule
        specs.append(DeploymentSpec("batch", "inbox", config.control_work_pool, cfg, sched.cron, sched.timezone))
    return specs


def work_pools(config: LocalConfig) -> list[str]:
    return [p.work_pool for p in config.pools] + [config.control_work_pool]


def ensure_work_pools(config: LocalConfig) -> None:
    """Every work pool of the ``h3flow`` type (one of another type, from an older h3flow, is made
    again), each GPU pool's queue limited to AHEAD clips and its GPUs to one clip (a global
    concurrency limit)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import (
        GlobalConcurrencyLimitCreate,
        GlobalConcurrencyLimitUpdate,
        WorkPoolCreate,
    )
    from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound

    from h3flow.pipeline.worker import H3flowWorker

    template = H3flowWorker.get_default_base_job_template()
    gpu_pools = {p.work_pool: p.name for p in config.pools}
    with get_client(sync_client=True) as client:
        for name in work_pools(config):
            try:
                if client.read_work_pool(name).type != WORKER_TYPE:
                    client.delete_work_pool(name)
            except ObjectNotFound:
                pass
            try:
                client.create_work_pool(WorkPoolCreate(name=name, type=WORKER_TYPE, base_job_template=template))
            except ObjectAlreadyExists:
                pass
            queue = client.read_work_queue_by_name("default", work_pool_name=name)
            limit = AHEAD if name in gpu_pools else None
            if queue.concurrency_limit != limit:
                client.update_work_queue(queue.id, concurrency_limit=limit)
        for pool in gpu_pools.values():
            try:
                if client.read_global_concurrency_limit_by_name(gpu_limit(pool)).limit != 1:
                    client.update_global_concurrency_limit(gpu_limit(pool), GlobalConcurrencyLimitUpdate(limit=1))
            except ObjectNotFound:
                client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name=gpu_limit(pool), limit=1))


def deploy_all(config: LocalConfig, config_path: Path) -> list[str]:
    """Create (or update) every work pool and deployment; write prefect.yaml beside local.json."""
    from h3flow.pipeline.prefect_api import prefect_api

    with prefect_api(config):
        names = _deploy_all(config, config_path)
    write_prefect_yaml(config, config_path, Path(config_path).resolve().parent / "prefect.yaml")
    return names


def _deploy_all(config: LocalConfig, config_path: Path) -> list[str]:
    from prefect import Flow
    from prefect.client.schemas.schedules import CronSchedule

    from h3flow.pipeline.automations import ensure_silence_automations

    ensure_work_pools(config)
    ensure_silence_automations()
    names = []
    for spec in deployment_specs(config, config_path):
        flow = cast(Flow[..., Any], Flow.from_source(source=str(SOURCE_DIR), entrypoint=ENTRYPOINTS[spec.flow]))
        schedules: list[Any] | None = [CronSchedule(cron=spec.cron, timezone=spec.timezone)] if spec.cron else None
        with contextlib.redirect_stdout(io.StringIO()):  # Prefect prints a table per deploy
            flow.deploy(
                name=spec.name,
                work_pool_name=spec.work_pool,
                parameters=spec.parameters,
                tags=spec.tags,
                schedules=schedules,
                build=False,
                push=False,
                print_next_steps=False,
                ignore_warnings=True,
            )
        names.append(spec.full_name)
    return names


def prefect_yaml(config: LocalConfig, config_path: Path, source_dir: Path = SOURCE_DIR) -> str:
    """The same deployments as prefect.yaml (for `prefect deploy --all`).

    ``source_dir`` is where h3flow's source lives on the workers' hosts (this checkout
    for the embedded default).
    """
    import json

    def q(value: Any) -> str:  # JSON is valid YAML: quote every scalar and mapping safely
        return json.dumps(value, sort_keys=True)

    lines = [
        "# Generated by `h3flow deploy` from local.json; `prefect --no-prompt deploy --all` creates the same deployments.",
        "name: h3flow",
        "prefect-version: 3.9.1",
        "pull:",
        "- prefect.deployments.steps.set_working_directory:",
        f"    directory: {q(str(source_dir))}",
        "deployments:",
    ]
    for spec in deployment_specs(config, config_path):
        lines += [
            f"- name: {q(spec.name)}",
            f"  entrypoint: {q(ENTRYPOINTS[spec.flow])}",
            f"  parameters: {q(spec.parameters)}",
            f"  tags: {q(spec.tags)}",
            "  work_pool:",
            f"    name: {q(spec.work_pool)}",
        ]
        if spec.cron:
            lines += ["  schedules:", f"  - cron: {q(spec.cron)}", f"    timezone: {q(spec.timezone)}"]
    return "\n".join(lines) + "\n"


def write_prefect_yaml(config: LocalConfig, config_path: Path, target: Path, source_dir: Path = SOURCE_DIR) -> Path:
    atomic_write_text(target, prefect_yaml(config, config_path, source_dir))
    return target
