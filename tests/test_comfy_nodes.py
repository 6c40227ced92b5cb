"""The node pack's plain functions, without a ComfyUI server (fast tier).

The A6 loader's placement and offload run here on CPU with a small stand-in for the
Qwen3-VL module tree. What cannot run here: placement on real GPUs (four T10s) with
the 32B weights, and activation transfers between distinct CUDA devices; the CPU
stand-in checks the partition, the hooks, and the keep/free logic of the offload.
"""

from __future__ import annotations

import enum
import gc
import os
import weakref
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torch import nn
from typer.testing import CliRunner

from h3flow.cli import app
from h3flow.core.errors import H3FlowError, IntegrityError
from h3flow.core.fsutil import sha256_file
from h3flow.core.specs import get_spec
from h3flow.engines.comfy_client import execution_error_message, summarize_node_errors
from h3flow.reference.conditioning import Conditioning, encode_conditioning, load_conditioning
from h3flow_nodes import common, multigpu
from h3flow_nodes.comfy_clip import clip_type_of

REPO = Path(__file__).resolve().parent.parent


# --------------------------------------------------------------------------- a stand-in encoder
class Decoder(nn.Module):
    def __init__(self, dim: int, n_layers: int) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(50, dim)
        self.layers = nn.ModuleList(nn.Linear(dim, dim) for _ in range(n_layers))
        self.norm = nn.LayerNorm(dim)
        self.register_buffer("rope", torch.arange(dim, dtype=torch.float32))


class StandInQwen3VL(nn.Module):
    """Qwen3-VL's shape in ComfyUI: ``transformer.visual`` beside ``transformer.model``."""

    def __init__(self, dim: int = 16, n_layers: int = 6) -> None:
        super().__init__()
        self.visual = nn.Sequential(nn.Linear(12, dim), nn.GELU(), nn.Linear(dim, dim))
        self.model = Decoder(dim, n_layers)

    def forward(self, ids: torch.Tensor, pixels: torch.Tensor) -> torch.Tensor:
        vis = self.visual(pixels)
        x = self.model.embed_tokens(ids)
        x = torch.cat([vis.to(x.device), x], dim=1)
        for layer in self.model.layers:
            x = torch.tanh(layer(x))
        return self.model.norm(x)


class StandInClip(nn.Module):
    """ComfyUI's SD1ClipModel wraps the model as ``<model_type>.transformer``."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.qwen3vl_32b = nn.Module()
        self.qwen3vl_32b.transformer = StandInQwen3VL()

    def forward(self, ids: torch.Tensor, pixels: torch.Tensor) -> torch.Tensor:
        with torch.inference_mode():  # as ComfyUI encodes: no autograd graph holding the weights
            return self.qwen3vl_32b.transformer(ids, pixels)


INPUTS = (torch.tensor([[1, 2, 3, 4]]), torch.ones(1, 2, 12))


def test_encoder_units_in_execution_order() -> None:
    names = [name for name, _ in multigpu.encoder_units(StandInClip())]
    t = "qwen3vl_32b.transformer"
    assert names == [
        f"{t}.visual",
        f"{t}.model.embed_tokens",
        *[f"{t}.model.layers.{i}" for i in range(6)],
        f"{t}.model.norm",
    ]


def test_unrecognised_tree_is_a_clear_error() -> None:
    with pytest.raises(H3FlowError, match="text encoder layout not recognised"):
        multigpu.encoder_units(nn.Sequential(nn.Linear(2, 2)))


def test_placement_follows_free_memory_and_keeps_results() -> None:
    clip = StandInClip()
    expected = clip(*INPUTS)
    units = multigpu.encoder_units(clip)
    sizes = [multigpu.module_bytes(m) for _, m in units]
    # GPU 1 has a third of GPU 0's free memory: it must get fewer bytes.
    free = [3 * sum(sizes), sum(sizes)]
    placement = multigpu.place_units(clip, ["cpu", "cpu"], free)
    assert list(placement.partition.assignment) == sorted(placement.partition.assignment)
    assert placement.partition.load[1] < placement.partition.load[0]
    assert placement.partition.load[0] / free[0] == pytest.approx(
        placement.partition.max_fill
    ) or placement.partition.load[1] / free[1] == pytest.approx(placement.partition.max_fill)
    assert len(placement.handles) == len(units) == len(placement.devices)
    torch.testing.assert_close(clip(*INPUTS), expected, rtol=0, atol=0)
    placement.remove_hooks()
    assert placement.handles == []


def test_pre_hooks_move_nested_inputs() -> None:
    value = {"x": torch.zeros(2, dtype=torch.float64), "rest": [torch.ones(1), (torch.ones(1), 3)], "n": None}
    moved = multigpu._move(value, torch.device("cpu"))
    assert moved["x"] is value["x"]  # already there: no copy
    assert moved["rest"][1][1] == 3 and moved["n"] is None


def _encoder(retain: bool | None) -> tuple[multigpu.MultiGPUEncoder, list[int]]:
    loads: list[int] = []

    def load() -> nn.Module:
        loads.append(1)
        return StandInClip()

    encoder = multigpu.MultiGPUEncoder(
        load, ["cpu", "cpu"], free_bytes=lambda devs: [1 << 30] * len(devs), retain=retain
    )
    return encoder, loads


def test_offload_keeps_the_cpu_copy_with_retain(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(multigpu.RETAIN_ENV, "1")
    encoder, loads = _encoder(None)
    assert encoder.retain is True
    first = encoder.ensure_placed()
    before = {k: v.clone() for k, v in first.state_dict().items()}
    out1 = first(*INPUTS)
    result = encoder.offload()
    assert result.kept_cpu_copy is True and result.freed_device_bytes == 0  # nothing was on an accelerator here
    assert encoder.state == "cpu"
    assert all(v.device.type == "cpu" for v in first.state_dict().values())
    second = encoder.ensure_placed()  # the next clip: from RAM, not from disk
    assert second is first and len(loads) == 1 and encoder.state == "placed"
    assert all(torch.equal(before[k], v) for k, v in second.state_dict().items())
    torch.testing.assert_close(second(*INPUTS), out1, rtol=0, atol=0)


def test_offload_frees_the_weights_without_retain(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(multigpu.RETAIN_ENV, raising=False)
    encoder, loads = _encoder(None)
    assert encoder.retain is False
    first = encoder.ensure_placed()
    out1 = first(*INPUTS)
    weight = weakref.ref(first.qwen3vl_32b.transformer.model.layers[0].weight)
    result = encoder.offload()
    assert result.kept_cpu_copy is False and encoder.state == "freed" and encoder.module is None
    gc.collect()
    assert weight() is None or weight().device.type == "meta"  # the CPU weights are gone, not copied
    assert all(p.device.type == "meta" for p in first.parameters())
    second = encoder.ensure_placed()  # the next clip reloads from disk
    assert second is not first and len(loads) == 2
    torch.testing.assert_close(second(*INPUTS), out1, rtol=0, atol=0)
    assert encoder.offload().kept_cpu_copy is False
    assert encoder.offload().freed_device_bytes == 0  # offloading twice is harmless


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA/ROCm GPU (none on the CPU test machine)")
def test_placement_and_offload_across_a_gpu_and_the_cpu() -> None:
    """Where a GPU exists: activations really cross devices, and offload empties the GPU."""
    reference = StandInClip()
    expected = reference(*INPUTS)
    encoder = multigpu.MultiGPUEncoder(
        StandInClip, ["cuda:0", "cpu"], free_bytes=lambda devs: [1 << 20, 1 << 20], retain=True
    )
    placed = encoder.ensure_placed()
    on_gpu = encoder.placement.partition.load[0]
    assert on_gpu > 0 and {d.type for d in encoder.placement.devices.values()} == {"cuda", "cpu"}
    torch.testing.assert_close(placed(*INPUTS).cpu(), expected, rtol=1e-4, atol=1e-4)
    cuda_bytes = sum(t.numel() * t.element_size() for t in [*placed.parameters(), *placed.buffers()] if t.is_cuda)
    assert cuda_bytes >= on_gpu  # the units' share plus the tensors outside every unit (rope table)
    result = encoder.offload()
    assert result.freed_device_bytes == cuda_bytes and result.kept_cpu_copy
    assert torch.cuda.memory_allocated(0) == 0


def test_parse_gpus() -> None:
    assert multigpu.parse_gpus("0,2", 4) == [torch.device("cuda", 0), torch.device("cuda", 2)]
    assert len(multigpu.parse_gpus("", 3)) == 3
    for bad in ("0,0", "4", "a", ""):
        with pytest.raises(H3FlowError, match="gpus"):
            multigpu.parse_gpus(bad, 0 if bad == "" else 4)


# --------------------------------------------------------------------------- conditioning files
def comfy_style_conditioning() -> list:
    """What upstream's MiniMaxH3ImageToVideo returns: [[cond, {pooled, keyframes...}]]."""
    g = torch.Generator().manual_seed(1)
    return [
        [
            torch.randn(1, 7, 8, generator=g),
            {
                "pooled_output": None,
                "minimax_keyframes": [{"resolved_frame_index": 0, "latent": torch.randn(1, 24, 1, 2, 3, generator=g)}],
                "area": (1, 2, 3, 4),
                "strength": 0.75,
                "label": "first",
                "av": common.NestedLatent((torch.zeros(1, 24, 2, 2, 2), torch.ones(1, 32, 2, 4))),
            },
        ]
    ]


def test_structured_conditioning_round_trip(tmp_path: Path) -> None:
    cond = comfy_style_conditioning()
    sha = common.save_conditioning_any(tmp_path / "c.safetensors", cond)
    assert sha == sha256_file(tmp_path / "c.safetensors")
    back = common.load_conditioning_any(tmp_path / "c.safetensors", sha)
    assert isinstance(back, list) and len(back) == 1 and len(back[0]) == 2
    tensor, extra = back[0]
    assert torch.equal(tensor, cond[0][0])
    assert set(extra) == set(cond[0][1])
    assert extra["pooled_output"] is None and extra["strength"] == 0.75 and extra["label"] == "first"
    assert extra["area"] == (1, 2, 3, 4) and isinstance(extra["area"], tuple)
    kf = extra["minimax_keyframes"][0]
    assert kf["resolved_frame_index"] == 0 and torch.equal(kf["latent"], cond[0][1]["minimax_keyframes"][0]["latent"])
    assert extra["av"].is_nested and [tuple(t.shape) for t in extra["av"].tensors] == [(1, 24, 2, 2, 2), (1, 32, 2, 4)]


def test_structured_conditioning_bytes_are_deterministic(tmp_path: Path) -> None:
    shas = {common.save_conditioning_any(tmp_path / f"c{i}.safetensors", comfy_style_conditioning()) for i in range(4)}
    assert len(shas) == 1


def test_structured_conditioning_refuses_objects_and_tampering(tmp_path: Path) -> None:
    cond = comfy_style_conditioning()
    cond[0][1]["control"] = object()
    with pytest.raises(H3FlowError, match=r"conditioning\[0\]\[1\]\.control: a object cannot be saved"):
        common.save_conditioning_any(tmp_path / "x.safetensors", cond)
    assert not (tmp_path / "x.safetensors").exists()
    sha = common.save_conditioning_any(tmp_path / "c.safetensors", comfy_style_conditioning())
    data = bytearray((tmp_path / "c.safetensors").read_bytes())
    data[-1] ^= 0x01
    (tmp_path / "c.safetensors").write_bytes(bytes(data))
    with pytest.raises(IntegrityError, match="expected " + sha):
        common.load_conditioning_any(tmp_path / "c.safetensors", sha)


def test_reference_conditioning_goes_through_its_own_format(tmp_path: Path, png: Path) -> None:
    """An IMAGE (as LoadImage makes it) encodes to the same conditioning as the file does in the local engine."""
    image = torch.from_numpy(np.asarray(Image.open(png).convert("RGB"), dtype=np.float32) / 255.0)[None]
    cond = common.reference_encode(image, "zoom in on a sunny meadow", "tiny", 22)
    assert isinstance(cond, Conditioning)
    from_file = encode_conditioning("zoom in on a sunny meadow", png, get_spec("tiny"), 22)
    assert from_file.meta == cond.meta
    assert all(torch.equal(from_file.tensors()[k], v) for k, v in cond.tensors().items())
    sha = common.save_conditioning_any(tmp_path / "r.safetensors", cond)
    back = common.load_conditioning_any(tmp_path / "r.safetensors", sha)
    plain = load_conditioning(tmp_path / "r.safetensors", sha)  # readable by the local engine as is
    for name, tensor in cond.tensors().items():
        assert torch.equal(back.tensors()[name], tensor) and torch.equal(plain.tensors()[name], tensor)
    assert back.meta["frames"] == "22" and back.meta["spec"] == "tiny"


@pytest.fixture
def png(tmp_path: Path) -> Path:
    path = tmp_path / "ref.png"
    Image.new("RGB", (64, 40), (200, 120, 40)).save(path)
    return path


# --------------------------------------------------------------------------- latents
class ForeignNested:
    """Not h3flow's class: the handoff must duck-type any (.is_nested, .tensors) pair."""

    is_nested = True

    def __init__(self, *tensors: torch.Tensor) -> None:
        self.tensors = tensors


def av_pair(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(1, 24, 2, 8, 14, generator=g), torch.randn(1, 32, 2, 37, generator=g)


def test_latent_streams_accepts_plain_and_nested() -> None:
    video, audio = av_pair()
    assert common.latent_streams(video)[1] is None
    v, a = common.latent_streams(ForeignNested(video, audio))
    assert v is video and a is audio
    with pytest.raises(H3FlowError, match="pair"):
        common.latent_streams(ForeignNested(video))
    with pytest.raises(H3FlowError, match="not a latent"):
        common.latent_streams([video])
    rebuilt = common.make_samples(video, audio)  # no comfy.nested_tensor here: h3flow's stand-in
    assert rebuilt.is_nested and rebuilt.unbind() == [video, audio]


def test_handoff_round_trip_and_verify(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("H3FLOW_NODES_ALLOWED_DIRS", str(tmp_path))  # the load node's fingerprint resolves the path
    video, audio = av_pair(3)
    path = tmp_path / "a.h3latent"
    sha = common.save_handoff(ForeignNested(video, audio), path, common.parse_meta('{"clip_id": "c1", "seed": 3}'))
    ref = common.file_ref(path, sha, "latent")
    assert ref["kind"] == "latent" and ref["sha256"] == sha256_file(path) and ref["size"] > 0
    samples, meta, masks = common.load_handoff(path, sha)
    latent = common.latent_from_handoff(samples, meta, masks)
    v, a = common.latent_streams(latent["samples"])
    assert torch.equal(v, video) and torch.equal(a, audio) and "noise_mask" not in latent
    assert latent["h3flow_meta"]["clip_id"] == "c1" and latent["h3flow_meta"]["seed"] == "3"
    assert common.file_fingerprint(str(path)) == sha  # load nodes fingerprint the content
    with pytest.raises(IntegrityError, match="expected " + "0" * 64):
        common.load_handoff(path, "0" * 64)
    # a plain (video-only) latent is accepted too
    plain = common.save_handoff(video, tmp_path / "p.h3latent", {})
    back, _, _ = common.load_handoff(tmp_path / "p.h3latent", plain)
    assert torch.equal(back, video)


def test_noise_masks_plain_and_nested_are_kept_never_dropped(tmp_path: Path) -> None:
    video, audio = av_pair(4)
    plain_mask = torch.rand(1, 1, 2, 8, 14)
    nested_mask = ForeignNested(torch.rand(1, 1, 2, 8, 14), torch.rand(1, 1, 2, 37))
    for name, mask in (("plain", plain_mask), ("nested", nested_mask)):
        latent = {"samples": ForeignNested(video, audio), "noise_mask": mask}
        path = tmp_path / f"{name}.h3latent"
        sha = common.save_handoff(latent["samples"], path, {}, common.handoff_masks(latent))
        back = common.latent_from_handoff(*common.load_handoff(path, sha))
        if name == "plain":
            assert torch.equal(back["noise_mask"], plain_mask)
        else:  # rebuilt as a nested (video, audio) mask
            assert back["noise_mask"].is_nested
            assert all(torch.equal(x, y) for x, y in zip(back["noise_mask"].unbind(), nested_mask.tensors, strict=True))
    for bad in (ForeignNested(torch.rand(1, 1, 2, 8, 14)), [torch.rand(2)], "mask"):
        with pytest.raises(H3FlowError, match=r"noise_mask: a .* cannot be saved"):
            common.handoff_masks({"samples": video, "noise_mask": bad})
    assert common.handoff_masks({"samples": video}) == {}


def test_clip_type_lookup_falls_back_to_values_and_fails_clearly() -> None:
    class CLIPType(enum.Enum):  # the shape of comfy.sd.CLIPType
        STABLE_DIFFUSION = 1
        MINIMAX = 30

    class Older(enum.Enum):
        STABLE_DIFFUSION = 1
        WAN = 2

    assert clip_type_of(CLIPType, "minimax") is CLIPType.MINIMAX
    assert clip_type_of(CLIPType, " Minimax ") is CLIPType.MINIMAX

    class ByValue(enum.Enum):
        H3 = "minimax"

    assert clip_type_of(ByValue, "minimax") is ByValue.H3
    with pytest.raises(
        H3FlowError,
        match=r"this ComfyUI has no CLIP type 'minimax' \(it knows: stable_diffusion, wan\); update ComfyUI",
    ):
        clip_type_of(Older, "minimax")


def test_relative_paths_stay_in_the_output_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert common.resolve_path("h3flow/x.h3latent") == (tmp_path / "output" / "h3flow" / "x.h3latent").resolve()
    with pytest.raises(H3FlowError, match="leaves ComfyUI's output folder"):
        common.resolve_path("../../etc/passwd")
    with pytest.raises(H3FlowError, match="required"):
        common.resolve_path("  ")


def test_absolute_paths_only_inside_comfyuis_folders_and_the_configured_stores(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ComfyUI on a network takes prompts from any client: a save node must not write the
    ComfyUI user's other files, a load node must not read them."""
    from h3flow_nodes.paths import ALLOWED_ENV

    monkeypatch.chdir(tmp_path)  # outside ComfyUI, the output folder is ./output
    monkeypatch.delenv(ALLOWED_ENV, raising=False)
    inside = tmp_path / "output" / "h3flow" / "x.h3latent"
    assert common.resolve_path(str(inside)) == inside.resolve()
    store = tmp_path / "store"
    elsewhere = str(tmp_path / "home" / ".bashrc")
    with pytest.raises(H3FlowError) as err:
        common.resolve_path(elsewhere)
    assert str(err.value) == (
        f"path {elsewhere!r} is outside the folders the h3flow nodes may use (ComfyUI's output, input and temp "
        f"folders, and ${ALLOWED_ENV}: not set)"
    )
    with pytest.raises(H3FlowError, match="outside the folders"):
        common.resolve_path(str(store / "latents" / "a.h3latent"))
    monkeypatch.setenv(ALLOWED_ENV, f"{store}{os.pathsep}{tmp_path / 'outputs'}")
    assert common.resolve_path(str(store / "latents" / "a.h3latent")) == (store / "latents" / "a.h3latent").resolve()
    assert common.resolve_path(str(tmp_path / "outputs" / "c.mp4")) == (tmp_path / "outputs" / "c.mp4").resolve()
    with pytest.raises(H3FlowError, match=f"{ALLOWED_ENV}: {store}{os.pathsep}"):
        common.resolve_path(elsewhere)
    with pytest.raises(H3FlowError, match="outside the folders"):
        common.resolve_path(str(store))  # the folder itself is not a file in it
    with pytest.raises(H3FlowError, match="outside the folders"):
        common.resolve_path(str(store / ".." / "home" / "x"))  # no way out through ..
    (store / "links").mkdir(parents=True)
    (store / "links" / "out").symlink_to(tmp_path / "home", target_is_directory=True)
    with pytest.raises(H3FlowError, match="outside the folders"):
        common.resolve_path(str(store / "links" / "out" / ".bashrc"))  # nor through a symlink


def test_meta_input_must_be_a_json_object() -> None:
    assert common.parse_meta('{"seed": 3, "clip_id": "c"}') == {"seed": "3", "clip_id": "c"}
    with pytest.raises(H3FlowError, match="JSON object"):
        common.parse_meta("[1]")
    with pytest.raises(H3FlowError, match="JSON object"):
        common.parse_meta("{seed")


def test_audio_is_resampled_to_48k_stereo() -> None:
    t = torch.arange(32000) / 32000
    mono = torch.sin(2 * torch.pi * 440 * t)[None]
    out = common.stereo_at(mono, 32000, 48000)
    assert out.shape[0] == 2 and abs(out.shape[1] - 48000) <= 64
    spectrum = torch.fft.rfft(out[0, 4000:44000])
    assert abs(int(spectrum.abs().argmax()) * 48000 / 40000 - 440) < 2


# --------------------------------------------------------------------------- client messages
def test_error_messages_name_the_node() -> None:
    errors = {
        "3": {
            "class_type": "H3ReferenceEncode",
            "errors": [{"message": "Value not in list", "details": "spec: 'xx' not in ['sd', 'hd', 'tiny']"}],
        }
    }
    assert (
        summarize_node_errors(errors)
        == "node 3 (H3ReferenceEncode): Value not in list: spec: 'xx' not in ['sd', 'hd', 'tiny']"
    )
    msg = execution_error_message(
        {
            "node_id": "1",
            "node_type": "H3LatentHandoffLoad",
            "exception_type": "h3flow_nodes.errors.IntegrityError",
            "exception_message": "latent x has SHA-256 a, expected b\n",
        },
        "http://127.0.0.1:1",
    )
    assert (
        msg
        == "ComfyUI at http://127.0.0.1:1: node 1 (H3LatentHandoffLoad) failed: IntegrityError: latent x has SHA-256 a, expected b"
    )


# --------------------------------------------------------------------------- h3flow nodes install
def test_nodes_install_is_idempotent(tmp_path: Path) -> None:
    comfy = tmp_path / "ComfyUI"
    comfy.mkdir()
    (comfy / "main.py").write_text("# stand-in\n")
    runner = CliRunner()
    first = runner.invoke(app, ["nodes", "install", "--comfy-dir", str(comfy)])
    assert first.exit_code == 0, first.output
    assert "h3flow_nodes: installed" in first.output
    pack = comfy / "custom_nodes" / "h3flow_nodes"
    assert (pack / "__init__.py").read_bytes() == (REPO / "comfy_nodes" / "h3flow_nodes" / "__init__.py").read_bytes()
    again = runner.invoke(app, ["nodes", "install", "--comfy-dir", str(comfy)])
    assert again.exit_code == 0 and "h3flow_nodes: unchanged" in again.output
    (pack / "nodes.py").write_text("# edited by hand\n")
    (pack / "stray.py").write_text("x = 1\n")
    fixed = runner.invoke(app, ["nodes", "install", "--comfy-dir", str(comfy)])
    assert "h3flow_nodes: updated" in fixed.output
    assert (pack / "nodes.py").read_bytes() == (REPO / "comfy_nodes" / "h3flow_nodes" / "nodes.py").read_bytes()
    assert not (pack / "stray.py").exists()
    assert sorted(p.name for p in (comfy / "custom_nodes").iterdir()) == ["h3flow_nodes"]  # no leftovers
    linked = runner.invoke(app, ["nodes", "install", "--comfy-dir", str(comfy), "--link"])
    assert (
        "updated" in linked.output
        and pack.is_symlink()
        and pack.resolve() == (REPO / "comfy_nodes" / "h3flow_nodes").resolve()
    )
    assert "unchanged" in runner.invoke(app, ["nodes", "install", "--comfy-dir", str(comfy), "--link"]).output


def test_nodes_install_errors_are_one_line(tmp_path: Path) -> None:
    runner = CliRunner()
    not_comfy = runner.invoke(app, ["nodes", "install", "--comfy-dir", str(tmp_path)])
    assert (
        not_comfy.exit_code == 2
        and "is not a ComfyUI folder" in not_comfy.output
        and "Traceback" not in not_comfy.output
    )
    host = runner.invoke(app, ["nodes", "install", "--host", "a0", "--config", str(tmp_path / "local.json")])
    assert host.exit_code == 2 and "local.json: no such file" in host.output  # --host: tests/test_remote_ops.py
    missing = runner.invoke(app, ["nodes", "install", "--comfy-dir", str(tmp_path / "nope")])
    assert missing.exit_code == 2 and "no such folder" in missing.output
