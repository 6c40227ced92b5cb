"""Where a message meant for the operator goes: the Prefect run's log when there is one."""

from __future__ import annotations

import logging
from typing import Any


def run_logger(fallback: logging.Logger) -> Any:
    """Prefect's run logger inside a flow or task run (so the message shows in the UI and
    ``h3flow logs``), else ``fallback``."""
    try:
        from prefect.context import FlowRunContext, TaskRunContext
        from prefect.logging import get_run_logger

        if TaskRunContext.get() or FlowRunContext.get():
            return get_run_logger()
    except Exception:  # noqa: BLE001 - prefect absent or no context: plain logging
        pass
    return fallback
