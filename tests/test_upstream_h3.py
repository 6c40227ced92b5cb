"""The real MiniMax H3 code in the loop: the production templates executed by ComfyUI 0.33's
own H3 nodes and model code, with tiny weights, on CPU.

- The server: ComfyUI 0.33.0 (upstream 783545f6, from ``../shared/upstream``; see
  h3flow/ops/comfy_install.py), the h3flow node pack, two test nodes (tests/h3_test_nodes.py)
  and tiny H3 checkpoints made at test time from upstream's own classes
  (tests/tiny_h3.py: DiT + LoRA + int8 video VAE + audio VAE, cached by content).
- What runs for real: ``EmptyMiniMaxH3LatentAV``, ``MiniMaxH3ImageToVideo`` (first-frame
  keyframe through the real video VAE encoder), ``UNETLoader`` + ``LoraLoaderModelOnly`` +
  ``KSamplerAdvanced`` on the H3 DiT, ``VAEDecode`` / ``VAEDecodeAudio`` on the nested AV
  latent, and h3flow's handoff / conditioning / AAC nodes, through h3flow's ``comfy`` engine.
- The one fake: the 32B Qwen3-VL encoder (``H3TestTinyTextEncoder`` stands in for
  ``H3MultiGPUCLIPLoader``; see tests/h3_test_nodes.py for what it keeps real). Raylight
  (``h3-sample.json``) needs CUDA and xDiT: that template is checked against the live
  ``/object_info`` for every node ComfyUI has, and against the transcription of
  Raylight's source for its four nodes.

Decode runs at 32×32, 5 frames: the smallest canvas and length ``EmptyMiniMaxH3LatentAV``
accepts. The real video VAE's decoder is a 2.4 B-parameter ViT whatever the weights: through
ComfyUI on 2 CPU cores a decode of the ``tiny`` spec (224×128, 5 frames) took 58 s against
15 s at 32×32, and longer clips decode in more 17-frame chunks (docs/comfyui.md).
Sampling runs at the ``tiny`` spec through ``ComfyEngine.encode`` / ``sample``, exactly as
the pipeline calls them.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from fractions import Fraction
from pathlib import Path
from typing import Any

import av
import numpy as np
import pytest
import torch
from PIL import Image
from tiny_h3 import DIT_CONFIG, TEXT_DIM, TinyH3, install_models, tiny_h3
from typer.testing import CliRunner
from upstream import comfyui_install

from h3flow.cli import app
from h3flow.core.batch import Clip
from h3flow.core.errors import H3FlowError
from h3flow.core.fsutil import sha256_file
from h3flow.core.specs import SPECS, get_spec
from h3flow.engines.comfy import ComfyEngine
from h3flow.engines.workflows import WORKFLOWS_DIR, load_template, render, upstream_object_info, validate_prompt
from h3flow.handoff.format import load_latent
from h3flow.ops.comfy_install import ComfyInstall, ComfyServer, prepare_base_dir
from h3flow_nodes.common import load_conditioning_any
from h3flow_nodes.paths import ALLOWED_ENV

pytestmark = [pytest.mark.comfy, pytest.mark.upstream_h3]

TEST_NODES = Path(__file__).with_name("h3_test_nodes.py")
STAND_IN = "H3TestTinyTextEncoder"
RAYLIGHT = ("RayInitializer", "RayLoraLoader", "RayUNETLoader", "XFuserKSamplerAdvanced")
SMALLEST = {"width": 32, "height": 32, "length": 5}  # what EmptyMiniMaxH3LatentAV's minimums allow


@pytest.fixture(scope="module")
def install() -> ComfyInstall:
    return comfyui_install()


@pytest.fixture(scope="module")
def tiny(install: ComfyInstall) -> TinyH3:
    return tiny_h3(install)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, install: ComfyInstall, tiny: TinyH3, work: Path) -> Any:
    base = prepare_base_dir(tmp_path_factory.mktemp("h3-base"))
    result = CliRunner().invoke(app, ["nodes", "install", "--comfy-dir", str(base)])
    assert result.exit_code == 0, result.output
    shutil.copyfile(TEST_NODES, base / "custom_nodes" / TEST_NODES.name)
    install_models(tiny, base)
    srv = ComfyServer(install, base, env={ALLOWED_ENV: str(work)})  # the engine's files go to the work folder
    srv.start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def templates(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """workflows/ with one change: h3-encode's encoder loader is the stand-in (same inputs)."""
    folder = tmp_path_factory.mktemp("templates")
    shutil.copytree(WORKFLOWS_DIR, folder, dirs_exist_ok=True)
    encode = json.loads((folder / "h3-encode.json").read_text())
    assert encode["2"]["class_type"] == "H3MultiGPUCLIPLoader"
    encode["2"]["class_type"] = STAND_IN
    (folder / "h3-encode.json").write_text(json.dumps(encode))
    return folder


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("h3-work")
    rng = np.random.default_rng(3)
    gradient = np.linspace(0, 255, 300, dtype=np.float32)[None, :, None]
    pixels = np.clip(gradient + rng.normal(0, 25, (180, 300, 3)), 0, 255).astype(np.uint8)
    Image.fromarray(pixels).save(root / "lake.png")
    return root


@pytest.fixture(scope="module")
def engine(server: ComfyServer, templates: Path, tiny: TinyH3) -> ComfyEngine:
    """The single-GPU production template set (h3-encode, h3-sample-xtx, h3-decode) on the tiny files."""
    return ComfyEngine(server.url, reference=False, variant="xtx", templates_dir=templates, params=tiny.params)


def report_latent(engine: ComfyEngine, node: dict[str, Any]) -> dict[str, Any]:
    """What the test report node says about the LATENT ``node`` makes (run on the server)."""
    out = engine.client.run({"1": node, "2": {"class_type": "H3TestLatentReport", "inputs": {"samples": ["1", 0]}}})
    return dict(out.outputs["2"]["h3flow_test"][0])


def conditioning_summary(path: Path) -> dict[str, Any]:
    """The saved conditioning's structure: hidden states, token tags, keyframes (read with safetensors)."""
    ((cond, extra),) = load_conditioning_any(path, None)
    tags = extra["minimax_token_tags"]
    return {
        "cond": list(cond.shape),
        "tags": list(tags.shape),
        "tag_values": sorted(set(tags.tolist())),
        "vision_rows": int((tags == 0).sum()),
        "keyframes": [(kf["resolved_frame_index"], list(kf["latent"].shape)) for kf in extra["minimax_keyframes"]],
        "pooled": extra["pooled_output"],
    }


# --------------------------------------------------------------------------- the checkpoints and the server
def test_tiny_checkpoints_are_detected_as_minimax_h3_by_upstream(tiny: TinyH3, server: ComfyServer) -> None:
    detected = tiny.report["dit_detected"]
    assert detected == {**DIT_CONFIG, "image_model": "minimax_h3", "latents_dim": 24, "audio_latents_dim": 32,
                        "rope_inv_freq_len": 16}  # fmt: skip
    assert tiny.report["lora_layers"] == 12  # qkv, out, fc1, fc2 of 2 blocks + 1 refiner block
    assert tiny.report["video_vae_parameters"] > 2_500_000_000 and tiny.report["video_vae_int8_layers"] == 144
    live = ComfyEngine(server.url).client.object_info()
    for node, name in (("UNETLoader", "unet_name"), ("LoraLoaderModelOnly", "lora_name"), ("VAELoader", "vae_name")):
        options = live[node]["input"]["required"][name][0]
        assert any(str(o).startswith("h3flow_tiny_minimax_h3_") for o in options), (node, options)
    for h3_node in ("EmptyMiniMaxH3LatentAV", "MiniMaxH3ImageToVideo", "MiniMaxH3AddGuide", "MiniMaxH3SigmaShift"):
        assert live[h3_node]["python_module"] == "comfy_extras.nodes_minimax_h3", h3_node


# --------------------------------------------------------------------------- 4: our latent layout against theirs
@pytest.mark.parametrize("spec_name", list(SPECS))
def test_empty_h3_latent_has_the_layout_h3flow_and_the_reference_model_use(engine: ComfyEngine, spec_name: str) -> None:
    from h3flow.core.specs import snap_frames
    from h3flow.reference.conditioning import encode_pixels
    from h3flow.reference.sampler import sample_latent

    spec = get_spec(spec_name)
    for length in (5, 22, 124, 125):
        frames = snap_frames(length)
        node = {"class_type": "EmptyMiniMaxH3LatentAV",
                "inputs": {"width": spec.width, "height": spec.height, "length": length}}  # fmt: skip
        theirs = report_latent(engine, node)
        ours = [list(spec.video_shape(frames)), list(spec.audio_shape(frames))]
        assert theirs["type"] == "NestedTensor" and theirs["nested"], theirs
        assert theirs["shapes"] == ours, (
            f"{spec_name}, length {length}: EmptyMiniMaxH3LatentAV gives {theirs['shapes']}, h3flow's spec {ours}"
        )
    # the reference model's sampler (what the embedded default produces) at the default length
    pixels = np.zeros((spec.height, spec.width, 3), dtype=np.uint8)
    video, audio = sample_latent(encode_pixels("static", pixels, spec, 124), seed=1, steps=1)
    reference = [list(video.shape), list(audio.shape)]
    theirs = report_latent(engine, {"class_type": "EmptyMiniMaxH3LatentAV",
                                    "inputs": {"width": spec.width, "height": spec.height, "length": 124}})  # fmt: skip
    assert theirs["shapes"] == reference, (
        f"{spec_name}, 124 frames: EmptyMiniMaxH3LatentAV gives {theirs['shapes']}, the reference model {reference}"
    )


# --------------------------------------------------------------------------- 3: the production templates, run
@pytest.fixture(scope="module")
def tiny_clip(work: Path) -> Clip:
    return Clip(id="h3-tiny", prompt="slow pan left over a calm lake", image=work / "lake.png", spec="tiny",
                seconds=1, seed=5, steps=4)  # fmt: skip


@pytest.fixture(scope="module")
def encoded(engine: ComfyEngine, tiny_clip: Clip, work: Path) -> Any:
    """h3-encode.json (the stand-in encoder for node 2) through ``ComfyEngine.encode``."""
    return engine.encode(tiny_clip, work / "tiny" / "c.cond.safetensors")


@pytest.fixture(scope="module")
def sampled(engine: ComfyEngine, tiny_clip: Clip, encoded: Any, work: Path) -> Any:
    """h3-sample-xtx.json through ``ComfyEngine.sample``: UNETLoader → LoRA → EmptyMiniMaxH3LatentAV → KSamplerAdvanced."""
    return engine.sample(tiny_clip, encoded, work / "tiny" / "c.h3latent")


def test_h3_encode_gives_the_conditioning_the_dit_expects(encoded: Any, engine: ComfyEngine) -> None:
    assert encoded.sha256 == sha256_file(encoded.path)
    summary = conditioning_summary(encoded.path)
    length = summary["cond"][1]
    # the first frame (224×128) is one vision block of 8×14 patches merged 2×2 = 28 rows, tagged 0 with its
    # <|vision_start|> / <|vision_end|>; "<Picture 1>: " and the prompt are text, tagged 1
    assert summary["cond"] == [1, length, TEXT_DIM] and summary["tags"] == [length] and length > 30
    assert summary["tag_values"] == [0, 1] and summary["vision_rows"] == 28 + 2
    assert summary["keyframes"] == [(0, [1, 24, 1, 8, 14])]  # MiniMaxH3ImageToVideo's first_frame, VAE-encoded
    assert summary["pooled"] is None
    assert engine.filled == []  # the template sets every input these nodes require


def test_h3_sample_xtx_makes_a_real_nested_av_latent(sampled: Any, tiny_clip: Clip, engine: ComfyEngine) -> None:
    latent = load_latent(sampled.path, sampled.sha256)
    spec = get_spec("tiny")
    assert tiny_clip.frames == 39
    assert (tuple(latent.video.shape), tuple(latent.audio.shape)) == (spec.video_shape(39), spec.audio_shape(39))
    assert torch.isfinite(latent.video).all() and torch.isfinite(latent.audio).all()
    assert latent.video.abs().mean() > 0.01 and latent.audio.abs().mean() > 0.01  # sampled, not the empty latent
    assert latent.meta["clip_id"] == "h3-tiny" and latent.meta["frames"] == "39"
    assert latent.meta["model"] == "h3flow_tiny_minimax_h3_dit.safetensors"
    # the same file read back by the handoff load node is upstream's NestedTensor again
    back = report_latent(engine, {"class_type": "H3LatentHandoffLoad",
                                  "inputs": {"path": str(sampled.path), "sha256": sampled.sha256}})  # fmt: skip
    assert back["type"] == "NestedTensor" and back["shapes"] == [list(latent.video.shape), list(latent.audio.shape)]
    assert back["sums"] == [float(latent.video.double().sum()), float(latent.audio.double().sum())]


def test_the_lora_is_applied(
    server: ComfyServer, templates: Path, tiny: TinyH3, tiny_clip: Clip, encoded: Any, sampled: Any, work: Path
) -> None:
    off = ComfyEngine(server.url, reference=False, variant="xtx", templates_dir=templates,
                      params={**tiny.params, "lora_strength": 0.0})  # fmt: skip
    without = load_latent(off.sample(tiny_clip, encoded, work / "tiny" / "no-lora.h3latent").path)
    with_lora = load_latent(sampled.path)
    assert not torch.equal(without.video, with_lora.video) and not torch.equal(without.audio, with_lora.audio)
    log = server.log_path.read_text(errors="replace")
    assert "lora key not loaded" not in log and "ERROR lora" not in log


@pytest.fixture(scope="module")
def smallest(engine: ComfyEngine, work: Path) -> dict[str, Any]:
    """Encode and sample at 32×32, 5 frames (the templates with the smallest canvas the H3 nodes accept)."""
    image = engine.client.upload_image(work / "lake.png", "lake-32.png")
    cond_path = work / "small" / "c.cond.safetensors"
    encode = engine.live_prompt("encode", {"image": image, "prompt": "static shot of a calm lake",
                                           "out_path": str(cond_path), **SMALLEST})  # fmt: skip
    engine.client.run(encode)
    latent_path = work / "small" / "c.h3latent"
    sample = engine.live_prompt("sample", {"cond_path": str(cond_path), "cond_sha256": sha256_file(cond_path),
                                           "seed": 9, "steps": 2, "out_path": str(latent_path), **SMALLEST})  # fmt: skip
    engine.client.run(sample)
    return {"cond": cond_path, "latent": latent_path}


def test_h3_decode_turns_the_latent_into_an_h264_aac_mp4(
    engine: ComfyEngine, smallest: dict[str, Any], work: Path
) -> None:
    from h3flow.core.files import FileRef
    from h3flow.media.mux import probe_mp4

    latent_path: Path = smallest["latent"]
    latent = load_latent(latent_path)
    assert [list(latent.video.shape), list(latent.audio.shape)] == [[1, 24, 2, 2, 2], [1, 32, 2, 8]]
    ref = FileRef(latent_path, sha256_file(latent_path), latent_path.stat().st_size)
    video = engine.decode(ref, work / "small" / "c.mp4")
    info = probe_mp4(video.path)
    assert (info.video_codec, info.pix_fmt, info.width, info.height) == ("h264", "yuv420p", 32, 32)
    assert info.frames == 5 and info.fps == 24  # 17k+5 frames from 2 latent frames: the VAE's temporal plan
    assert (info.audio_codec, info.sample_rate, info.channels) == ("aac", 48_000, 2)
    # the audio VAE gives 8 latent steps × 800 samples at 32 kHz (0.2 s); the mux pads it to the video's 5/24 s
    assert abs(info.audio_seconds - 5 / 24) < 1 / 24 and info.audio_rms > 0
    with av.open(str(video.path)) as container:
        frames = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
        assert container.streams.video[0].average_rate == Fraction(24)
    assert len(frames) == 5 and np.stack(frames).std() > 1  # decoded pixels, not a blank frame
    engine.offload()  # the 2.6 B-parameter VAE leaves the server's RAM for the tests after this one


# --------------------------------------------------------------------------- 3: the templates that cannot run here
def test_encode_and_raylight_templates_fit_the_live_server(server: ComfyServer, tiny: TinyH3) -> None:
    """h3-encode (the 32B encoder cannot run here) and h3-sample (Raylight needs CUDA and xDiT), checked
    for every spec: every node exists, every input is known, every value valid."""
    live = ComfyEngine(server.url).client.object_info()
    # ComfyUI's own nodes against this server; Raylight's four against the transcription of Raylight's
    # nodes.py (tests/test_upstream_schemas.py checks it against that source), as no Raylight runs here
    raylight = {k: v for k, v in upstream_object_info().items() if k in RAYLIGHT}
    assert not set(raylight) & set(live)
    for spec in SPECS.values():
        size = {"width": spec.width, "height": spec.height, "length": 124}
        encode = render(load_template("h3-encode"), {"image": "example.png", "prompt": "p", "out_path": "o",
                                                      "vae_name": tiny.params["vae_name"], **size})  # fmt: skip
        # the one value that cannot be valid here: the 32B encoder's file is not on this server
        assert validate_prompt(encode, live) == [
            "node 2 (H3MultiGPUCLIPLoader): input 'clip_name' value 'qwen3vl_32b_minimax_h3_int8_convrot.safetensors' "
            "not among the options []"
        ], spec.name
        sample = render(load_template("h3-sample"), {"cond_path": "c", "seed": 1, "out_path": "o", **size})
        assert {n["class_type"] for n in sample.values()} - set(live) == set(RAYLIGHT)
        assert validate_prompt(sample, {**live, **raylight}) == [], spec.name


def test_a_renamed_upstream_input_stops_the_stage(server: ComfyServer, templates: Path, tiny: TinyH3,
                                                  work: Path) -> None:  # fmt: skip
    """Point 8 on the real H3 node: a template still saying ``frames`` where upstream says ``length``."""
    drifted = work / "drifted-templates"
    shutil.copytree(templates, drifted, dirs_exist_ok=True)
    sample = json.loads((drifted / "h3-sample-xtx.json").read_text())
    sample["3"]["inputs"]["frames"] = sample["3"]["inputs"].pop("length")
    (drifted / "h3-sample-xtx.json").write_text(json.dumps(sample))
    engine = ComfyEngine(server.url, reference=False, variant="xtx", templates_dir=drifted, params=tiny.params)
    params = {"cond_path": "c", "seed": 1, "out_path": str(work / "never.h3latent"), "width": 32, "height": 32,
              "length": 5}  # fmt: skip
    with pytest.raises(H3FlowError) as err:
        engine.live_prompt("sample", params)
    assert str(err.value) == (
        f"ComfyUI at {server.url}: h3-sample-xtx: node 3 (EmptyMiniMaxH3LatentAV) sets input 'frames', which this "
        "ComfyUI's EmptyMiniMaxH3LatentAV does not have; its inputs: height, length, width. ComfyUI would run the "
        "node without that value: fix workflows/h3-sample-xtx.json"
    )
    assert not (work / "never.h3latent").exists()


# --------------------------------------------------------------------------- 5: the Turing patch on 0.33
def test_the_turing_patch_makes_the_t10_dtype_setup_run(install: ComfyInstall, tiny: TinyH3, tmp_path: Path) -> None:
    """A T10 stores H3's weights bf16 and computes fp32 (``unet_manual_cast``), and ComfyUI's default
    model patcher on NVIDIA (DynamicVRAM) loads with ``assign=True``, so the adaLN table keeps the
    checkpoint's bf16. Reproduced on CPU with the tiny DiT: upstream fails in the lerp, patched runs."""
    from h3flow.core.paths import PATCHES_DIR
    from h3flow.ops.patches import PATCH_FOR_TARGET, State, apply_patch, check_patch

    patch = PATCHES_DIR / PATCH_FOR_TARGET["comfy"]
    patched = tmp_path / "patched"
    shutil.copytree(install.tree, patched)
    assert check_patch(patch, patched).state is State.NOT_APPLIED
    assert apply_patch(patch, patched).changed and check_patch(patch, patched).state is State.APPLIED

    def forward(tree: Path, setup: str) -> subprocess.CompletedProcess[str]:
        script = Path(__file__).with_name("tiny_h3_turing.py")
        args = [str(install.python), str(script), str(tree), str(tiny.path("dit.safetensors")), setup]
        return subprocess.run(args, capture_output=True, text=True, timeout=600)

    upstream_t10 = forward(install.tree, "t10")
    assert upstream_t10.returncode != 0
    assert "expected dtype c10::BFloat16 for `weight` but got dtype float" in upstream_t10.stderr
    patched_t10 = forward(patched, "t10")
    assert patched_t10.returncode == 0, patched_t10.stderr[-2000:]
    reference = forward(install.tree, "fp32")  # the same model in fp32, no patch needed
    assert reference.returncode == 0, reference.stderr[-2000:]
    t10, fp32 = json.loads(patched_t10.stdout), json.loads(reference.stdout)
    assert t10["dtypes"] == {"weights": "torch.bfloat16", "compute": "torch.float32", "adaln_t_table": "torch.bfloat16"}
    for got, want in zip(t10["means"], fp32["means"], strict=True):  # bf16 weights: close to fp32, not equal
        assert got == pytest.approx(want, rel=0.05) and got != want
