"""A small client for one ComfyUI server's HTTP + websocket API.

ComfyUI runs a prompt asynchronously: POST /prompt queues it, the websocket
(``/ws?clientId=``) reports ``executing`` / ``progress`` / ``executed`` and finally
``execution_success`` or ``execution_error`` / ``execution_interrupted``, and
GET /history/{id} holds the outputs. This client turns that into one blocking call,
:meth:`ComfyClient.run`, that returns the history entry or raises:

- :class:`~h3flow.core.errors.H3FlowError` with one line naming the node, its type, the
  exception and the validation ``node_errors`` when the prompt itself fails;
- :class:`~h3flow.core.errors.TransientError` when the connection fails (refused, reset,
  the server restarted mid-run): worth retrying, and only those are retried.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

import httpx
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidURI
from websockets.sync.client import ClientConnection, connect

from h3flow.core.errors import H3FlowError, TransientError

Event = dict[str, Any]
EventHandler = Callable[[Event], None]

CONNECTION_ERRORS: tuple[type[BaseException], ...] = (
    httpx.TransportError,
    ConnectionClosed,
    InvalidHandshake,
    OSError,
)
CONNECT_ERRORS: tuple[type[BaseException], ...] = (*CONNECTION_ERRORS, TimeoutError)


def summarize_node_errors(node_errors: dict[str, Any]) -> str:
    """``node 4 (KSampler): Value not in list: sampler_name 'x' not in [...]`` for each node."""
    parts: list[str] = []
    for node_id, info in sorted((node_errors or {}).items()):
        reasons = "; ".join(
            f"{r.get('message', '')}: {r.get('details', '')}".strip(": ") for r in info.get("errors", [])
        )
        parts.append(f"node {node_id} ({info.get('class_type', '?')}): {reasons or 'invalid'}")
    return "; ".join(parts)


def execution_error_message(data: dict[str, Any], where: str) -> str:
    """One line from an ``execution_error`` message: node id/type, exception type and text."""
    exc = str(data.get("exception_message", "")).strip()
    kind = str(data.get("exception_type", "")).rsplit(".", 1)[-1]
    return (
        f"ComfyUI at {where}: node {data.get('node_id')} ({data.get('node_type')}) failed: "
        f"{kind + ': ' if kind else ''}{exc}"
    )


@dataclass
class RunResult:
    """What a finished prompt left: its id, history entry and the events seen."""

    prompt_id: str
    history: dict[str, Any]
    events: list[Event] = field(default_factory=list)

    @property
    def outputs(self) -> dict[str, Any]:
        return dict(self.history.get("outputs", {}))


class ComfyClient:
    """HTTP + websocket access to one ComfyUI (``base_url`` like ``http://127.0.0.1:8188``)."""

    def __init__(
        self,
        base_url: str,
        *,
        client_id: str | None = None,
        timeout: float = 3600.0,
        connect_timeout: float = 10.0,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.client_id = client_id or f"h3flow-{uuid.uuid4().hex[:12]}"
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        parts = urlsplit(self.base_url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise H3FlowError(f"ComfyUI URL must look like http://HOST:PORT, got {base_url!r}")
        ws_scheme = "wss" if parts.scheme == "https" else "ws"
        self.ws_url = urlunsplit((ws_scheme, parts.netloc, parts.path + "/ws", f"clientId={self.client_id}", ""))
        self._http = httpx.Client(base_url=self.base_url, timeout=httpx.Timeout(60.0, connect=connect_timeout))

    # ------------------------------------------------------------------ plain HTTP
    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            return self._http.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise TransientError(f"ComfyUI at {self.base_url} unreachable ({method} {path}): {exc}") from exc

    def _json(self, method: str, path: str, **kwargs: Any) -> Any:
        response = self._request(method, path, **kwargs)
        if response.status_code >= 500:
            raise TransientError(f"ComfyUI at {self.base_url}: {method} {path} gave HTTP {response.status_code}")
        if response.status_code >= 400:
            raise H3FlowError(
                f"ComfyUI at {self.base_url}: {method} {path} gave HTTP {response.status_code}: {response.text[:300]}"
            )
        return response.json() if response.content else None

    def object_info(self) -> dict[str, Any]:
        return dict(self._json("GET", "/object_info"))

    def node_info(self, class_type: str) -> dict[str, Any] | None:
        """One node type's schema (``GET /object_info/{class}``), None when it is not installed."""
        data = self._json("GET", f"/object_info/{quote(class_type, safe='')}") or {}
        return data.get(class_type)

    def system_stats(self) -> dict[str, Any]:
        return dict(self._json("GET", "/system_stats"))

    def free_per_device(self) -> dict[str, int]:
        """``{device name: vram_free bytes}`` from /system_stats (``cpu`` on a CPU-only server)."""
        out: dict[str, int] = {}
        for dev in self.system_stats().get("devices", []):
            name = str(dev.get("name", "?"))
            if dev.get("index") is not None and not name.endswith(str(dev["index"])):
                name = f"{name}:{dev['index']}"
            out[name] = int(dev.get("vram_free", 0))
        return out

    def free(self, *, unload_models: bool = True, free_memory: bool = True) -> None:
        """Ask ComfyUI to unload models and free cached memory (it does so between prompts)."""
        self._json("POST", "/free", json={"unload_models": unload_models, "free_memory": free_memory})

    def history(self, prompt_id: str) -> dict[str, Any] | None:
        data = self._json("GET", f"/history/{prompt_id}") or {}
        return data.get(prompt_id)

    def interrupt(self) -> None:
        self._json("POST", "/interrupt")

    def upload_image(self, path: Path, name: str, subfolder: str = "h3flow") -> str:
        """Put an image into ComfyUI's input folder; returns the LoadImage value ``subfolder/name``."""
        with open(path, "rb") as handle:
            files = {"image": (name, handle, "application/octet-stream")}
            data = {"subfolder": subfolder, "type": "input", "overwrite": "true"}
            reply = self._json("POST", "/upload/image", files=files, data=data)
        got_sub = reply.get("subfolder") or ""
        return f"{got_sub}/{reply['name']}" if got_sub else str(reply["name"])

    def wait_ready(self, timeout: float = 120.0) -> None:
        """Poll /system_stats until the server answers (e.g. after a restart)."""
        deadline = time.monotonic() + timeout
        last: Exception | None = None
        while time.monotonic() < deadline:
            try:
                if self._http.get("/system_stats", timeout=5.0).status_code == 200:
                    return
            except httpx.TransportError as exc:
                last = exc
            time.sleep(0.25)
        raise TransientError(f"ComfyUI at {self.base_url} not reachable within {timeout:.0f} s: {last}")

    # ------------------------------------------------------------------ prompts
    def submit(self, prompt: dict[str, Any], *, prompt_id: str | None = None) -> str:
        """Queue an API-format prompt; invalid prompts raise one clear H3FlowError."""
        body = {"prompt": prompt, "client_id": self.client_id, "prompt_id": prompt_id or str(uuid.uuid4())}
        response = self._request("POST", "/prompt", json=body)
        if response.status_code >= 500:
            raise TransientError(f"ComfyUI at {self.base_url}: POST /prompt gave HTTP {response.status_code}")
        try:
            data = response.json()
        except json.JSONDecodeError:
            raise H3FlowError(
                f"ComfyUI at {self.base_url}: POST /prompt gave HTTP {response.status_code}: {response.text[:300]}"
            ) from None
        if response.status_code >= 400 or data.get("node_errors"):
            err = data.get("error") or {}
            head = err.get("message", "invalid prompt") if isinstance(err, dict) else str(err)
            detail = summarize_node_errors(data.get("node_errors") or {})
            if not detail and isinstance(err, dict):
                detail = str(err.get("details", ""))
            raise H3FlowError(
                f"ComfyUI at {self.base_url} rejected the prompt: {head}" + (f": {detail}" if detail else "")
            )
        return str(data["prompt_id"])

    def _connect(self) -> ClientConnection:
        try:
            return connect(self.ws_url, open_timeout=self.connect_timeout, max_size=None)
        except InvalidURI as exc:
            raise H3FlowError(f"bad ComfyUI websocket URL {self.ws_url}: {exc}") from exc
        except CONNECT_ERRORS as exc:
            raise TransientError(f"ComfyUI at {self.base_url}: websocket connect failed: {exc}") from exc

    def run(
        self,
        prompt: dict[str, Any],
        *,
        on_event: EventHandler | None = None,
        timeout: float | None = None,
        prompt_id: str | None = None,
    ) -> RunResult:
        """Submit ``prompt``, follow it on the websocket until it ends, return its history.

        The websocket is opened before submitting so no event is missed.
        """
        limit = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + limit
        events: list[Event] = []
        ws = self._connect()
        with ws:
            pid = self.submit(prompt, prompt_id=prompt_id)
            try:
                self._follow(ws, pid, deadline, events, on_event)
            except H3FlowError:
                raise  # the prompt itself ended: an error, an interrupt
            except BaseException as exc:
                # Nobody waits for this prompt any more (its own time limit, a lost connection, or the
                # stage stopped from outside: Prefect's task timeout and a cancel arrive as exceptions
                # raised in this thread). ComfyUI must not go on computing it for nobody, holding
                # the GPUs from the next prompt.
                self.cancel(pid)
                if isinstance(exc, (ConnectionClosed, OSError)):
                    raise TransientError(
                        f"ComfyUI at {self.base_url}: connection lost while running prompt {pid}: {exc}"
                    ) from exc
                if isinstance(exc, TimeoutError):
                    raise TransientError(
                        f"ComfyUI at {self.base_url}: prompt {pid} did not finish within {limit:.0f} s"
                    ) from None
                raise
        return RunResult(pid, self._finished_history(pid, deadline), events)

    def cancel(self, pid: str) -> None:
        """Take prompt ``pid`` off ComfyUI's queue, or interrupt it if it is running (ComfyUI checks
        between sampler steps). Best effort: a ComfyUI that went away has dropped it anyway."""
        for path, body in (("/queue", {"delete": [pid]}), ("/interrupt", {"prompt_id": pid})):
            try:
                self._http.post(path, json=body, timeout=5.0)
            except httpx.HTTPError:
                return

    def _follow(
        self, ws: ClientConnection, pid: str, deadline: float, events: list[Event], on_event: EventHandler | None
    ) -> None:
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError
            try:
                raw = ws.recv(timeout=min(remaining, 5.0))
            except TimeoutError:
                # Quiet for a while: the end may have been sent before we listened.
                entry = self.history(pid)
                if entry and entry.get("status", {}).get("completed") is not None and entry["status"].get("status_str"):
                    return
                continue
            if isinstance(raw, bytes):
                continue  # previews
            msg = json.loads(raw)
            kind, data = msg.get("type"), msg.get("data") or {}
            if data.get("prompt_id") not in (None, pid):
                continue
            if kind in ("status",):
                continue
            event = {"type": kind, **data}
            events.append(event)
            if on_event is not None:
                on_event(event)
            if kind == "execution_error":
                raise H3FlowError(execution_error_message(data, self.base_url))
            if kind == "execution_interrupted":
                raise H3FlowError(
                    f"ComfyUI at {self.base_url}: prompt {pid} interrupted at node {data.get('node_id')} ({data.get('node_type')})"
                )
            if kind == "execution_success" or (kind == "executing" and data.get("node") is None):
                return

    def _finished_history(self, pid: str, deadline: float) -> dict[str, Any]:
        while True:
            entry = self.history(pid)
            if entry is not None:
                status = entry.get("status", {})
                if status.get("status_str") == "error":
                    for kind, data in status.get("messages", []):
                        if kind == "execution_error":
                            raise H3FlowError(execution_error_message(data, self.base_url))
                    raise H3FlowError(f"ComfyUI at {self.base_url}: prompt {pid} ended with an error")
                return entry
            if time.monotonic() > deadline:
                raise TransientError(f"ComfyUI at {self.base_url}: no history for prompt {pid}")
            time.sleep(0.05)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> ComfyClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
