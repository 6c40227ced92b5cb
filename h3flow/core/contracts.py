"""The names and numbers that several layers must agree on, written down once.

The planner simulates what the dispatcher does, the manifest records what the flows
report, the UI finds a run's artifacts and flow runs by name: each of those pairs shares
a contract, and it lives here so the two sides cannot drift apart.
"""

from __future__ import annotations

import re

AHEAD = 2
"""Clips in flight per pool: one running, one queued ahead (the dispatcher and the planner)."""

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


CLIPS_QUEUE = "clips"
"""The work queue (in every pool's work pool) of clip flow runs: served by the pool runner, no worker."""


STOP_TAG = "h3flow:stop"
"""Put on a pool runner's flow run by the dispatcher when its batch has no more work for it."""


def run_tag(run_id: str) -> str:
    """The tag every flow run of an h3flow run carries (the UI filters a run's flow runs by it)."""
    return f"h3flow-run:{run_id}"


def pool_tag(pool: str) -> str:
    """The tag of the flow runs meant for one pool's runner."""
    return f"h3flow-pool:{pool}"


def artifact_key(*parts: str) -> str:
    """A Prefect artifact key (lowercase letters, digits, dashes) from free text, e.g. a run id."""
    return re.sub(r"[^a-z0-9-]+", "-", "-".join(parts).lower()).strip("-")[:80]
