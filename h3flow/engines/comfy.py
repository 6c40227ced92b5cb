"""The ``comfy`` engine: each stage is a workflow template run on the pool host's ComfyUI.

encode / sample / decode fill a template from ``workflows/`` (production: the h3flow
node pack + upstream MiniMax H3 + Raylight; ``reference=True``: the reference model's
nodes), submit it with this engine's client id, follow the websocket (progress goes
to the log, an ``execution_error`` becomes one H3FlowError naming the node), and
return the file the save node reports, its SHA-256 checked on this host. ComfyUI
writes the files itself, so the engine and the ComfyUI share a filesystem (the pool's
worker runs on the ComfyUI's host).

Templates survive upstream drift: before a template's first prompt the engine reads the
live schema of every node type it uses (``GET /object_info/{class}``); a required input
the template does not set is filled with the default the server declares and reported
once (a warning in the run log, and :attr:`ComfyEngine.filled`); one without a default
is a one-line error naming the node, the input and the fix, before anything is queued,
and so is an input the template sets that the live node does not have (a renamed
upstream input would otherwise run at its default while our value is ignored).

Connection failures (refused, reset, ComfyUI restarted mid-run) are retried here a
few times, resubmitting once the server answers again; if they persist a
:class:`~h3flow.core.errors.TransientError` leaves for Prefect's own retries. Errors in the
prompt itself are never retried.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from h3flow.core.batch import Clip
from h3flow.core.errors import H3FlowError, IntegrityError, TransientError
from h3flow.core.files import FileRef
from h3flow.core.fsutil import sha256_bytes, sha256_file
from h3flow.core.paths import WORKFLOWS_DIR
from h3flow.core.runlog import run_logger
from h3flow.core.specs import FPS
from h3flow.engines.base import OffloadReport
from h3flow.engines.comfy_client import ComfyClient, Event, RunResult
from h3flow.engines.workflows import TEMPLATES, complete_prompt, load_template, render, template_parameters

FILES_KEY = "h3flow_files"
log = logging.getLogger("h3flow.engines.comfy")


class ComfyEngine:
    """The :class:`~h3flow.engines.base.Engine` stages on one ComfyUI server."""

    name = "comfy"

    def __init__(
        self,
        base_url: str,
        *,
        client_id: str | None = None,
        timeout: float = 3600.0,
        templates_dir: Path | None = None,
        reference: bool = True,
        variant: str | None = None,
        params: Mapping[str, Any] | None = None,
        retries: int = 3,
        ready_timeout: float = 180.0,
        on_event: Callable[[Event], None] | None = None,
    ) -> None:
        self.client = ComfyClient(base_url, client_id=client_id, timeout=timeout)
        self.base_url = self.client.base_url
        self.timeout = timeout
        self.templates_dir = Path(templates_dir) if templates_dir else WORKFLOWS_DIR
        self.reference = reference
        self.variant = variant or ("reference" if reference else "production")
        if self.variant not in TEMPLATES:
            raise H3FlowError(f"unknown template set {self.variant!r} (known: {', '.join(TEMPLATES)})")
        self.params = dict(params or {})
        self.retries = retries
        self.ready_timeout = ready_timeout
        self.on_event = on_event
        self.attempts: list[str] = []  # one line per transient failure survived (for reports and tests)
        self.filled: list[str] = []  # one line per template input filled from the server's defaults
        self._schemas: dict[str, dict[str, Any] | None] = {}  # node type -> live /object_info entry
        self._reported: set[tuple[str, str, str]] = set()

    # ------------------------------------------------------------------ stages
    def encode(self, clip: Clip, out_path: Path) -> FileRef:
        image = self._upload(Path(clip.image))
        spec = clip.resolved_spec
        params: dict[str, object] = {"image": image, "prompt": clip.prompt, "out_path": str(Path(out_path).resolve())}
        if self.reference:
            params.update(spec=spec.name, frames=clip.frames)
        else:
            params.update(width=spec.width, height=spec.height, length=clip.frames)
        return self._stage("encode", params, "conditioning", Path(out_path))

    def offload(self) -> OffloadReport:
        """POST /free (unload models, free memory), then report each device's free memory."""
        before = self._with_retries("offload", self.client.free_per_device)
        self._with_retries("offload", self.client.free)
        after = self._with_retries("offload", self.client.free_per_device)
        freed = sum(max(0, after[d] - before.get(d, after[d])) for d in after)
        retain = os.environ.get("H3_MP_RETAIN_CPU_WEIGHTS", "") == "1"
        return OffloadReport(freed_bytes=freed, free_per_device=after, kept_cpu_copy=retain)

    def sample(self, clip: Clip, conditioning: FileRef, out_path: Path) -> FileRef:
        spec = clip.resolved_spec
        params: dict[str, Any] = {
            "cond_path": str(Path(conditioning.path).resolve()),
            "cond_sha256": conditioning.sha256,
            "seed": clip.seed,
            "steps": clip.steps,
            "out_path": str(Path(out_path).resolve()),
            "meta": json.dumps(self._latent_meta(clip, conditioning.sha256), sort_keys=True),
        }
        if not self.reference:
            params.update(width=spec.width, height=spec.height, length=clip.frames)
        return self._stage("sample", params, "latent", Path(out_path))

    def decode(self, latent: FileRef, out_path: Path) -> FileRef:
        params = {
            "latent_path": str(Path(latent.path).resolve()),
            "latent_sha256": latent.sha256,
            "out_path": str(Path(out_path).resolve()),
        }
        return self._stage("decode", params, "video", Path(out_path))

    # ------------------------------------------------------------------ plumbing
    def _latent_meta(self, clip: Clip, cond_sha: str) -> dict[str, str]:
        if self.reference:
            from h3flow.reference.meta import latent_meta  # torch-free: no torch import per flow run

            meta = latent_meta(clip, cond_sha, degree=1)
        else:
            meta = {
                "clip_id": clip.id,
                "seed": str(clip.seed),
                "steps": str(clip.steps),
                "spec": clip.spec,
                "frames": str(clip.frames),
                "fps": str(FPS),
                "conditioning_sha256": cond_sha,
                "sampler": f"{self.params.get('sampler_name', 'euler')}-{self.params.get('scheduler', 'simple')}",
                "model": str(self.params.get("unet_name", "minimax_h3_fl2va_pruned_int8_convrot.safetensors")),
            }
        meta["producer_engine"] = f"comfy {self.base_url}"
        return meta

    def template_name(self, stage: str) -> str:
        return TEMPLATES[self.variant][stage]

    def prompt_for(self, stage: str, params: Mapping[str, Any]) -> dict[str, Any]:
        """The filled API-format prompt of a stage (engine params + the stage's own)."""
        name = self.template_name(stage)
        template = load_template(name, self.templates_dir)
        known = template_parameters(template)
        extra = {k: v for k, v in self.params.items() if k in known and k not in params}
        return render(template, {**extra, **params}, name=f"workflow {name}")

    def live_prompt(self, stage: str, params: Mapping[str, Any]) -> dict[str, Any]:
        """:meth:`prompt_for`, completed against this server's live node schemas.

        Required inputs the template leaves out are filled with the server's defaults
        (each reported once per engine); one without a default, or an input the live node
        does not know, raises H3FlowError naming the node, the input and the server's inputs.
        """
        name = self.template_name(stage)
        prompt = self.prompt_for(stage, params)
        for ctype in sorted({str(node["class_type"]) for node in prompt.values()} - set(self._schemas)):
            self._schemas[ctype] = self.client.node_info(ctype)
        live = {ctype: schema for ctype, schema in self._schemas.items() if schema is not None}
        done = complete_prompt(prompt, live, template=name)
        if done.problems:
            raise H3FlowError(f"ComfyUI at {self.base_url}: " + "; ".join(done.problems))
        for item in done.filled:
            if (name, item.node_id, item.name) not in self._reported:
                self._reported.add((name, item.node_id, item.name))
                self.filled.append(item.line(name))
                run_logger(log).warning("ComfyUI at %s: %s", self.base_url, item.line(name))
        return done.prompt

    def _stage(self, stage: str, params: Mapping[str, Any], kind: str, out_path: Path) -> FileRef:
        prompt = self._with_retries(stage, lambda: self.live_prompt(stage, params))
        result = self._with_retries(stage, lambda: self.client.run(prompt, on_event=self._event, timeout=self.timeout))
        return self._collect(result, kind, out_path, stage)

    def _with_retries(self, what: str, call: Callable[[], Any]) -> Any:
        last: TransientError | None = None
        for attempt in range(self.retries + 1):
            try:
                if attempt:
                    self.client.wait_ready(self.ready_timeout)
                return call()
            except TransientError as exc:
                last = exc
                self.attempts.append(f"{what}: attempt {attempt + 1}: {exc}")
                run_logger(log).warning("ComfyUI %s: %s (attempt %d of %d)", what, exc, attempt + 1, self.retries + 1)
        raise TransientError(f"{what} on ComfyUI at {self.base_url} failed {self.retries + 1} times; last: {last}")

    def _event(self, event: Event) -> None:
        kind = event.get("type")
        if kind == "progress":
            run_logger(log).info("ComfyUI node %s: %s/%s", event.get("node"), event.get("value"), event.get("max"))
        elif kind == "executing" and event.get("node") is not None:
            run_logger(log).debug("ComfyUI executing node %s", event.get("node"))
        if self.on_event is not None:
            self.on_event(event)

    def _collect(self, result: RunResult, kind: str, out_path: Path, stage: str) -> FileRef:
        reported = [ref for out in result.outputs.values() for ref in out.get(FILES_KEY, []) if ref.get("kind") == kind]
        if len(reported) != 1:
            raise H3FlowError(
                f"ComfyUI at {self.base_url}: the {stage} workflow reported {len(reported)} {kind} files, expected 1"
            )
        ref = reported[0]
        path = Path(ref["path"])
        if path.resolve() != out_path.resolve():
            raise H3FlowError(f"ComfyUI wrote the {kind} to {path}, expected {out_path}")
        if not path.is_file():
            raise H3FlowError(
                f"ComfyUI reported {path} but it is not on this host (engine and ComfyUI must share a filesystem)"
            )
        actual = sha256_file(path)
        if actual != ref["sha256"]:
            raise IntegrityError(f"{path}: SHA-256 {actual} on disk, ComfyUI reported {ref['sha256']}")
        return FileRef(path, actual, path.stat().st_size)

    def _upload(self, image: Path) -> str:
        """The reference image into ComfyUI's input folder, named by content (idempotent)."""
        try:
            data = image.read_bytes()
        except OSError as exc:
            raise H3FlowError(f"reference image {image}: cannot read it ({exc.strerror or exc})") from None
        name = f"{sha256_bytes(data)[:20]}{image.suffix.lower() or '.png'}"
        return str(self._with_retries("upload", lambda: self.client.upload_image(image, name)))

    def close(self) -> None:
        self.client.close()
