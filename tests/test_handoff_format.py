"""The .h3latent format: round trip, ComfyUI latents, lying headers, fuzzed headers, CLI."""

from __future__ import annotations

import json
import pickle
import struct
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import save_file
from typer.testing import CliRunner

from h3flow.cli import app
from h3flow.core.errors import H3FlowError, IntegrityError
from h3flow.core.fsutil import sha256_file
from h3flow.core.specs import get_spec
from h3flow.handoff.format import H3Latent, latent_kind, load_latent, read_header, save_latent

runner = CliRunner()


def small_latent(**meta: str) -> H3Latent:
    gen = torch.Generator().manual_seed(3)
    return H3Latent(
        video=torch.randn(1, 24, 2, 3, 4, generator=gen),
        audio=torch.randn(1, 32, 2, 5, generator=gen),
        meta={"clip_id": "c01", "seed": "42", "spec": "tiny", "frames": "22", **meta},
    )


def rewrite_header(path: Path, edit) -> None:  # type: ignore[no-untyped-def]
    """Re-serialise the file's header after ``edit(header)``, keeping the data bytes."""
    data = path.read_bytes()
    (length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + length])
    edit(header)
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data[8 + length :])


# --------------------------------------------------------------------------- round trip
def test_round_trip_keeps_tensors_and_fills_metadata(tmp_path: Path) -> None:
    spec = get_spec("sd")
    video = torch.randn(spec.video_shape(124))
    audio = torch.randn(spec.audio_shape(124))
    mask = torch.ones(1, 1, 37, 26, 46)
    path = tmp_path / "clip.h3latent"
    sha = save_latent(path, H3Latent(video, audio, {"clip_id": "c01", "seed": "7"}, {"noise": mask}))

    assert sha == sha256_file(path)
    assert 4_200_000 < path.stat().st_size < 4_500_000  # the issue's ~4.3 MB SD latent
    assert [p.name for p in tmp_path.iterdir()] == ["clip.h3latent"]  # atomic: no temp left
    latent = load_latent(path, expected_sha256=sha)
    assert torch.equal(latent.video, video) and torch.equal(latent.audio, audio)
    assert torch.equal(latent.masks["noise"], mask)
    meta = latent.meta
    assert meta["video_shape"] == "1,24,37,26,46" and meta["audio_shape"] == "1,32,2,207"
    assert meta["video_dtype"] == meta["audio_dtype"] == "float32"
    assert meta["format"] == "h3latent" and meta["format_version"] == "0"
    assert meta["clip_id"] == "c01" and meta["producer"].startswith("h3flow ")
    assert meta["created"].endswith("+00:00")
    header = read_header(path)
    assert set(header) == {"__metadata__", "video", "audio", "mask.noise", "latent_format_version_0"}
    assert header["latent_format_version_0"]["shape"] == [0]


def test_caller_metadata_kept_and_shapes_always_recomputed(tmp_path: Path) -> None:
    latent = small_latent(created="2026-01-01T00:00:00+00:00", video_shape="9,9", producer="sampler-a0")
    latent.video = latent.video.to(torch.bfloat16)
    latent.audio = None
    save_latent(tmp_path / "a.h3latent", latent)
    loaded = load_latent(tmp_path / "a.h3latent")
    assert loaded.meta["created"] == "2026-01-01T00:00:00+00:00" and loaded.meta["producer"] == "sampler-a0"
    assert loaded.meta["video_shape"] == "1,24,2,3,4" and loaded.meta["video_dtype"] == "bfloat16"
    assert loaded.audio is None and "audio_shape" not in loaded.meta
    assert loaded.video.dtype == torch.bfloat16


def test_identical_latents_give_identical_bytes(tmp_path: Path) -> None:
    a = save_latent(tmp_path / "a.h3latent", small_latent(created="x"))
    b = save_latent(tmp_path / "b.h3latent", small_latent(created="x"))
    assert a == b  # the hash is the identity: same content, same name


@pytest.mark.parametrize(
    ("video", "audio", "problem"),
    [
        (torch.zeros(1, 4, 2, 3, 4), None, "video must be"),
        (torch.zeros(24, 2, 3, 4), None, "video must be"),
        (torch.zeros(1, 24, 2, 3, 4), torch.zeros(1, 32, 3, 5), "audio must be"),
        (torch.zeros(1, 24, 2, 3, 4), torch.zeros(2, 32, 2, 5), "audio must be"),
        (torch.zeros(1, 24, 2, 3, 4, dtype=torch.int64), None, "floating-point"),
    ],
)
def test_save_rejects_wrong_layouts(
    tmp_path: Path, video: torch.Tensor, audio: torch.Tensor | None, problem: str
) -> None:
    with pytest.raises(H3FlowError, match=problem):
        save_latent(tmp_path / "bad.h3latent", H3Latent(video, audio, {}))
    assert not list(tmp_path.iterdir())


def test_expected_sha_mismatch_is_an_integrity_error(tmp_path: Path) -> None:
    path = tmp_path / "a.h3latent"
    sha = save_latent(path, small_latent())
    with pytest.raises(IntegrityError, match=sha[:12]):
        load_latent(path, expected_sha256="0" * 64)
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x01  # one flipped bit in the tensor data: a valid file, the wrong bytes
    path.write_bytes(bytes(data))
    with pytest.raises(IntegrityError):
        load_latent(path, expected_sha256=sha)


def test_comfyui_latent_loads_as_video_only(tmp_path: Path) -> None:
    """What ComfyUI's SaveLatent writes: latent_tensor + the version marker + prompt metadata."""
    samples = torch.randn(1, 24, 2, 3, 4)
    path = tmp_path / "ComfyUI_00001_.latent"
    save_file(
        {"latent_tensor": samples.contiguous(), "latent_format_version_0": torch.tensor([])},
        str(path),
        metadata={"prompt": json.dumps({"3": {"class_type": "KSampler"}})},
    )
    latent = load_latent(path)
    assert latent.audio is None and latent.masks == {}
    assert torch.equal(latent.video, samples)
    assert latent.meta["format"] == "comfyui-latent" and "KSampler" in latent.meta["prompt"]
    assert latent_kind(read_header(path)) == "comfyui-latent"


def test_comfyui_latent_of_another_model_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "sd15.latent"
    save_file({"latent_tensor": torch.zeros(1, 4, 8, 8), "latent_format_version_0": torch.tensor([])}, str(path))
    with pytest.raises(H3FlowError, match=r"latent_tensor must be \[B,24"):
        load_latent(path)


# --------------------------------------------------------------------------- lying headers
LIES = {
    "size": (lambda h: h["video"].__setitem__("shape", [1, 24, 2, 3, 5]), "needs"),
    "dtype": (lambda h: h["video"].__setitem__("dtype", "F16"), "needs"),
    "unknown dtype": (lambda h: h["video"].__setitem__("dtype", "Q4"), "unknown dtype"),
    "offset past end": (
        lambda h: h["audio"].__setitem__("data_offsets", [h["audio"]["data_offsets"][0], 10**9]),
        "fall outside",
    ),
    "overlap": (lambda h: h.__setitem__("audio", dict(h["video"])), "overlap"),
    "negative": (lambda h: h["video"].__setitem__("data_offsets", [-4, 0]), "invalid data_offsets"),
    "bool shape": (lambda h: h["video"].__setitem__("shape", [True, 24, 2, 3, 4]), "invalid shape"),
    "extra field": (lambda h: h["video"].__setitem__("device", "cuda"), "exactly"),
    "metadata lies": (lambda h: h["__metadata__"].__setitem__("video_shape", "1,24,9,3,4"), "metadata says"),
    "metadata type": (lambda h: h["__metadata__"].__setitem__("seed", 42), "strings"),
    "no video": (lambda h: h.__setitem__("mask.v", h.pop("video")), "no 'video'"),
    "hole": (lambda h: h.pop("audio"), "starts at|covers"),
    "no marker": (lambda h: h.pop("latent_format_version_0"), "marker"),
    "unknown tensor": (
        lambda h: h.__setitem__("extra", {"dtype": "F32", "shape": [0], "data_offsets": [0, 0]}),
        "unknown tensors",
    ),
    "future version": (lambda h: h["__metadata__"].__setitem__("format_version", "7"), "unsupported format"),
}


@pytest.mark.parametrize("lie", sorted(LIES))
def test_lying_header_is_rejected_with_one_line(tmp_path: Path, lie: str) -> None:
    path = tmp_path / "a.h3latent"
    save_latent(path, small_latent())
    edit, problem = LIES[lie]
    rewrite_header(path, edit)
    for reader in (read_header, load_latent):
        with pytest.raises(H3FlowError, match=problem) as caught:
            reader(path)
        assert "\n" not in str(caught.value) and str(path) in str(caught.value)


@pytest.mark.parametrize(
    ("mangle", "problem"),
    [
        (lambda d: d[:5], "too short"),
        (lambda d: struct.pack("<Q", 10**12) + d[8:], "header length"),
        (lambda d: d[:8] + b"[" + d[9:], "not valid JSON|not a JSON object"),
        (lambda d: d[:-1], "cover|fall outside"),
        (lambda d: d + b"\0", "tensors cover"),
        (lambda d: pickle.dumps({"video": [1, 2, 3]}), "header length|too short|JSON"),
    ],
)
def test_damaged_files_are_rejected(tmp_path: Path, mangle, problem: str) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "a.h3latent"
    save_latent(path, small_latent())
    path.write_bytes(mangle(path.read_bytes()))
    with pytest.raises(H3FlowError, match=problem):
        load_latent(path)


def test_duplicate_json_keys_are_a_lie(tmp_path: Path) -> None:
    path = tmp_path / "a.h3latent"
    save_latent(path, small_latent())
    data = path.read_bytes()
    (length,) = struct.unpack("<Q", data[:8])
    header = data[8 : 8 + length].decode()
    doubled = header.replace('"video":', '"video":{"dtype":"F32","shape":[0],"data_offsets":[0,0]},"video":', 1)
    path.write_bytes(struct.pack("<Q", len(doubled)) + doubled.encode() + data[8 + length :])
    with pytest.raises(H3FlowError, match="duplicate"):
        read_header(path)


def test_torch_save_pickle_is_never_unpickled(tmp_path: Path) -> None:
    path = tmp_path / "evil.h3latent"
    torch.save({"video": torch.zeros(1, 24, 2, 3, 4)}, path)
    with pytest.raises(H3FlowError):
        load_latent(path)


# --------------------------------------------------------------------------- fuzzing
_BASE: dict[str, bytes] = {}


def base_bytes(tmp: Path) -> bytes:
    if "data" not in _BASE:
        path = tmp / "base.h3latent"
        latent = small_latent(created="2026-01-01T00:00:00+00:00")
        latent.masks = {"m": torch.ones(1, 1, 2, 3, 4, dtype=torch.uint8)}
        save_latent(path, latent)
        _BASE["data"] = path.read_bytes()
    return _BASE["data"]


def check_mutant(path: Path, data: bytes) -> None:
    """A mutated file either loads consistently or raises H3FlowError; nothing else escapes."""
    path.write_bytes(data)
    try:
        header = read_header(path)
    except H3FlowError:
        header = None
    try:
        latent = load_latent(path)
    except H3FlowError:
        assert header is None, "read_header accepted what load_latent rejected"
        return
    assert header is not None
    assert list(latent.video.shape) == header.get("video", header.get("latent_tensor"))["shape"]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    edits=st.lists(st.tuples(st.integers(0, 700), st.integers(0, 255)), min_size=1, max_size=4),
    cut=st.one_of(st.none(), st.integers(0, 2000)),
)
def test_fuzzed_bytes_never_crash(tmp_path: Path, edits: list[tuple[int, int]], cut: int | None) -> None:
    data = bytearray(base_bytes(tmp_path))
    for position, value in edits:  # mostly inside the header, where lies live
        if position < len(data):
            data[position] = value
    if cut is not None:
        data = data[:cut]
    check_mutant(tmp_path / "mutant.h3latent", bytes(data))


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 2**64) | st.text(max_size=6) | st.sampled_from(["F32", "BF16", "U8"]),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    tensor=st.sampled_from(["video", "audio", "mask.m", "latent_format_version_0", "__metadata__", "new"]),
    field=st.sampled_from(["dtype", "shape", "data_offsets", "x", None]),
    value=json_values,
)
def test_fuzzed_header_fields_never_crash(tmp_path: Path, tensor: str, field: str | None, value: object) -> None:
    data = base_bytes(tmp_path)
    (length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + length])
    if field is None or not isinstance(header.get(tensor), dict):
        header[tensor] = value
    else:
        header[tensor][field] = value
    raw = json.dumps(header).encode()
    check_mutant(tmp_path / "mutant.h3latent", struct.pack("<Q", len(raw)) + raw + data[8 + length :])


# --------------------------------------------------------------------------- CLI
def test_cli_inspect_shows_shapes_metadata_and_hash(tmp_path: Path) -> None:
    path = tmp_path / "a.h3latent"
    sha = save_latent(path, small_latent())
    result = runner.invoke(app, ["latent", "inspect", str(path)])
    assert result.exit_code == 0, result.output
    assert sha in result.output and "[1, 24, 2, 3, 4]" in result.output and "clip_id" in result.output
    result = runner.invoke(app, ["latent", "inspect", "--json", str(path)])
    info = json.loads(result.output)
    assert info["sha256"] == sha and info["tensors"]["audio"]["shape"] == [1, 32, 2, 5]
    assert info["metadata"]["seed"] == "42" and info["kind"] == "h3latent"


def test_cli_verify_checks_the_hash(tmp_path: Path) -> None:
    path = tmp_path / "a.h3latent"
    sha = save_latent(path, small_latent())
    ok = runner.invoke(app, ["latent", "verify", str(path), "--sha256", sha.upper()])
    assert ok.exit_code == 0 and ok.output.startswith("ok ") and sha in ok.output
    bad = runner.invoke(app, ["latent", "verify", str(path), "--sha256", "ab" * 32])
    assert bad.exit_code == 2
    assert bad.output.count("\n") == 1 and "error:" in bad.output and "expected" in bad.output
    rewrite_header(path, LIES["size"][0])
    lying = runner.invoke(app, ["latent", "verify", str(path)])
    assert lying.exit_code == 2 and "invalid header" in lying.output and "Traceback" not in lying.output
    missing = runner.invoke(app, ["latent", "inspect", str(tmp_path / "nope.h3latent")])
    assert missing.exit_code == 2 and "cannot read" in missing.output
