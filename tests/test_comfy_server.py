"""Against a real ComfyUI server (0.33.0, upstream 783545f6, CPU torch): the node pack, the
reference templates through the ``comfy`` engine, errors, template drift, the example
workflows, and a restart mid-run.

The setup installs ComfyUI once into ``${H3FLOW_CACHE:-~/.cache/h3flow}/comfyui-783545f6``
from ``../shared/upstream`` (about 3.5 minutes the first time, cached after; the tests
skip, saying so, where neither that archive nor ``$H3FLOW_COMFYUI_SOURCE`` exists), installs the node pack with
``h3flow nodes install`` plus a few test-only nodes, and starts one server on a free
loopback port for this module, with h3flow *not importable* in ComfyUI's Python: a
stub package first on its path stands in for "not installed" (the shared install's
venv may hold another checkout's editable h3flow from before the pack stopped needing
it), and a test node proves it from inside the server.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import threading
import time
from fractions import Fraction
from pathlib import Path
from typing import Any

import av
import httpx
import numpy as np
import pytest
import torch
from PIL import Image
from typer.testing import CliRunner
from ui_workflow import to_api
from upstream import comfyui_install

from h3flow.cli import app
from h3flow.core.batch import Clip
from h3flow.core.errors import H3FlowError, TransientError
from h3flow.core.files import FileRef
from h3flow.core.fsutil import sha256_file
from h3flow.core.paths import NODE_PACK_DIR
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
from h3flow.ops.comfy_install import ComfyServer, prepare_base_dir
from h3flow.reference.conditioning import load_conditioning
from h3flow_nodes.paths import ALLOWED_ENV

EXAMPLES = sorted((NODE_PACK_DIR / "example_workflows").glob("*.json"))

pytestmark = pytest.mark.comfy

# Test-only nodes (written into custom_nodes by the fixture, never shipped):
# - a nested (video, audio) latent of a foreign class (duck-typed .is_nested/.tensors, as
#   upstream's comfy.nested_tensor.NestedTensor is), which the load node rebuilds as
#   ComfyUI's own NestedTensor;
# - a report of what a LATENT holds; a gate that waits for a file (the restart test);
# - a node whose schema drifts: its INPUT_TYPES adds the inputs in the JSON file that
#   $H3FLOW_TEST_DRIFT names (read on every call, as a ComfyUI updated in place would);
# - a probe of what ComfyUI's Python has imported and can import.
TEST_NODES = """
import importlib
import json
import os
import sys
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
        return {
            "required": {"seed": ("INT", {"default": 0, "min": 0, "max": 2**31})},
            "optional": {"mask": ("BOOLEAN", {"default": False})},
        }

    RETURN_TYPES = ("LATENT",)
    FUNCTION = "make"
    CATEGORY = "h3flow/test"

    def make(self, seed, mask=False):
        g = torch.Generator().manual_seed(seed)
        video = torch.randn(1, 24, 2, 8, 14, generator=g)
        audio = torch.randn(1, 32, 2, 37, generator=g)
        out = {"samples": ForeignNested((video, audio))}
        if mask:  # a nested (video, audio) noise mask, as H3's AV latents carry
            out["noise_mask"] = ForeignNested((torch.rand(1, 1, 2, 8, 14, generator=g), torch.rand(1, 1, 2, 37, generator=g)))
        return (out,)


class H3TestDrift:
    @classmethod
    def INPUT_TYPES(cls):
        extra = json.loads(open(os.environ["H3FLOW_TEST_DRIFT"]).read())
        return {"required": {"conditioning": ("CONDITIONING",), "value": ("INT", {"default": 1}), **extra}}

    RETURN_TYPES = ("CONDITIONING",)
    FUNCTION = "run"
    CATEGORY = "h3flow/test"

    def run(self, conditioning, **inputs):
        return {"ui": {"h3flow_test": [inputs]}, "result": (conditioning,)}


class H3TestImports:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {}}

    RETURN_TYPES = ()
    OUTPUT_NODE = True
    FUNCTION = "probe"
    CATEGORY = "h3flow/test"

    @classmethod
    def IS_CHANGED(cls, **kwargs):
        return float("nan")

    def probe(self):
        try:
            importlib.import_module("h3flow")
            importable = "yes"
        except ImportError as exc:
            importable = str(exc)
        foreign = ("h3flow", "prefect", "typer", "fabric", "matplotlib", "griffe", "coolname")  # h3flow and its deps
        loaded = sorted(m for m in sys.modules if m.split(".")[0] in foreign)
        pack = sorted(m for m in sys.modules if "h3flow_nodes" in m)
        return {"ui": {"h3flow_test": [{"h3flow": importable, "loaded": loaded, "pack_modules": pack}]}}


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
        mask = samples.get("noise_mask")
        masks = list(mask.tensors) if getattr(mask, "is_nested", False) else ([mask] if mask is not None else [])
        info = {
            "type": type(s).__name__,
            "nested": bool(getattr(s, "is_nested", False)),
            "shapes": [list(t.shape) for t in parts],
            "sums": [float(t.double().sum()) for t in parts],
            "meta": samples.get("h3flow_meta", {}),
            "mask_nested": bool(getattr(mask, "is_nested", False)),
            "mask_sums": [float(t.double().sum()) for t in masks],
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
        import comfy.model_management

        deadline = time.monotonic() + 120
        while not os.path.exists(gate):
            comfy.model_management.throw_exception_if_processing_interrupted()  # as a sampler's step loop does
            if time.monotonic() > deadline:
                raise RuntimeError("gate never opened")
            time.sleep(0.05)
        return (conditioning,)


NODE_CLASS_MAPPINGS = {
    "H3TestNestedLatent": H3TestNestedLatent,
    "H3TestLatentReport": H3TestLatentReport,
    "H3TestGate": H3TestGate,
    "H3TestDrift": H3TestDrift,
    "H3TestImports": H3TestImports,
}
"""


HIDDEN = "No module named 'h3flow' (this ComfyUI has no h3flow: the node pack must not need it)"


@pytest.fixture(scope="module")
def drift(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The extra required inputs of H3TestDrift (a JSON object of input specs), changed by the tests."""
    path = tmp_path_factory.mktemp("drift") / "inputs.json"
    path.write_text("{}")
    return path


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, drift: Path, work: Path) -> Any:
    install = comfyui_install()  # cached after the first run; skips without a ComfyUI 0.33 source
    base = prepare_base_dir(tmp_path_factory.mktemp("comfy-base"))
    result = CliRunner().invoke(app, ["nodes", "install", "--comfy-dir", str(base)])
    assert result.exit_code == 0, result.output
    (base / "custom_nodes" / "h3flow_test_nodes.py").write_text(TEST_NODES)
    hidden = tmp_path_factory.mktemp("no-h3flow")
    (hidden / "h3flow").mkdir()
    (hidden / "h3flow" / "__init__.py").write_text(f"raise ModuleNotFoundError({HIDDEN!r}, name='h3flow')\n")
    # the engine's files go to the module's work folder: the store the pack is told it may use
    env = {"PYTHONPATH": str(hidden), "H3FLOW_TEST_DRIFT": str(drift), ALLOWED_ENV: str(work)}
    srv = ComfyServer(install, base, env=env)
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
            "1": {"class_type": "H3TestNestedLatent", "inputs": {"seed": 5, "mask": True}},
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
    assert (
        before["mask_nested"] and after["mask_nested"] and after["mask_sums"] == before["mask_sums"]
    )  # kept, not dropped
    assert set(on_disk.masks) == {"noise_video", "noise_audio"}


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
        "encode",
        {
            "image": engine._upload(pipeline["clip"].image),
            "prompt": "p",
            "spec": "xx",
            "frames": 22,
            "out_path": str(work / "x"),
        },
    )
    with pytest.raises(
        H3FlowError,
        match=r"rejected the prompt: .*node 2 \(H3ReferenceEncode\): Custom validation failed for node: spec - spec 'xx' is not one of sd, hd, tiny$",
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


def test_the_nodes_refuse_paths_outside_their_folders(
    server: ComfyServer, pipeline: dict[str, Any], tmp_path_factory: pytest.TempPathFactory, work: Path
) -> None:
    """Any client of a ComfyUI on a network can queue prompts: the save nodes write, and the load
    nodes read, only under ComfyUI's own folders and the stores in $H3FLOW_NODES_ALLOWED_DIRS."""
    engine: ComfyEngine = pipeline["engine"]
    latent: FileRef = pipeline["latent"]
    outside = tmp_path_factory.mktemp("not-a-store") / "x.mp4"
    write = render(load_template("ref-decode"), {"latent_path": str(latent.path), "out_path": str(outside)})
    with pytest.raises(H3FlowError) as err:
        engine.client.run(write)
    assert (
        f"node 3 (H3SaveVideoAAC) failed: H3FlowError: path '{outside}' is outside the folders the h3flow nodes may use"
        in str(err.value)
    )
    assert f"{ALLOWED_ENV}: {work})" in str(err.value) and not outside.exists()
    read = render(load_template("ref-decode"), {"latent_path": "/etc/passwd", "out_path": str(work / "never.mp4")})
    with pytest.raises(
        H3FlowError, match=r"node 1 \(H3LatentHandoffLoad\) failed: H3FlowError: path '/etc/passwd' is outside"
    ):
        engine.client.run(read)
    assert not (work / "never.mp4").exists()


PACK_NODES = (
    "H3MultiGPUCLIPLoader",
    "H3LatentHandoffSave",
    "H3LatentHandoffLoad",
    "H3SaveConditioning",
    "H3LoadConditioning",
    "H3SaveVideoAAC",
    "H3ReferenceEncode",
    "H3ReferenceSample",
    "H3ReferenceDecode",
)


def test_templates_against_the_live_object_info(server: ComfyServer) -> None:
    live = ComfyEngine(server.url).client.object_info()
    fixture = upstream_object_info()
    for name in PACK_NODES:  # the shipped schema fixture is what the pack serves (the V3 schema, as ComfyUI renders it)
        sections = {k: v for k, v in live[name]["input"].items() if k != "hidden"}
        if name == "H3MultiGPUCLIPLoader":
            assert sections["required"]["clip_name"][1]["options"] == []  # no model files here
            sections["required"]["clip_name"] = fixture[name]["input"]["required"]["clip_name"]
        assert sections == fixture[name]["input"], name
        assert live[name]["output"] == fixture[name]["output"], name
        assert live[name]["description"] and live[name]["python_module"] == "custom_nodes.h3flow_nodes"
    params = {"cond_path": "c", "seed": 1, "out_path": "o", "latent_path": "l", "image": "example.png", "prompt": "p"}
    for name in ("ref-encode", "ref-sample", "ref-decode"):
        template = load_template(name)
        prompt = render(template, {k: v for k, v in params.items() if k in template_parameters(template)})
        assert validate_prompt(prompt, live) == [], name
    # ComfyUI 0.33 has MiniMax H3's nodes but no Raylight: preflight would name exactly the Raylight nodes.
    sample = render(
        load_template("h3-sample"),
        {"cond_path": "c", "seed": 1, "out_path": "o", "width": 736, "height": 416, "length": 124},
    )
    missing = [p for p in validate_prompt(sample, live) if p.endswith("node type not installed on this ComfyUI")]
    assert [p.split(" (")[1].split(")")[0] for p in missing] == [
        "RayInitializer",
        "RayLoraLoader",
        "RayUNETLoader",
        "XFuserKSamplerAdvanced",
    ]


def test_the_pack_runs_without_h3flow(server: ComfyServer, pipeline: dict[str, Any]) -> None:
    """The reference templates above ran in a ComfyUI that cannot import h3flow, and loaded none of it."""
    probe = ComfyEngine(server.url).client.run({"1": {"class_type": "H3TestImports", "inputs": {}}})
    (report,) = probe.outputs["1"]["h3flow_test"]
    assert report["h3flow"] == HIDDEN
    assert report["loaded"] == []  # no h3flow, Prefect, Typer ... in ComfyUI's process
    assert any(m.endswith("h3flow_nodes.h3latent") for m in report["pack_modules"])
    assert any(m.endswith("h3flow_nodes.reference.sampler") for m in report["pack_modules"])
    loaded = [line for line in server.log_path.read_text(errors="replace").splitlines() if "h3flow_nodes" in line]
    assert any("seconds" in line for line in loaded) and not any("IMPORT FAILED" in line for line in loaded)
    assert pipeline["video"].path.is_file()  # encode, sample and decode all ran in it


def _drift_template(work: Path) -> Path:
    """ref-sample with H3TestDrift between the conditioning and the sampler."""
    templates = work / "drift-templates"
    shutil.copytree(WORKFLOWS_DIR, templates, dirs_exist_ok=True)
    sample = json.loads((templates / "ref-sample.json").read_text())
    sample["9"] = {"class_type": "H3TestDrift", "inputs": {"conditioning": ["1", 0], "value": 5}}
    sample["2"]["inputs"]["conditioning"] = ["9", 0]
    (templates / "ref-sample.json").write_text(json.dumps(sample))
    return templates


def test_a_template_survives_a_node_that_gains_a_required_input(
    server: ComfyServer, pipeline: dict[str, Any], work: Path, drift: Path, caplog: pytest.LogCaptureFixture
) -> None:
    templates = _drift_template(work)
    clip, cond = pipeline["clip"], pipeline["cond"]
    drift.write_text(json.dumps({"gain": ["INT", {"default": 3, "min": 0, "max": 10}]}))
    try:
        seen: list[dict[str, Any]] = []
        engine = ComfyEngine(server.url, templates_dir=templates, on_event=seen.append)
        params = {"cond_path": str(cond.path), "cond_sha256": cond.sha256, "seed": clip.seed, "steps": clip.steps}
        as_written = engine.prompt_for("sample", {**params, "out_path": str(work / "drift" / "x.h3latent")})
        with pytest.raises(H3FlowError, match=r"node 9 \(H3TestDrift\): Required input is missing: gain"):
            engine.client.run(as_written)  # the real server rejects the template as written

        with caplog.at_level("WARNING", logger="h3flow.engines.comfy"):
            first = engine.sample(clip, cond, work / "drift" / "a.h3latent")
            second = engine.sample(clip, cond, work / "drift" / "b.h3latent")
        line = (
            "ref-sample: node 9 (H3TestDrift) input 'gain' is not set by the template; using this ComfyUI's default 3"
        )
        assert engine.filled == [line]
        assert [r.getMessage() for r in caplog.records] == [f"ComfyUI at {server.url}: {line}"]  # reported once
        ran = [e["output"]["h3flow_test"][0] for e in seen if e["type"] == "executed" and e.get("node") == "9"]
        assert ran == [{"value": 5, "gain": 3}]  # the server ran it with the default (the second time: cached)
        reference = load_latent(pipeline["latent"].path)
        for made in (first, second):
            latent = load_latent(made.path, made.sha256)
            assert torch.equal(latent.video, reference.video) and torch.equal(latent.audio, reference.audio)

        drift.write_text(json.dumps({"gain": ["INT", {"default": 3}], "mode": [["fast", "slow"]]}))
        before = len(httpx.get(server.url + "/history", timeout=10).json())
        fresh = ComfyEngine(server.url, templates_dir=templates)
        with pytest.raises(H3FlowError) as err:
            fresh.sample(clip, cond, work / "drift" / "c.h3latent")
        assert str(err.value) == (
            f"ComfyUI at {server.url}: ref-sample: node 9 (H3TestDrift) requires input 'mode', which the template "
            "does not set and this ComfyUI gives no default for: set it to one of ['fast', 'slow'] in "
            "workflows/ref-sample.json"
        )
        assert len(httpx.get(server.url + "/history", timeout=10).json()) == before  # nothing was queued
        assert not (work / "drift" / "c.h3latent").exists()
    finally:
        drift.write_text("{}")


def test_the_video_save_node_shows_a_preview(server: ComfyServer, pipeline: dict[str, Any]) -> None:
    latent = pipeline["latent"]
    prompt = render(
        load_template("ref-decode"),
        {"latent_path": str(latent.path), "latent_sha256": latent.sha256, "out_path": "h3flow/preview/c01.mp4"},
    )
    out = ComfyEngine(server.url).client.run(prompt).outputs["3"]
    assert out["images"] == [{"filename": "c01.mp4", "subfolder": "h3flow/preview", "type": "output"}]
    assert out["animated"] == [True]
    (ref,) = out["h3flow_files"]
    served = httpx.get(
        server.url + "/view", params={"filename": "c01.mp4", "subfolder": "h3flow/preview", "type": "output"}
    )
    assert served.status_code == 200 and hashlib.sha256(served.content).hexdigest() == ref["sha256"]
    assert ref["sha256"] == pipeline["video"].sha256  # the same bytes as the engine's decode
    # a path ComfyUI does not serve (the engine's work dir) has no preview, only the file report
    elsewhere = render(
        load_template("ref-decode"),
        {"latent_path": str(latent.path), "out_path": str(pipeline["video"].path.with_name("again.mp4"))},
    )
    out = ComfyEngine(server.url).client.run(elsewhere).outputs["3"]
    assert "images" not in out and out["h3flow_files"][0]["sha256"] == ref["sha256"]


def test_example_workflows_are_listed_and_the_reference_ones_run(server: ComfyServer, work: Path) -> None:
    listed = httpx.get(server.url + "/workflow_templates", timeout=10).json()
    assert sorted(listed["h3flow_nodes"]) == [p.stem for p in EXAMPLES]
    served = httpx.get(server.url + f"/api/workflow_templates/h3flow_nodes/{EXAMPLES[3].name}", timeout=10)
    assert served.status_code == 200 and served.json() == json.loads(EXAMPLES[3].read_text())
    client = ComfyEngine(server.url).client
    assert client.upload_image(work / "lake.png", "example.png", subfolder="") == "example.png"
    live = client.object_info()
    for path in EXAMPLES[:4]:  # encode, sample, decode, then the whole pipeline in one graph
        prompt, problems = to_api(json.loads(path.read_text()), live)
        assert problems == [], path.name
        client.run(prompt)
    output = server.base_dir / "output" / "h3flow"
    for name in ("example.mp4", "example_pipeline.mp4"):
        with av.open(str(output / name)) as container:
            video = container.streams.video[0]
            assert (video.codec_context.name, video.codec_context.width, video.codec_context.height) == (
                "h264",
                224,
                128,
            )
            assert container.streams.audio[0].codec_context.sample_rate == 48000
            assert sum(1 for _ in container.decode(video=0)) == 39
    assert (output / "example.mp4").read_bytes() == (output / "example_pipeline.mp4").read_bytes()
    for path in EXAMPLES[4:]:  # MiniMax H3's own nodes: this ComfyUI has them, not their model files
        prompt, problems = to_api(json.loads(path.read_text()), live)
        assert problems == [], path.name
        left = validate_prompt(prompt, live)
        assert left and all(
            re.search(r"input '(clip_name|vae_name|unet_name|lora_name)' value '[^']+' not among the options", p)
            for p in left
        ), left


def _gated_templates(work: Path, name: str) -> tuple[Path, Path]:
    """The reference templates with a gate before sampling: the prompt waits until the gate file exists."""
    templates = work / name
    shutil.copytree(WORKFLOWS_DIR, templates)
    gate = work / f"{name}-gate-open"
    sample = json.loads((templates / "ref-sample.json").read_text())
    sample["9"] = {"class_type": "H3TestGate", "inputs": {"conditioning": ["1", 0], "gate": str(gate)}}
    sample["2"]["inputs"]["conditioning"] = ["9", 0]
    (templates / "ref-sample.json").write_text(json.dumps(sample))
    return templates, gate


class Stopped(BaseException):
    """What Prefect raises in a stage's thread when its task timeout passes or its run is cancelled."""


@pytest.mark.parametrize("why", ["its own time limit", "stopped from outside"])
def test_a_prompt_nobody_waits_for_is_taken_off_comfyui(
    server: ComfyServer, pipeline: dict[str, Any], work: Path, why: str
) -> None:
    templates, _gate = _gated_templates(work, f"abandon-{len(why)}")  # the gate never opens
    submitted: list[str] = []

    def on_event(event: dict[str, Any]) -> None:
        if event.get("type") == "executing" and event.get("node") == "9":
            submitted.append(str(event.get("prompt_id")))
            if why == "stopped from outside":
                raise Stopped("the stage's deadline passed")

    engine = ComfyEngine(server.url, templates_dir=templates, on_event=on_event, retries=0, timeout=4)
    with pytest.raises(Stopped if why == "stopped from outside" else TransientError):
        engine.sample(pipeline["clip"], pipeline["cond"], work / "abandoned" / "c01.h3latent")
    assert submitted, "the prompt reached the gate"
    pid = submitted[0]
    deadline = time.monotonic() + 60
    entry = None
    while time.monotonic() < deadline and entry is None:  # ComfyUI notices at the node's next step
        entry = httpx.get(f"{server.url}/history/{pid}", timeout=10).json().get(pid)
        time.sleep(0 if entry else 0.1)  # a poll of ComfyUI's record, not a wait standing in for one
    assert entry is not None, "ComfyUI still runs the prompt nobody waits for"
    kinds = [kind for kind, _data in entry["status"]["messages"]]
    assert "execution_interrupted" in kinds and entry["status"]["status_str"] == "error", entry["status"]
    queue = httpx.get(f"{server.url}/queue", timeout=10).json()
    assert queue["queue_running"] == [] and queue["queue_pending"] == [], queue


def test_restart_mid_run_is_survived_by_retry(server: ComfyServer, pipeline: dict[str, Any], work: Path) -> None:
    """ComfyUI dies while the sample stage runs; the engine resubmits once it is back."""
    templates, gate = _gated_templates(work, "templates")

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
