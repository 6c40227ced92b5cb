"""Topologies: how the main sampler host's GPUs are split into pools.

A topology is a partition of the main sampler host's GPUs (Host A's eight T10s) into
Ulysses pools, plus whether the extra sampler hosts (the XTX box) join in. Named ones
follow the design (``four_four_plus_one`` = two 4-GPU pools + one decoder); any other
partition can be written as sizes joined by ``+``, e.g. ``4+2+2`` or ``4+4+xtx``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from h3flow.core.errors import ConfigError

ULYSSES_DEGREES = (1, 2, 4, 8)


@dataclass(frozen=True)
class Topology:
    name: str
    partition: tuple[int, ...]
    extra_samplers: bool

    @property
    def gpus_used(self) -> int:
        return sum(self.partition)

    @property
    def canonical(self) -> str:
        """The ``4+4+xtx`` spelling, whatever name it was asked for by."""
        parts = [str(n) for n in sorted(self.partition, reverse=True)]
        return "+".join(parts + (["xtx"] if self.extra_samplers else []))


NAMED: dict[str, tuple[tuple[int, ...], bool]] = {
    "four_plus_one": ((4,), False),
    "four_xtx_plus_one": ((4,), True),
    "eight_plus_one": ((8,), False),
    "eight_xtx_plus_one": ((8,), True),
    "four_four_plus_one": ((4, 4), False),
    "four_four_xtx_plus_one": ((4, 4), True),
    # the embedded default: two single-device pools on this machine
    "one_one_plus_one": ((1, 1), False),
}

DEFAULT_TOPOLOGY = "four_four_plus_one"
_PATTERN = re.compile(r"^[1-9]\d*(\+[1-9]\d*)*(\+xtx)?$")


def parse_topology(name: str) -> Topology:
    """A named topology or a ``+``-joined partition such as ``4+2+2+xtx``."""
    if name in NAMED:
        partition, extra = NAMED[name]
        return Topology(name, partition, extra)
    if _PATTERN.match(name):
        parts = name.split("+")
        extra = parts[-1] == "xtx"
        sizes = tuple(int(p) for p in parts if p != "xtx")
        bad = [n for n in sizes if n not in ULYSSES_DEGREES]
        if bad:
            raise ConfigError(f"topology {name!r}: pool size {bad[0]} is not a Ulysses degree {ULYSSES_DEGREES}")
        return Topology(name, sizes, extra)
    raise ConfigError(f"unknown topology {name!r} (named: {', '.join(NAMED)}; or sizes like 4+2+2 or 4+4+xtx)")
