"""Prefect's side of liveness: the automation that marks a silent h3flow flow run Crashed.

Every h3flow flow run (tagged ``h3flow``) sends a heartbeat event every
:data:`HEARTBEAT_S` seconds while it runs (``PREFECT_FLOWS_HEARTBEAT_FREQUENCY``, which
``h3flow start`` gives every worker). A run that was claimed (Pending), started, or beat
and then says nothing more — no heartbeat, no end — for ``H3FLOW_SILENCE_S`` seconds
is marked Crashed by this automation: its worker died, its host rebooted or froze, or
it ended while Prefect could not hear it. The dispatcher then sends its clip again
(finished stages are cache hits), and ``resume`` may take over a crashed dispatcher.
``h3flow deploy`` creates (or updates) it.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from h3flow.config.settings import settings
from h3flow.core.contracts import H3FLOW_TAG

HEARTBEAT_S = 30
"""Seconds between a flow run's heartbeats: Prefect's shortest (``PREFECT_FLOWS_HEARTBEAT_FREQUENCY``)."""
NAME = "h3flow: a silent flow run is Crashed"
LIVE = ("prefect.flow-run.Pending", "prefect.flow-run.Running", "prefect.flow-run.heartbeat")
ENDED = tuple(f"prefect.flow-run.{s}" for s in ("Completed", "Failed", "Cancelled", "Crashed", "Cancelling"))


def silence_automation(silence_s: float) -> Any:
    """The automation (a proactive trigger per flow run, and the state change it makes)."""
    from prefect.client.schemas.objects import StateType
    from prefect.events.actions import ChangeFlowRunState
    from prefect.events.schemas.automations import AutomationCore, EventTrigger, Posture

    return AutomationCore(
        name=NAME,
        description=(
            f"An h3flow flow run that sends no heartbeat (every {HEARTBEAT_S} s) and does not end for "
            f"{silence_s:g} s is marked Crashed: the dispatcher sends its clip again."
        ),
        trigger=EventTrigger(
            match={"prefect.resource.id": "prefect.flow-run.*"},
            match_related={"prefect.resource.role": "tag", "prefect.resource.id": f"prefect.tag.{H3FLOW_TAG}"},
            after=set(LIVE),
            expect={*LIVE[1:], *ENDED},
            for_each={"prefect.resource.id"},
            posture=Posture.Proactive,
            threshold=1,
            within=timedelta(seconds=silence_s),
        ),
        actions=[
            ChangeFlowRunState(
                state=StateType.CRASHED,
                message=f"no heartbeat for {silence_s:g} s: its worker or host is gone (h3flow's silence automation)",
            )
        ],
    )


def ensure_silence_automation() -> str:
    """Create the automation, or bring the existing one up to date; returns its id."""
    from prefect.client.orchestration import get_client

    wanted = silence_automation(settings().silence_s)
    with get_client(sync_client=True) as client:
        existing = client.read_automations_by_name(NAME)
        for extra in existing[1:]:
            client.delete_automation(extra.id)
        if existing:
            client.update_automation(existing[0].id, wanted)
            return str(existing[0].id)
        return str(client.create_automation(wanted))
