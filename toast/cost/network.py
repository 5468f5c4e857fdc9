"""Collective times on a cluster's topology, as NCCL (GPUs) and the ICI/DCN rings (TPUs) run them.

A collective runs over a *group*: the devices of a set of mesh axes. Devices are numbered row-major over the
mesh shape, as ``jax.make_mesh`` and ``mesh_utils.create_device_mesh`` lay them out on GPUs (the last axis is
innermost), so a group lies inside one node (the domain of the profile's innermost level: an NVLink domain, a
TPU slice), spans nodes with one device in each, or both (``GroupSpan``). A mesh over several slices
(``Mesh.slices``, TPU slices joined by DCN) makes each slice a node: the outermost level joins the
slices, the levels inside it join at most one slice's devices (``sliced_hardware``), so an axis crossing
slices is priced on DCN, and one crossing slices with several devices in each on both (ICI within a
slice, DCN across: the ring's bus bandwidth and the hierarchical all-reduce below).

Each algorithm's time is affine in the message size S (bytes as nccl-tests counts them: an all-reduce's
buffer per device, an all-gather's gathered and a reduce-scatter's scattered buffer, an all-to-all's buffer
per device, a collective-permute's buffer sent per device), ``latency + S * seconds_per_byte``, and a
collective takes its fastest algorithm, as NCCL's tuner picks one per size (its model is the same affine one:
src/graph/tuning.cc). For a group of n devices,
k per node on m nodes, with the node's fabric F (line rate B_F per device) and the network N joining the
nodes (line rate B_N per device: a node's NICs over its devices, since NCCL spreads a collective over all of
them) and, per regime r (large messages, small messages), the efficiency e_r and per-step latency a_r of each:

- **ring** (every kind): the ring's bus bandwidth is ``e_F B_F`` in one node, ``min(e_F B_F, e_N k B_N)``
  across nodes (the k devices of the group in a node share the node's NICs with the node's other groups,
  which run the same collective at the same time); all-gather and reduce-scatter move ``(n-1)/n S`` in one
  pass around the ring, ``n-m`` fabric steps and ``m-1`` network steps, all-reduce twice that; an
  all-to-all sends ``(k-1)/n S`` over the fabric and ``(n-k)/n S`` over the network.
- **switch** (all-reduce in one node whose fabric reduces, NVLink SHARP): ``switch_latency + S / (e_sw
  B_F)``: every device sends and receives its buffer once.
- **hierarchical** (all-reduce across nodes: NCCL's tree and NVLS-tree): reduce-scatter in the node, all-reduce
  across nodes, all-gather in the node, pipelined, so the slower phase sets the pace: ``max(in the node:
  2(k-1)/k S / (e_F B_F), or S / (e_sw B_F) with switch reduction; across: 2(m-1)/m S / (e_N k B_N))``, with
  ``2(k-1)`` fabric steps (or the switch's latency) and ``2 ceil(log2 m)`` network steps, up and down a tree.
- **point-to-point** (collective-permute: a halo exchange, each device sends S to one neighbour along the
  group and receives S from the other): one step, ``S / (e_F B_F)`` in one node; across nodes the pairs that
  straddle a node boundary set the pace, one network step and ``S / (e_N B_N)`` (each such device sends
  through its own share of the node's NICs).

The small-message regime (NCCL's low-latency protocols) has lower latency and lower bandwidth; the
parameters of every level are fitted to nccl-tests measurements (``benchmarks/fit_collectives.py``,
``toast calibrate``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

from toast.cost.hardware import Hardware, InterconnectLevel
from toast.errors import ToastError
from toast.sharding.mesh import Mesh

COLLECTIVE_KINDS = ("all-reduce", "reduce-scatter", "all-gather", "all-to-all", "collective-permute")


@dataclass(frozen=True, slots=True)
class GroupSpan:
    """Where the devices of one collective's group lie.

    Attributes:
      devices: n, the devices in the group.
      per_node: k, the group's devices inside one node (the domain of ``interconnect[inner]``).
      nodes: m = n / k, the nodes the group spans.
      inner: index of the level inside a node (its fabric).
      outer: index of the level joining the nodes (``inner`` when the group is inside one node).
    """

    devices: int
    per_node: int
    nodes: int
    inner: int
    outer: int

    @property
    def placement(self) -> str:
        """``"node"`` (inside one node), ``"network"`` (one device per node) or ``"both"``."""
        if self.nodes == 1:
            return "node"
        return "network" if self.per_node == 1 else "both"

    def levels(self, hardware: Hardware) -> str:
        """The levels the group's traffic crosses, inner first: ``"nvlink"``, ``"infiniband"``,
        ``"nvlink+infiniband"``."""
        inner, outer = hardware.interconnect[self.inner].name, hardware.interconnect[self.outer].name
        return {"node": inner, "network": outer}.get(self.placement, f"{inner}+{outer}")


@dataclass(frozen=True, slots=True)
class Algorithm:
    """One way to run a collective: ``seconds = latency + bytes * seconds_per_byte``.

    Attributes:
      name: ``ring``, ``switch``, ``hierarchical`` or ``point-to-point``, with ``/small`` for the small-message regime.
      latency: seconds.
      seconds_per_byte: seconds per byte of the message (nccl-tests' size).
    """

    name: str
    latency: float
    seconds_per_byte: float

    def seconds(self, nbytes: float) -> float:
        return self.latency + nbytes * self.seconds_per_byte


def group_span(positions: Sequence[int], hardware: Hardware) -> GroupSpan:
    """The span of a group given the device numbers of its members (a group holding device 0, as every
    group of a mesh axis set is a translate of that one).

    >>> from toast.cost.hardware import load_hardware
    >>> h100 = load_hardware("h100")  # 8 GPUs per node
    >>> group_span(range(0, 16), h100)   # 16 devices, 8 in each of 2 nodes
    GroupSpan(devices=16, per_node=8, nodes=2, inner=0, outer=1)
    >>> group_span(range(0, 32, 8), h100)  # one device on each of 4 nodes
    GroupSpan(devices=4, per_node=1, nodes=4, inner=0, outer=1)
    """
    members = sorted(set(positions))
    n = len(members)
    outer = hardware.level_index(members[-1] + 1) if n else 0
    if outer == 0 or n <= 1:
        return GroupSpan(devices=n, per_node=n, nodes=1, inner=0, outer=0)
    node = hardware.interconnect[outer - 1].devices
    first_node = members[0] // node
    per_node = sum(1 for p in members if p // node == first_node)
    if per_node == n:  # wider than a node in numbering, but inside one
        return GroupSpan(devices=n, per_node=n, nodes=1, inner=outer - 1, outer=outer - 1)
    return GroupSpan(devices=n, per_node=per_node, nodes=n // per_node, inner=outer - 1, outer=outer)


def sliced_hardware(hardware: Hardware, *, devices: int, slices: int) -> Hardware:
    """The profile as a mesh of ``devices`` laid over ``slices`` slices sees it (``Mesh.slices``): the outermost
    level joins the slices and every level inside it joins at most one slice's devices (``devices / slices``);
    the profile itself for one slice.

    >>> from toast.cost.hardware import load_hardware
    >>> [level.devices for level in sliced_hardware(load_hardware("tpu_v4"), devices=128, slices=2).interconnect]
    [64, 65536]

    Raises:
      ToastError: a profile of one level (nothing joins slices), or a slice larger than the level inside the
        outermost joins (a v5e slice of more than its 256-chip pod).
    """
    if slices == 1:
        return hardware
    levels = hardware.interconnect
    if len(levels) < 2:
        raise ToastError(f"{slices} slices: the {hardware.name} profile has one interconnect level "
                         f"({levels[0].name}); slices need a network joining them, an outer [[interconnect]] level")
    per_slice = devices // slices
    inside = levels[-2]
    if per_slice > inside.devices:
        raise ToastError(f"{slices} slices of {devices} devices: a slice of {per_slice} devices is more than the "
                         f"{inside.devices} that the {hardware.name} profile's {inside.name} level joins")
    capped = tuple(dataclasses.replace(level, devices=min(level.devices, per_slice)) for level in levels[:-1])
    return dataclasses.replace(hardware, interconnect=capped + levels[-1:])


def check_slices(mesh: Mesh, hardware: Hardware) -> None:
    """Fail before any work where ``mesh``'s slices cannot lie on ``hardware`` (``sliced_hardware``'s errors)."""
    sliced_hardware(hardware, devices=mesh.devices, slices=mesh.slices)


def mesh_group_span(mesh_axes: Sequence[tuple[str, int]], axes: Sequence[str], hardware: Hardware, *,
                    slices: int = 1) -> GroupSpan:
    """The span of the group over ``axes`` of a mesh ``[(name, size), ...]`` (major to minor), devices
    numbered row-major over the mesh shape, on ``slices`` slices (``Mesh.slices``: each a node, joined by the
    outermost level).

    >>> from toast.cost.hardware import load_hardware
    >>> v4 = load_hardware("tpu_v4")
    >>> mesh_group_span([("data", 2), ("fsdp", 64)], ("data",), v4).levels(v4)  # one slice of 128 chips
    'ici'
    >>> mesh_group_span([("data", 2), ("fsdp", 64)], ("data",), v4, slices=2).levels(v4)
    'dcn'
    >>> mesh_group_span([("data", 2), ("fsdp", 64)], ("data", "fsdp"), v4, slices=2)
    GroupSpan(devices=128, per_node=64, nodes=2, inner=0, outer=1)
    """
    strides: dict[str, int] = {}
    stride = 1
    for name, size in reversed(mesh_axes):
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ToastError(f"mesh axis '{name}' has size {size!r}; a size must be a positive integer")
        strides[name] = stride
        stride *= size
    sizes = dict(mesh_axes)
    positions = [0]
    for axis in axes:
        positions = [p + i * strides[axis] for p in positions for i in range(sizes[axis])]
    return group_span(positions, sliced_hardware(hardware, devices=stride, slices=slices))


def axis_spans(mesh_axes: Sequence[tuple[str, int]], hardware: Hardware, *, slices: int = 1
               ) -> dict[str, GroupSpan]:
    """Each mesh axis's span: whether its collectives stay in a node, span nodes, or both.

    >>> from toast.cost.hardware import load_hardware
    >>> spans = axis_spans([("data", 2), ("model", 8)], load_hardware("h100"))
    >>> {axis: span.placement for axis, span in spans.items()}
    {'data': 'network', 'model': 'node'}
    """
    return {name: mesh_group_span(mesh_axes, (name,), hardware, slices=slices) for name, _ in mesh_axes}


def algorithms(kind: str, span: GroupSpan, hardware: Hardware) -> tuple[Algorithm, ...]:
    """Every algorithm that can run a ``kind`` collective over ``span`` (module docstring); none for a group
    of one device."""
    if kind not in COLLECTIVE_KINDS:
        raise ValueError(f"unknown collective kind {kind!r}")
    n, k, m = span.devices, span.per_node, span.nodes
    if n <= 1:
        return ()
    fabric = hardware.interconnect[span.inner]
    network = hardware.interconnect[span.outer] if m > 1 else None
    found: list[Algorithm] = []
    for regime in ("", "/small"):
        fabric_bw, fabric_step = _regime(fabric, regime)
        net_bw, net_step = _regime(network, regime) if network is not None else (math.inf, 0.0)
        group_net_bw = net_bw * k  # the node's NICs the group's k devices share
        ring_bw = fabric_bw if m == 1 else min(fabric_bw, group_net_bw) if k > 1 else group_net_bw
        # A pass around the ring: n - m hops inside nodes and m - 1 between them (NCCL's tuning model).
        ring_steps = (n - m) * fabric_step + (m - 1) * net_step
        if kind == "collective-permute":
            if m == 1:
                found.append(Algorithm("point-to-point" + regime, fabric_step, 1 / fabric_bw))
            else:
                found.append(Algorithm("point-to-point" + regime, max(fabric_step, net_step),
                                       max(1 / fabric_bw, 1 / net_bw)))
            continue
        if kind == "all-to-all":
            per_byte = max((k - 1) / n / fabric_bw, (n - k) / n / net_bw if m > 1 else 0.0)
            found.append(Algorithm("ring" + regime, ring_steps, per_byte))
            continue
        factor = 2 if kind == "all-reduce" else 1
        found.append(Algorithm("ring" + regime, factor * ring_steps, factor * (n - 1) / n / ring_bw))
        if kind != "all-reduce" or m == 1:
            continue
        if fabric.switch_reduction and not regime:
            in_node, in_node_latency = 1 / (fabric.switch_efficiency * fabric.bandwidth), fabric.switch_latency
        else:
            in_node, in_node_latency = 2 * (k - 1) / k / fabric_bw, 2 * (k - 1) * fabric_step
        across = 2 * (m - 1) / m / group_net_bw
        # Up and down a tree of nodes (NCCL's tree: log2 of the nodes deep).
        tree_steps = 2 * math.ceil(math.log2(m)) * net_step
        found.append(Algorithm("hierarchical" + regime, in_node_latency + tree_steps, max(in_node, across)))
    if kind == "all-reduce" and m == 1 and fabric.switch_reduction:
        found.append(Algorithm("switch", fabric.switch_latency,
                               1 / (fabric.switch_efficiency * fabric.bandwidth)))
    return tuple(found)


def _regime(level: InterconnectLevel, regime: str) -> tuple[float, float]:
    """``(bus bandwidth per device in bytes/s, seconds per step)`` of ``level`` in a regime."""
    if regime:
        return level.small_efficiency * level.bandwidth, level.small_latency
    return level.efficiency * level.bandwidth, level.latency


def best_algorithm(kind: str, nbytes: float, span: GroupSpan, hardware: Hardware) -> Algorithm | None:
    """The fastest algorithm for a message of ``nbytes`` (``None`` for a group of one device)."""
    found = algorithms(kind, span, hardware)
    return min(found, key=lambda algorithm: algorithm.seconds(nbytes)) if found else None


def collective_seconds(kind: str, nbytes: float, span: GroupSpan, hardware: Hardware) -> float:
    """Seconds of one ``kind`` collective of ``nbytes`` (nccl-tests' size) over ``span``."""
    best = best_algorithm(kind, nbytes, span, hardware)
    return best.seconds(nbytes) if best is not None else 0.0
