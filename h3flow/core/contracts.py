"""The names and numbers that several layers must agree on, written down once.

The planner simulates what the dispatcher does, the manifest records what the flows
report, the UI finds a run's artifacts and flow runs by name: each of those pairs shares
a contract, and it lives here so the two sides cannot drift apart.
"""

from __future__ import annotations

import re

AHEAD = 2
"""Clips in flight per pool: one on its GPUs, one queued ahead. ``h3flow deploy`` makes it each
GPU pool's queue concurrency limit in Prefect (the dispatcher reads it there); the planner
simulates it."""

MAX_SUBMISSIONS = 4
"""The most times one stage's prompt is submitted for one clip, over every retry layer."""

PIPELINE_STAGES = ("encode", "offload", "sample", "transfer", "decode")
"""The stages a run records per clip (manifest, reports, status)."""

PLANNER_STAGES = ("encode", "offload", "sample", "handoff", "transfer", "decode", "mux")
"""The planner's finer stages: handoff is the latent save inside sample, mux is inside decode."""

COVERS: dict[str, tuple[str, ...]] = {
    "encode": ("encode",),
    "offload": ("offload",),
    "sample": ("sample", "handoff"),
    "transfer": ("transfer",),
    "decode": ("decode", "mux"),
}
"""Each recorded stage -> the planner stages it covers."""

FILES_KEY = "h3flow_files"
"""The key under which the node pack's output nodes report the files they wrote (ComfyUI history)."""


WORKER_TYPE = "h3flow"
"""The Prefect worker type of every h3flow work pool (:mod:`h3flow.pipeline.worker`): runs flow runs in-process."""

H3FLOW_TAG = "h3flow"
"""The tag every h3flow flow run carries (the automation for runs claimed and never started watches it)."""

CLIP_TAG = "h3flow-clip"
"""The tag of a clip's sample and decode runs (the silence automation for clips watches it)."""

DISPATCHER_TAG = "h3flow-dispatcher"
"""The tag of a batch (dispatcher) run (the silence automation for dispatchers watches it)."""


def gpu_limit(pool: str) -> str:
    """The global concurrency limit (limit 1) that keeps a pool's GPU stages to one clip at a time."""
    return f"h3flow-gpu-{pool}"


def run_tag(run_id: str) -> str:
    """The tag every flow run of an h3flow run carries (the UI filters a run's flow runs by it)."""
    return f"h3flow-run:{run_id}"


def pool_tag(pool: str) -> str:
    """The tag of the flow runs a pool runs (the UI filters them by pool)."""
    return f"h3flow-pool:{pool}"


def artifact_key(*parts: str) -> str:
    """A Prefect artifact key (lowercase letters, digits, dashes) from free text, e.g. a run id."""
    return re.sub(r"[^a-z0-9-]+", "-", "-".join(parts).lower()).strip("-")[:80]
