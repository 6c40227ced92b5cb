"""Prefect's side of liveness: the automations that mark a silent h3flow flow run Crashed.

Every h3flow flow run (tagged ``h3flow``) sends a heartbeat event every
:data:`HEARTBEAT_S` seconds while it runs (``PREFECT_FLOWS_HEARTBEAT_FREQUENCY``, which
``h3flow start`` gives every worker). A clip's run that beat and then says nothing more —
no heartbeat, no end — for ``H3FLOW_SILENCE_S`` seconds (a dispatcher's: for
``H3FLOW_DISPATCHER_SILENCE_S``), or one that a worker claimed and that never started, is
marked Crashed by these automations: its worker died, its host rebooted or froze, or
it ended while Prefect could not hear it. The dispatcher then sends its clip again
(finished stages are cache hits), and ``resume`` may take over a crashed dispatcher.
``h3flow deploy`` creates (or updates) them.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from h3flow.config.settings import settings
from h3flow.core.contracts import CLIP_TAG, DISPATCHER_TAG, H3FLOW_TAG

HEARTBEAT_S = 30
"""Seconds between a flow run's heartbeats: Prefect's shortest (``PREFECT_FLOWS_HEARTBEAT_FREQUENCY``)."""
ENDED = {f"prefect.flow-run.{s}" for s in ("Completed", "Failed", "Cancelled", "Crashed")}
SILENT_CLIP = "h3flow: a silent clip run is Crashed"
SILENT_DISPATCHER = "h3flow: a silent dispatcher is Crashed"
NEVER_STARTED = "h3flow: a claimed flow run that never starts is Crashed"


def silence_automations(silence_s: float, dispatcher_silence_s: float) -> list[Any]:
    """Proactive triggers per flow run, in the form Prefect documents for zombie flow runs: after
    a heartbeat — or the start (Running), so a run killed before its first beat reached the
    server is covered too — the next one (or the run's end) within a window: ``silence_s`` for
    a clip's run, ``dispatcher_silence_s`` for a dispatcher's, longer than any API outage it
    rides out (a false alarm there stops the run; one on a clip only sends it again). And after
    a claim (Pending), the start (or the end) within ``silence_s``: a claim whose answer the
    worker lost leaves a run Pending that nobody will start."""
    from prefect.client.schemas.objects import StateType
    from prefect.events.actions import ChangeFlowRunState
    from prefect.events.schemas.automations import AutomationCore, EventTrigger, Posture

    def automation(name: str, tag: str, after: set[str], expect: set[str], within: float, what: str, then: str) -> Any:
        return AutomationCore(
            name=name,
            description=f"A flow run tagged {tag} that {what} for {within:g} s is marked Crashed: {then}.",
            trigger=EventTrigger(
                match={"prefect.resource.id": "prefect.flow-run.*"},
                match_related={"prefect.resource.role": "tag", "prefect.resource.id": f"prefect.tag.{tag}"},
                after=after,
                expect=expect,
                for_each={"prefect.resource.id"},
                posture=Posture.Proactive,
                threshold=1,
                within=timedelta(seconds=within),
            ),
            actions=[
                ChangeFlowRunState(
                    state=StateType.CRASHED,
                    message=f"it {what} for {within:g} s: its worker or host is gone (h3flow's silence automation)",
                )
            ],
        )

    silent = f"sent no heartbeat (every {HEARTBEAT_S} s) and did not end"
    beat = "prefect.flow-run.heartbeat"
    started_or_beat, beat_or_end = {beat, "prefect.flow-run.Running"}, {beat, *ENDED}
    return [
        automation(
            SILENT_CLIP,
            CLIP_TAG,
            started_or_beat,
            beat_or_end,
            silence_s,
            silent,
            "the dispatcher sends its clip again",
        ),
        automation(
            SILENT_DISPATCHER,
            DISPATCHER_TAG,
            started_or_beat,
            beat_or_end,
            dispatcher_silence_s,
            silent,
            "`resume` may take over",
        ),
        automation(
            NEVER_STARTED,
            H3FLOW_TAG,
            {"prefect.flow-run.Pending"},
            {"prefect.flow-run.Running", "prefect.flow-run.Cancelling", *ENDED},
            silence_s,
            "was claimed by a worker and did not start",
            "it is sent again",
        ),
    ]


def ensure_silence_automations() -> list[str]:
    """Create the automations, or bring existing ones up to date; returns their ids.

    One that is already as wanted is left alone: updating an automation makes Prefect
    start its triggers afresh, forgetting the runs it was timing (a run that had just
    fallen silent would never be marked Crashed) — and ``start`` deploys again whenever
    it brings a worker back.
    """
    from prefect.client.orchestration import get_client

    ids = []
    with get_client(sync_client=True) as client:
        for wanted in silence_automations(settings().silence_s, settings().dispatcher_silence_s):
            existing = client.read_automations_by_name(wanted.name)
            for extra in existing[1:]:
                client.delete_automation(extra.id)
            if not existing:
                ids.append(str(client.create_automation(wanted)))
                continue
            if _spec(existing[0]) != _spec(wanted):
                client.update_automation(existing[0].id, wanted)
            ids.append(str(existing[0].id))
    return ids


def _spec(automation: Any) -> dict[str, Any]:
    """What an automation does, without the ids the server gives it, as values: a trigger's event
    sets stay sets. (As JSON they were lists in each process's set order, which the server's and
    the client's string hashing decide: for some pairs of hash seeds every ``start`` updated the
    automations, and a dispatcher killed before it was never marked Crashed.)"""
    fields: dict[str, Any] = automation.model_dump(include={"name", "description", "enabled", "trigger", "actions"})
    fields["trigger"].pop("id", None)
    return fields
