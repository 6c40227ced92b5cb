"""The ``.h3latent`` file: one sampled clip's video + audio latents in a safetensors file.

MiniMax H3 samples a *pair* of latents, which upstream ComfyUI's SaveLatent cannot store,
so h3flow writes one tensor per stream (``video``, ``audio``, ``mask.<name>``) plus the
empty ``latent_format_version_0`` marker and string metadata (clip id, seed, spec,
shapes, dtype, producer, creation time). The SHA-256 of the file's bytes is the latent's
identity: the store, the transfer and the decode all name it by that hash.

The header is validated in pure Python *before* safetensors sees the bytes, so a file
whose header lies (sizes, dtypes, offsets, shapes) is rejected with a one-line
:class:`~.errors.H3FlowError` instead of a crash deep in a decoder. Nothing is ever
unpickled.

This is the one implementation of the format: the ComfyUI nodes use it inside ComfyUI
(needing only torch and safetensors), and h3flow imports it (``h3flow.handoff.format``).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import struct
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from .errors import H3FlowError, IntegrityError
from .files import atomic_writer, sha256_bytes
from .layout import AUDIO_CHANNELS, VIDEO_CHANNELS

FORMAT = "h3latent"
FORMAT_VERSION = "0"
VERSION_MARKER = "latent_format_version_0"
COMFY_TENSOR = "latent_tensor"  # what ComfyUI's SaveLatent writes
MASK_PREFIX = "mask."
MAX_HEADER_BYTES = 100_000_000  # safetensors' own limit
SUFFIX = ".h3latent"

# safetensors dtype name -> (bytes per element, torch dtype name)
DTYPES: dict[str, tuple[int, str]] = {
    "F64": (8, "float64"),
    "F32": (4, "float32"),
    "F16": (2, "float16"),
    "BF16": (2, "bfloat16"),
    "F8_E4M3": (1, "float8_e4m3fn"),
    "F8_E5M2": (1, "float8_e5m2"),
    "I64": (8, "int64"),
    "I32": (4, "int32"),
    "I16": (2, "int16"),
    "I8": (1, "int8"),
    "U64": (8, "uint64"),
    "U32": (4, "uint32"),
    "U16": (2, "uint16"),
    "U8": (1, "uint8"),
    "BOOL": (1, "bool"),
}
LATENT_DTYPES = {"F64", "F32", "F16", "BF16"}
_SAFETENSORS_DTYPE = {getattr(torch, name): code for code, (_, name) in DTYPES.items() if hasattr(torch, name)}
_MASK_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


@dataclass
class H3Latent:
    """One clip's sampled latents, as the sampler hands them to the decoder."""

    video: torch.Tensor  # [B, 24, T, H/16, W/16]
    audio: torch.Tensor | None  # [B, 32, 2, T40]
    meta: dict[str, str]  # clip_id, seed, spec, frames, fps, producer, created, shapes, dtype ...
    masks: dict[str, torch.Tensor] = field(default_factory=dict)


# --------------------------------------------------------------------------- writing
def save_latent(path: Path, latent: H3Latent) -> str:
    """Write ``latent`` atomically to ``path``; return the SHA-256 of the bytes written.

    Shapes, dtypes and the format version are always (re)computed from the tensors, so
    the metadata cannot disagree with the data; ``created`` and ``producer`` are filled
    in only when the caller did not set them.
    """
    video = _as_cpu("video", latent.video)
    _check_video_shape(tuple(video.shape), "video")
    tensors: dict[str, torch.Tensor] = {"video": video}
    meta = {str(k): str(v) for k, v in latent.meta.items()}
    meta.update(
        format=FORMAT,
        format_version=FORMAT_VERSION,
        video_shape=_shape_text(video.shape),
        video_dtype=_torch_dtype_name(video),
    )
    meta.pop("audio_shape", None)
    meta.pop("audio_dtype", None)
    if latent.audio is not None:
        audio = _as_cpu("audio", latent.audio)
        _check_audio_shape(tuple(audio.shape), tuple(video.shape), "audio")
        tensors["audio"] = audio
        meta.update(audio_shape=_shape_text(audio.shape), audio_dtype=_torch_dtype_name(audio))
    for name, mask in latent.masks.items():
        if not _MASK_NAME.match(name):
            raise H3FlowError(f"invalid mask name {name!r} (letters, digits, '_' and '-' only)")
        if not isinstance(mask, torch.Tensor) or mask.dtype not in _SAFETENSORS_DTYPE:
            raise H3FlowError(f"mask {name!r} must be a tensor of a safetensors dtype")
        tensors[MASK_PREFIX + name] = mask.detach().to("cpu").contiguous()
    tensors[VERSION_MARKER] = torch.zeros(0, dtype=torch.float32)
    # timezone.utc, not datetime.UTC: the pack runs on ComfyUI's Python, which may be 3.10
    meta.setdefault("created", datetime.now(timezone.utc).isoformat(timespec="seconds"))  # noqa: UP017
    meta.setdefault("producer", _producer())
    return _write_safetensors(path, tensors, meta)


def _write_safetensors(path: Path, tensors: dict[str, torch.Tensor], meta: dict[str, str]) -> str:
    """Write the safetensors layout with a canonical header (sorted keys, fixed tensor
    order), so equal latents give equal bytes and therefore the same SHA-256.

    safetensors' own writer emits the metadata in hash-map order, which changes from one
    process to the next; its reader is what loads these files.
    """
    names = sorted(tensors, key=lambda n: (-tensors[n].element_size(), n))  # widest first: aligned
    entries: dict[str, Any] = {}
    offset = 0
    for name in names:
        size = tensors[name].numel() * tensors[name].element_size()
        entries[name] = {
            "dtype": _SAFETENSORS_DTYPE[tensors[name].dtype],
            "shape": list(tensors[name].shape),
            "data_offsets": [offset, offset + size],
        }
        offset += size
    header = json.dumps({"__metadata__": dict(sorted(meta.items())), **entries}, separators=(",", ":")).encode()
    header += b" " * (-len(header) % 8)  # tensor data starts 8-byte aligned, as safetensors does
    digest = hashlib.sha256()
    with atomic_writer(path, "wb") as handle:
        for head in (struct.pack("<Q", len(header)), header):
            digest.update(head)
            handle.write(head)
        for name in names:
            data = tensors[name].reshape(-1).view(torch.uint8).numpy().data
            digest.update(data)
            handle.write(data)
    return digest.hexdigest()


def _as_cpu(name: str, tensor: torch.Tensor) -> torch.Tensor:
    if not isinstance(tensor, torch.Tensor):
        raise H3FlowError(f"latent {name} must be a torch.Tensor, not {type(tensor).__name__}")
    if not tensor.is_floating_point():
        raise H3FlowError(f"latent {name} must be a floating-point tensor, not {tensor.dtype}")
    return tensor.detach().to("cpu").contiguous()


def _torch_dtype_name(tensor: torch.Tensor) -> str:
    return str(tensor.dtype).removeprefix("torch.")


def _shape_text(shape: Any) -> str:
    return ",".join(str(int(d)) for d in shape)


def _producer() -> str:
    from . import __version__

    return f"h3flow {__version__}"


# --------------------------------------------------------------------------- reading
def read_header(path: Path) -> dict[str, Any]:
    """The validated safetensors header of a latent file, without loading any tensor.

    Returns the header as stored (tensor name -> ``{dtype, shape, data_offsets}``) with
    ``__metadata__`` always present (``{}`` when the file has none).
    """
    try:
        with open(path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            prefix = handle.read(8)
            length = _header_length(prefix, size, path)
            raw = handle.read(length)
    except OSError as exc:
        raise H3FlowError(f"cannot read latent file {path}: {exc.strerror or exc}") from None
    return _validate(_parse_json(raw, path), size - 8 - length, path)


def load_latent(path: Path, expected_sha256: str | None = None) -> H3Latent:
    """Load a ``.h3latent`` (or a plain ComfyUI ``.latent`` as video-only) with safetensors.

    The file is read once; the hash and the tensors come from the same bytes, so a file
    that changes underneath cannot pass the check with other contents.
    """
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise H3FlowError(f"cannot read latent file {path}: {exc.strerror or exc}") from None
    if expected_sha256 is not None:
        actual = sha256_bytes(data)
        if actual != expected_sha256.lower():
            raise IntegrityError(f"latent {path} has SHA-256 {actual}, expected {expected_sha256}")
    length = _header_length(data[:8], len(data), path)
    header = _validate(_parse_json(data[8 : 8 + length], path), len(data) - 8 - length, path)

    from safetensors.torch import load

    try:
        tensors = load(data)
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:  # noqa: BLE001 - a Rust panic surfaces as a BaseException
        # Unreachable after _validate unless safetensors is stricter than we are: still no traceback.
        raise H3FlowError(f"latent file {path} is not valid safetensors: {exc}") from None
    meta = dict(header["__metadata__"])
    if COMFY_TENSOR in header:
        meta.setdefault("format", "comfyui-latent")
        return H3Latent(video=tensors[COMFY_TENSOR], audio=None, meta=meta)
    masks = {k.removeprefix(MASK_PREFIX): v for k, v in tensors.items() if k.startswith(MASK_PREFIX)}
    return H3Latent(video=tensors["video"], audio=tensors.get("audio"), meta=meta, masks=masks)


def frames_of(latent: H3Latent) -> int:
    """Pixel frames of a latent: its metadata, else the 17k+5 count its T implies."""
    if "frames" in latent.meta:
        try:
            return int(latent.meta["frames"])
        except ValueError:
            raise H3FlowError(f"latent metadata frames={latent.meta['frames']!r} is not a number") from None
    t = int(latent.video.shape[2])
    return ((t - 2) // 5) * 17 + 5


def latent_kind(header: dict[str, Any]) -> str:
    """``h3latent`` or ``comfyui-latent`` for a header returned by :func:`read_header`."""
    return "comfyui-latent" if COMFY_TENSOR in header else FORMAT


# --------------------------------------------------------------------------- validation
def _header_length(prefix: bytes, file_size: int, path: Path) -> int:
    if len(prefix) < 8 or file_size < 8:
        raise H3FlowError(f"latent file {path} is too short to be safetensors ({file_size} bytes)")
    (length,) = struct.unpack("<Q", prefix[:8])
    if length < 2 or length > MAX_HEADER_BYTES or 8 + length > file_size:
        raise H3FlowError(f"latent file {path}: header length {length} does not fit a {file_size}-byte file")
    return length


def _parse_json(raw: bytes, path: Path) -> dict[str, Any]:
    def no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        keys = [k for k, _ in pairs]
        if len(set(keys)) != len(keys):
            raise ValueError("duplicate key in header")
        return dict(pairs)

    try:
        header = json.loads(raw.decode("utf-8"), object_pairs_hook=no_duplicates)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise H3FlowError(f"latent file {path}: header is not valid JSON ({exc})") from None
    if not isinstance(header, dict):
        raise H3FlowError(f"latent file {path}: header is not a JSON object")
    return header


def _validate(header: dict[str, Any], data_size: int, path: Path) -> dict[str, Any]:
    """Check the safetensors structure, then the H3 layout; return the header with metadata."""
    bad = _HeaderProblem(path)
    meta = header.pop("__metadata__", {})
    if not isinstance(meta, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in meta.items()):
        raise bad("__metadata__ must map strings to strings")
    spans: list[tuple[int, int, str]] = []
    for name, entry in header.items():
        if not isinstance(entry, dict) or set(entry) != {"dtype", "shape", "data_offsets"}:
            raise bad(f"tensor {name!r} must have exactly dtype, shape and data_offsets")
        dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
        if not isinstance(dtype, str) or dtype not in DTYPES:
            raise bad(f"tensor {name!r} has unknown dtype {dtype!r}")
        if not isinstance(shape, list) or len(shape) > 8 or not all(_is_count(d) for d in shape):
            raise bad(f"tensor {name!r} has an invalid shape {shape!r}")
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(_is_count(o) for o in offsets)):
            raise bad(f"tensor {name!r} has invalid data_offsets {offsets!r}")
        begin, end = offsets
        if not begin <= end <= data_size:
            raise bad(f"tensor {name!r} data_offsets {offsets} fall outside the {data_size}-byte data")
        if math.prod(shape) * DTYPES[dtype][0] != end - begin:
            raise bad(
                f"tensor {name!r}: {dtype} {shape} needs {math.prod(shape) * DTYPES[dtype][0]} bytes, "
                f"data_offsets give {end - begin}"
            )
        spans.append((begin, end, name))
    position = 0
    for begin, end, name in sorted(spans):
        if begin != position:
            raise bad(f"tensor {name!r} starts at {begin}, expected {position} (overlap or hole)")
        position = end
    if position != data_size:
        raise bad(f"tensors cover {position} bytes but the file holds {data_size}")
    _validate_layout(header, meta, bad)
    return {"__metadata__": meta, **header}


def _validate_layout(header: dict[str, Any], meta: dict[str, str], bad: _HeaderProblem) -> None:
    if VERSION_MARKER in header and math.prod(header[VERSION_MARKER]["shape"]) != 0:
        raise bad(f"{VERSION_MARKER} must be an empty tensor")
    if COMFY_TENSOR in header:  # a plain ComfyUI .latent: video only
        extra = set(header) - {COMFY_TENSOR, VERSION_MARKER}
        if extra:
            raise bad(f"unexpected tensors next to {COMFY_TENSOR}: {', '.join(sorted(extra))}")
        _check_stream(header, COMFY_TENSOR, bad)
        _check_video_shape(tuple(header[COMFY_TENSOR]["shape"]), COMFY_TENSOR, bad)
        return
    if "video" not in header:
        raise bad("no 'video' (h3latent) or 'latent_tensor' (ComfyUI) tensor")
    if VERSION_MARKER not in header:
        raise bad(f"missing the {VERSION_MARKER} marker tensor")
    extra = {k for k in header if k not in {"video", "audio", VERSION_MARKER} and not _is_mask(k)}
    if extra:
        raise bad(f"unknown tensors: {', '.join(sorted(extra))}")
    if meta.get("format", FORMAT) != FORMAT or meta.get("format_version", FORMAT_VERSION) != FORMAT_VERSION:
        raise bad(f"unsupported format {meta.get('format')!r} version {meta.get('format_version')!r}")
    _check_stream(header, "video", bad)
    video_shape = tuple(header["video"]["shape"])
    _check_video_shape(video_shape, "video", bad)
    if "audio" in header:
        _check_stream(header, "audio", bad)
        _check_audio_shape(tuple(header["audio"]["shape"]), video_shape, "audio", bad)
    for stream in ("video", "audio"):
        entry = header.get(stream)
        for key, actual in (
            ("shape", entry and _shape_text(entry["shape"])),
            ("dtype", entry and DTYPES[entry["dtype"]][1]),
        ):
            claimed = meta.get(f"{stream}_{key}")
            if claimed is not None and claimed != actual:
                raise bad(f"metadata says {stream}_{key}={claimed} but the tensor has {actual or 'none'}")


def _check_stream(header: dict[str, Any], name: str, bad: _HeaderProblem) -> None:
    if header[name]["dtype"] not in LATENT_DTYPES:
        raise bad(f"tensor {name!r} must be floating point, not {header[name]['dtype']}")


def _check_video_shape(shape: tuple[int, ...], name: str, bad: Any = None) -> None:
    if len(shape) != 5 or shape[1] != VIDEO_CHANNELS or 0 in shape:
        problem = f"{name} must be [B,{VIDEO_CHANNELS},T,H/16,W/16], got {list(shape)}"
        raise bad(problem) if bad else H3FlowError(problem)


def _check_audio_shape(shape: tuple[int, ...], video_shape: tuple[int, ...], name: str, bad: Any = None) -> None:
    if len(shape) != 4 or shape[1:3] != (AUDIO_CHANNELS, 2) or shape[0] != video_shape[0] or 0 in shape:
        problem = f"{name} must be [B,{AUDIO_CHANNELS},2,T40] with the video's B={video_shape[0]}, got {list(shape)}"
        raise bad(problem) if bad else H3FlowError(problem)


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**48


def _is_mask(name: str) -> bool:
    return name.startswith(MASK_PREFIX) and bool(_MASK_NAME.match(name.removeprefix(MASK_PREFIX)))


class _HeaderProblem:
    """Builds the one-line error for a lying header, naming the file."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __call__(self, problem: str) -> H3FlowError:
        return H3FlowError(f"latent file {self.path} has an invalid header: {problem}")
