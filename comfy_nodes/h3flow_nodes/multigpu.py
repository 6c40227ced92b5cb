"""The A6 text encoder over N GPUs: find its layers, place them, move activations, offload.

MiniMax H3's text encoder (Qwen3-VL 32B) is a vision tower, token embeddings, a stack
of decoder layers and a final norm. Nothing here knows ComfyUI: the functions take a
``torch.nn.Module`` tree, so they run (and are tested) on CPU with a small stand-in.

- :func:`encoder_units` lists the units in execution order;
- :func:`place_units` puts each unit on the device :func:`.partition.partition_layers`
  chose and registers a forward pre-hook that moves the unit's tensor inputs onto its
  device (activations cross GPUs only at partition boundaries);
- :class:`MultiGPUEncoder` keeps the state between clips: placed, offloaded to CPU
  (``H3_MP_RETAIN_CPU_WEIGHTS=1``: the next clip re-places from RAM), or freed (the
  next clip reloads from disk).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from .errors import H3FlowError
from .partition import Partition, partition_layers

RETAIN_ENV = "H3_MP_RETAIN_CPU_WEIGHTS"
VISION_NAMES = ("visual", "vision_tower", "vision_model")
EMBED_NAMES = ("embed_tokens", "wte", "embeddings")
NORM_NAMES = ("norm", "final_layernorm", "ln_f")


def retain_cpu_weights() -> bool:
    """``H3_MP_RETAIN_CPU_WEIGHTS=1`` keeps the offloaded encoder in RAM for the next clip."""
    return os.environ.get(RETAIN_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def module_bytes(module: nn.Module) -> int:
    """Bytes of a module's own parameters and buffers (recursively)."""
    seen: set[int] = set()
    total = 0
    for tensor in [*module.parameters(), *module.buffers()]:
        if id(tensor) not in seen and tensor.device.type != "meta":
            seen.add(id(tensor))
            total += tensor.numel() * tensor.element_size()
    return total


def _find_decoder(root: nn.Module) -> tuple[str, nn.Module]:
    """The submodule holding ``layers`` (a ModuleList) next to token embeddings."""
    for name, module in root.named_modules():
        layers = getattr(module, "layers", None)
        if isinstance(layers, nn.ModuleList) and any(hasattr(module, e) for e in EMBED_NAMES):
            return name, module
    raise H3FlowError("text encoder layout not recognised: no module with `layers` and token embeddings")


def encoder_units(root: nn.Module) -> list[tuple[str, nn.Module]]:
    """The encoder's units in execution order: vision tower, embeddings, layers..., norm.

    The vision tower is looked for on the decoder's parent chain (Qwen3-VL keeps it as
    ``transformer.visual`` beside ``transformer.model``).
    """
    dec_name, decoder = _find_decoder(root)
    units: list[tuple[str, nn.Module]] = []
    prefix = dec_name.rsplit(".", 1)[0] if "." in dec_name else ""
    parents = [root.get_submodule(prefix) if prefix else root, decoder]
    for parent, base in ((parents[0], prefix), (decoder, dec_name)):
        for vname in VISION_NAMES:
            vision = getattr(parent, vname, None)
            if isinstance(vision, nn.Module) and all(vision is not u for _, u in units):
                units.append((f"{base}.{vname}".lstrip("."), vision))
    for ename in EMBED_NAMES:
        embed = getattr(decoder, ename, None)
        if isinstance(embed, nn.Module):
            units.append((f"{dec_name}.{ename}".lstrip("."), embed))
            break
    layers = decoder.layers
    assert isinstance(layers, nn.ModuleList)  # _find_decoder only returns modules that have one
    for i, layer in enumerate(layers):
        units.append((f"{dec_name}.layers.{i}".lstrip("."), layer))
    for nname in NORM_NAMES:
        norm = getattr(decoder, nname, None)
        if isinstance(norm, nn.Module):
            units.append((f"{dec_name}.{nname}".lstrip("."), norm))
            break
    return units


def _move(value: Any, device: torch.device) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to(device, non_blocking=True) if value.device != device else value
    if isinstance(value, tuple):
        return tuple(_move(v, device) for v in value)
    if isinstance(value, list):
        return [_move(v, device) for v in value]
    if isinstance(value, dict):
        return {k: _move(v, device) for k, v in value.items()}
    return value


@dataclass
class Placement:
    """Where each unit went and the hooks that move activations to it."""

    devices: dict[str, torch.device]
    partition: Partition
    handles: list[Any] = field(default_factory=list)

    def remove_hooks(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles.clear()


def place_units(
    root: nn.Module,
    devices: Sequence[torch.device | str],
    free_bytes: Sequence[int],
    *,
    reserve_bytes: int = 0,
) -> Placement:
    """Partition the units by memory, move each to its device, hook activation transfers.

    Parameters that belong to no unit (rotary tables, the root's own buffers) go to the
    first device, where the forward pass begins.
    """
    units = encoder_units(root)
    devs = [torch.device(d) for d in devices]
    part = partition_layers([module_bytes(m) for _, m in units], free_bytes, reserve_bytes=reserve_bytes)
    _move_rest(root, [m for _, m in units], devs[0])
    where: dict[str, torch.device] = {}
    placement = Placement(where, part)
    for (name, module), gpu in zip(units, part.assignment, strict=False):
        device = devs[gpu]
        module.to(device)
        where[name] = device

        def pre_hook(
            _mod: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], _device: torch.device = device
        ) -> Any:
            return _move(args, _device), _move(kwargs, _device)

        placement.handles.append(module.register_forward_pre_hook(pre_hook, with_kwargs=True))
    return placement


def _move_rest(root: nn.Module, units: list[nn.Module], device: torch.device) -> None:
    """Move the tensors of modules outside every unit (never the whole tree: it may not fit)."""
    inside: set[int] = set()
    for unit in units:
        inside.update(id(m) for m in unit.modules())
    for module in root.modules():
        if id(module) in inside:
            continue
        for param in module.parameters(recurse=False):
            param.data = param.data.to(device)
        for name, buf in list(module.named_buffers(recurse=False)):
            module._buffers[name] = buf.to(device)


def empty_device_caches(devices: Iterable[torch.device]) -> None:
    """Return freed blocks to the driver on every CUDA/ROCm device used."""
    if not torch.cuda.is_available():
        return
    for device in {d for d in devices if d.type == "cuda"}:
        with torch.cuda.device(device):
            torch.cuda.empty_cache()


@dataclass
class OffloadResult:
    freed_device_bytes: int
    kept_cpu_copy: bool


class MultiGPUEncoder:
    """The text encoder's life between clips: place → encode → offload (keep or free).

    ``load`` builds the module tree on CPU (from disk); ``free_bytes`` reports each
    device's free memory at placement time (``torch.cuda.mem_get_info`` in production).
    """

    def __init__(
        self,
        load: Callable[[], nn.Module],
        devices: Sequence[torch.device | str],
        *,
        free_bytes: Callable[[Sequence[torch.device]], list[int]] | None = None,
        reserve_bytes: int = 0,
        retain: bool | None = None,
    ) -> None:
        if not devices:
            raise H3FlowError("H3MultiGPUCLIPLoader: no GPU to place the text encoder on")
        self._load = load
        self.devices = [torch.device(d) for d in devices]
        self._free_bytes = free_bytes or cuda_free_bytes
        self.reserve_bytes = reserve_bytes
        self.retain = retain_cpu_weights() if retain is None else retain
        self.module: nn.Module | None = None
        self.placement: Placement | None = None
        self.loads = 0  # how many times weights came from disk

    @property
    def state(self) -> str:
        if self.module is None:
            return "freed"
        return "placed" if self.placement is not None else "cpu"

    def ensure_placed(self) -> nn.Module:
        """The encoder on its GPUs, loading from disk only when the CPU copy was freed."""
        if self.module is None:
            self.module = self._load()
            self.loads += 1
        if self.placement is None:
            self.placement = place_units(
                self.module, self.devices, self._free_bytes(self.devices), reserve_bytes=self.reserve_bytes
            )
        return self.module

    def offload(self) -> OffloadResult:
        """Weights to CPU, device caches emptied; the CPU copy dropped unless ``retain``."""
        if self.module is None or self.placement is None:
            return OffloadResult(0, self.module is not None)
        on_devices = sum(
            t.numel() * t.element_size()
            for t in [*self.module.parameters(), *self.module.buffers()]
            if t.device.type not in ("cpu", "meta")
        )
        self.placement.remove_hooks()
        used = list(self.placement.devices.values())
        self.placement = None
        if self.retain:
            self.module.to("cpu")
        else:
            self.module.to("meta")  # releases every storage without a CPU copy
            self.module = None
        empty_device_caches(used)
        return OffloadResult(on_devices, self.retain)


def cuda_free_bytes(devices: Sequence[torch.device]) -> list[int]:
    """Free memory per device from the driver (CPU devices: available RAM)."""
    out: list[int] = []
    for device in devices:
        if device.type == "cuda":
            free, _total = torch.cuda.mem_get_info(device)
            out.append(int(free))
        else:
            try:
                import psutil

                out.append(int(psutil.virtual_memory().available))
            except ImportError:  # pragma: no cover - psutil ships with ComfyUI
                out.append(int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")))
    return out


def parse_gpus(text: str, available: int) -> list[torch.device]:
    """``"0,1,2,3"`` → those CUDA devices; ``""`` → all visible ones (at least one required)."""
    text = text.strip()
    if not text:
        ids = list(range(available))
    else:
        try:
            ids = [int(part) for part in text.split(",") if part.strip()]
        except ValueError:
            raise H3FlowError(f"gpus must be comma-separated GPU indices like 0,1,2,3, got {text!r}") from None
    bad = [i for i in ids if i < 0 or i >= available]
    if bad or len(set(ids)) != len(ids) or not ids:
        raise H3FlowError(f"gpus {text!r}: need distinct indices among the {available} visible GPU(s)")
    return [torch.device("cuda", i) for i in ids]
