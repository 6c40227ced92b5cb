"""Which topologies to plan: the named ones, or every partition of Host A's GPUs.

``--topology search`` tries every way of splitting the main sampler host's GPUs (or a
subset of them) into pools of Ulysses degree 1, 2, 4 or 8, with and without the extra
sampler hosts (the XTX box), and — when there are several decoder hosts — every
non-empty set of them. Each candidate goes through ``adapt`` (the same resolution as
``config-adapt``), so a pool that cannot hold the DiT is reported infeasible with
adapt's reason; a topology whose pools cannot hold the text encoder is infeasible too.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations

from h3flow.config.adapt import adapt, main_sampler_host
from h3flow.config.models import HostMap
from h3flow.config.topology import NAMED, ULYSSES_DEGREES, parse_topology
from h3flow.core.errors import ConfigError
from h3flow.planner.profile import Profile
from h3flow.planner.resources import Resources


@dataclass(frozen=True)
class Candidate:
    """One topology to simulate, or why it cannot run on this hardware."""

    name: str  # a named topology's name where one matches, else the 4+2+2+xtx spelling
    canonical: str
    gpus: int  # GPUs used on the main sampler host
    extras: frozenset[str]  # extra sampler hosts used (the XTX box)
    decoders: frozenset[str]  # decoder pools used
    resources: Resources | None
    reason: str | None = None

    @property
    def feasible(self) -> bool:
        return self.resources is not None

    def hardware_leq(self, other: Candidate) -> bool:
        return self.gpus <= other.gpus and self.extras <= other.extras and self.decoders <= other.decoders

    def less_hardware(self, other: Candidate) -> bool:
        """Strictly less hardware than ``other`` (a subset of it)."""
        return self.hardware_leq(other) and not other.hardware_leq(self)

    @property
    def hardware_size(self) -> int:
        return self.gpus + len(self.extras) + len(self.decoders)


def display_name(canonical: str) -> str:
    for name in NAMED:
        if parse_topology(name).canonical == canonical:
            return name
    return canonical


def partitions(total: int, degrees: tuple[int, ...] = ULYSSES_DEGREES) -> list[tuple[int, ...]]:
    """Every multiset of ``degrees`` summing to at most ``total`` (largest first)."""
    out: list[tuple[int, ...]] = []

    def grow(prefix: tuple[int, ...], largest: int, left: int) -> None:
        if prefix:
            out.append(prefix)
        for d in sorted(degrees, reverse=True):
            if d <= largest and d <= left:
                grow((*prefix, d), d, left - d)

    grow((), max(degrees), total)
    return sorted(out, key=lambda p: (-sum(p), len(p), tuple(-x for x in p)))


def topology_names(hm: HostMap, which: str) -> list[str]:
    """``all``: the named topologies; ``search``: every partition (+xtx); else the one asked."""
    if which == "all":
        return list(NAMED)
    if which == "search":
        gpus = len(main_sampler_host(hm).gpus)
        extras = any("sample" in h.roles for h in hm.hosts if h is not main_sampler_host(hm))
        names = []
        for part in partitions(gpus):
            spelled = "+".join(str(n) for n in part)
            names.append(spelled)
            if extras:
                names.append(spelled + "+xtx")
        return names
    parse_topology(which)  # unknown names fail here, with the list of known ones
    return [which]


def _decoder_hosts(hm: HostMap) -> list[str]:
    return [h.name for h in hm.hosts if "decode" in h.roles]


def _only_decoders(hm: HostMap, keep: tuple[str, ...]) -> HostMap:
    """The host map with the decode role only on ``keep`` (decode-only hosts dropped)."""
    hosts = []
    for h in hm.hosts:
        if "decode" in h.roles and h.name not in keep:
            roles = [r for r in h.roles if r != "decode"]
            if not roles:
                continue
            h = h.model_copy(update={"roles": roles})
        hosts.append(h)
    names = {h.name for h in hosts}
    links = [lk for lk in hm.links if set(lk.hosts) <= names]
    return hm.model_copy(update={"hosts": hosts, "links": links})


def build(hm: HostMap, topology: str, profile: Profile, decoder_hosts: tuple[str, ...] | None = None) -> Candidate:
    """Resolve one topology (optionally with only some decoder hosts) into a :class:`Candidate`."""
    topo = parse_topology(topology)
    name = display_name(topo.canonical) if topology not in NAMED else topology
    all_dec = tuple(_decoder_hosts(hm))
    chosen = decoder_hosts or all_dec
    if decoder_hosts and len(all_dec) > 1 and set(decoder_hosts) != set(all_dec):
        name = f"{name}@{'+'.join(decoder_hosts)}"
        hm = _only_decoders(hm, decoder_hosts)
    main = main_sampler_host(hm)
    extras = (
        frozenset(h.name for h in hm.hosts if "sample" in h.roles and h is not main)
        if topo.extra_samplers
        else frozenset()
    )
    try:
        config = adapt(hm, topology)
        resources = Resources.from_config(config)
    except ConfigError as exc:
        return Candidate(name, topo.canonical, topo.gpus_used, extras, frozenset(chosen), None, str(exc))
    return Candidate(
        name, topo.canonical, topo.gpus_used, extras, frozenset(d.name for d in resources.decoders), resources
    )


def candidates(hm: HostMap, which: str, profile: Profile) -> list[Candidate]:
    """The topologies ``which`` names, each with every non-empty set of decoder hosts when searching."""
    names = topology_names(hm, which)
    hosts = _decoder_hosts(hm)
    subsets: list[tuple[str, ...] | None] = [None]
    if which == "search" and len(hosts) > 1:
        subsets = [c for k in range(1, len(hosts) + 1) for c in combinations(hosts, k)]
    return [build(hm, name, profile, subset) for name in names for subset in subsets]


def baseline(hm: HostMap, profile: Profile) -> Candidate:
    """The design's baseline: every GPU of the main sampler host in one pool, no extra samplers.

    It is the simplest deployment of the same cards (``eight_plus_one`` on the design's
    cluster), so a gain over it is what the choice of topology alone buys.
    """
    gpus = len(main_sampler_host(hm).gpus)
    degree = max((d for d in ULYSSES_DEGREES if d <= gpus), default=1)
    return build(hm, str(degree), profile)
