"""Accelerator profiles for the analytical cost model: peak FLOP/s, HBM and interconnect levels.

A profile is a TOML file, ``hardware/<name>.toml`` for the bundled ones (see ``hardware/README.md`` for the
schema). Units are SI throughout: FLOP/s, bytes, bytes/s and seconds. Every number in a bundled profile cites
its source; ``load_hardware`` checks that every section lists some.

The first interconnect level is the node; ``toast.cost.network`` finds where each mesh axis's devices lie (in
a node, across nodes, or both) and prices collectives on that topology.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from dataclasses import dataclass
from pathlib import Path

from toast.errors import ToastError
from toast.resources import resource_dir
from toast.toml_files import parse_toml, read_text

_TOP_KEYS = ("name", "description", "compute", "memory", "kernels", "compiler", "host", "interconnect")
_HOST_KEYS = ("bandwidth", "efficiency", "sources")
# Bytes/s one way between a device and its host's memory for a profile without a [host] table: PCIe 4.0 x16
# (16 GT/s x 16 lanes, 128b/130b: 31.5 GB/s; NVIDIA's A100 datasheet rounds it to 32 GB/s a direction).
DEFAULT_HOST_BANDWIDTH = 32e9
_COMPILER_KEYS = ("combine_threshold", "collective_matmul", "sources")
_KERNEL_KEYS = ("matmul_efficiency", "matmul_overhead", "f32_matmul", "hbm_efficiency", "kernel_overhead",
                "step_overhead", "scatter_add_rate", "scatter_add_rate_16bit", "sources")
_MEMORY_KEYS = ("hbm_bytes", "hbm_bandwidth", "sources")
_LEVEL_KEYS = ("level", "devices", "bandwidth", "nics", "nic_bandwidth", "latency", "efficiency", "small_latency",
               "small_efficiency", "switch_reduction", "switch_latency", "switch_efficiency", "sources")
_SWITCH_KEYS = ("switch_latency", "switch_efficiency")


@dataclass(frozen=True, slots=True)
class InterconnectLevel:
    """One level of the device hierarchy (NVLink domain, InfiniBand fabric, TPU ICI, DCN) and how collectives
    run over it (``toast.cost.network`` prices them; ``hardware/README.md`` gives the schema).

    Attributes:
      name: the level's name, e.g. ``"nvlink"``.
      devices: how many devices the level joins (8 GPUs per NVLink domain; a TPU slice).
      bandwidth: line rate per device in bytes/s. GPU profiles give one direction; TPU ICI gives the
        bidirectional per-axis ring bandwidth W of the scaling book. A network level given as ``nics`` x
        ``nic_bandwidth`` per node (the level inside it) has the node's total divided by the node's devices:
        NCCL spreads a collective over all of a node's NICs.
      latency: seconds per ring step of a large message (the alpha of an alpha-beta model; NCCL's Simple
        protocol).
      efficiency: the fraction of ``bandwidth`` a ring collective's bus bandwidth reaches on large messages.
      small_latency: seconds per ring step of a small message (NCCL's low-latency protocols).
      small_efficiency: the fraction of ``bandwidth`` reached in that small-message regime; a collective takes
        whichever regime is faster, as NCCL's tuner picks a protocol per size.
      switch_reduction: whether the level's switches reduce (NVLink SHARP / NVLS): an all-reduce then sends
        and receives its buffer once.
      switch_latency: seconds per all-reduce reduced in the switch (0 without ``switch_reduction``).
      switch_efficiency: that all-reduce's algorithm bandwidth as a fraction of ``bandwidth`` (0 without).
      nics: network interfaces per node (0 when the level gives ``bandwidth`` per device).
      nic_bandwidth: bytes/s per NIC, one direction (0 when the level gives ``bandwidth``).
      sources: where the numbers come from.
    """

    name: str
    devices: int
    bandwidth: float
    latency: float
    sources: tuple[str, ...]
    efficiency: float = 1.0
    small_latency: float = 0.0
    small_efficiency: float = 0.0
    switch_reduction: bool = False
    switch_latency: float = 0.0
    switch_efficiency: float = 0.0
    nics: int = 0
    nic_bandwidth: float = 0.0

    def __post_init__(self) -> None:
        # A level built in code without a small-message regime runs every size as a large message.
        if self.small_efficiency == 0.0:
            object.__setattr__(self, "small_efficiency", self.efficiency)
        if self.small_latency == 0.0:
            object.__setattr__(self, "small_latency", self.latency)


@dataclass(frozen=True, slots=True)
class Hardware:
    """One accelerator.

    Attributes:
      name: the profile's name (``"h100"``).
      description: the exact part (``"NVIDIA H100 SXM5 80GB"``).
      peak_flops: dense matmul peak in FLOP/s, keyed by element type as StableHLO spells it (``"bf16"``,
        ``"f16"``, ``"f32"``, ``"f64"``, ``"i8"``; ``"f8"`` stands for every ``f8E...`` type).
      hbm_bytes: HBM capacity per device in bytes.
      hbm_bandwidth: HBM bandwidth per device in bytes/s.
      interconnect: the levels, innermost first, each joining more devices than the one before.
      sources: the sources of ``peak_flops``, the memory and the kernel numbers.
      path: the profile file.
      matmul_efficiency: the fraction of ``peak_flops`` a large matmul or convolution achieves.
      matmul_overhead: seconds added to every library call (launch, and the small-problem tail).
      f32_matmul: the ``peak_flops`` key f32 matmuls run at with XLA's default precision (``"tf32"`` on NVIDIA
        tensor cores, ``"bf16"`` passes on TPUs, ``"f32"`` where nothing faster is used).
      hbm_efficiency: the fraction of ``hbm_bandwidth`` a streaming (memory-bound) kernel achieves.
      kernel_overhead: seconds added to every other kernel (launch, ramp-up and tail).
      step_overhead: seconds added once per step (launching the program).
      scatter_add_rate: atomic updates per second of a scatter-add of 32-bit (and wider) elements.
      scatter_add_rate_16bit: the same for 16-bit and narrower elements.
      combine_threshold: bytes up to which the compiler combines independent all-reduces (all-gathers,
        reduce-scatters) of one kind and axis set into one (XLA's collective combiners); 0 combines none.
      collective_matmul: whether the compiler decomposes a matmul fed by an all-gather, or followed by a
        reduction of its partial result, into steps that overlap the collective with the matmul (XLA's windowed
        einsum: on in the TPU compiler, off by default on GPUs; ``toast.cost.overlap``); ``[compiler]``'s
        ``collective_matmul``, false when not given.
      host_bandwidth: bytes/s one way between one device and its host's memory (PCIe on GPUs and TPUs), the line
        rate (``[host]``; ``DEFAULT_HOST_BANDWIDTH`` without one).
      host_efficiency: the fraction of ``host_bandwidth`` a copy to or from host memory reaches (``[host]``'s
        ``efficiency``, 1 when not given): copies of values offloaded to host memory move at the product.
      text: the profile's TOML text, as read (strategy files record it, so that any file can be re-priced
        and validated without the profile file).
    """

    name: str
    description: str
    peak_flops: dict[str, float]
    hbm_bytes: float
    hbm_bandwidth: float
    interconnect: tuple[InterconnectLevel, ...]
    sources: tuple[str, ...]
    path: str
    matmul_efficiency: float
    matmul_overhead: float
    f32_matmul: str
    hbm_efficiency: float
    kernel_overhead: float
    step_overhead: float
    scatter_add_rate: float
    scatter_add_rate_16bit: float
    combine_threshold: float = 0.0
    collective_matmul: bool = False
    host_bandwidth: float = DEFAULT_HOST_BANDWIDTH
    host_efficiency: float = 1.0
    text: str = dataclasses.field(default="", repr=False, compare=False)

    def matmul_flops(self, dtype: str) -> float:
        """Peak FLOP/s of a matmul whose operands are ``dtype``: f32 at the ``f32_matmul`` rate (what XLA's
        default precision runs it as), every other type as ``flops``."""
        return self.flops(self.f32_matmul) if dtype == "f32" else self.flops(dtype)

    def scatter_rate(self, bits: int) -> float:
        """Atomic scatter-add updates per second for elements of ``bits`` bits."""
        return self.scatter_add_rate_16bit if 0 < bits <= 16 else self.scatter_add_rate

    def flops(self, dtype: str) -> float:
        """Peak FLOP/s for a matmul on ``dtype``.

        A dtype the profile lists gives its number. Otherwise: any ``f8...`` type uses ``f8`` if given, else
        the ``bf16`` peak; ``f64`` is half the ``f32`` peak (the ratio on A100 and H100); every other type
        (integers, complex, ``f16`` on TPUs) uses the ``f32`` peak.
        """
        peak = self.peak_flops
        if dtype in peak:
            return peak[dtype]
        if dtype.startswith("f8"):
            return peak.get("f8", peak["bf16"])
        if dtype == "f64":
            return peak["f32"] / 2
        return peak["f32"]

    def level_index(self, devices: int) -> int:
        """The index in ``interconnect`` of the innermost level that joins at least ``devices`` devices; the
        outermost level when none does (a cluster grows by adding devices on its outermost network)."""
        for index, level in enumerate(self.interconnect):
            if level.devices >= devices:
                return index
        return len(self.interconnect) - 1


MAX_MEMORY_GIB = float(1 << 30)  # an exbibyte per device: far above any accelerator, and exact in int64 bytes


def memory_limit_gib(memory_gib: float | None) -> float | None:
    """A memory limit per device in GiB, checked (every public entry point and ``--memory`` take it through this):
    ``None`` (the profile's HBM) or a finite number above 0 and at most ``MAX_MEMORY_GIB``.

    Raises:
      ToastError: NaN (it compares false with every peak: nothing would ever be over it), infinite, 0 or less,
        above ``MAX_MEMORY_GIB``, or not a number.
    """
    if memory_gib is None:
        return None
    if (isinstance(memory_gib, bool) or not isinstance(memory_gib, numbers.Real)
            or not (math.isfinite(memory_gib) and 0 < memory_gib <= MAX_MEMORY_GIB)):
        raise ToastError(f"memory_gib {memory_gib!r}: give the memory per device in GiB, a number above 0 and at most "
                         f"{MAX_MEMORY_GIB:.0f}")
    return float(memory_gib)


def known_hardware() -> list[str]:
    """The names of the bundled profiles."""
    return sorted(p.stem for p in resource_dir("hardware").glob("*.toml"))


def load_hardware(name_or_path: str) -> Hardware:
    """Read ``hardware/<name>.toml``, or the TOML file ``name_or_path`` names when it ends in ``.toml``."""
    path = Path(name_or_path)
    if path.suffix != ".toml":
        path = resource_dir("hardware") / f"{name_or_path}.toml"
        if not path.is_file():
            raise ToastError(f"unknown hardware '{name_or_path}' (known: {', '.join(known_hardware())})")
    if not path.is_file():
        raise ToastError(f"{path}: no such hardware profile")
    return hardware_from_text(read_text(path, what="hardware profile"), str(path))


def hardware_from_text(text: str, path: str) -> Hardware:
    """The profile in TOML ``text`` (``path`` names it in messages and becomes ``Hardware.path``), checked as
    ``load_hardware`` checks a file."""
    return dataclasses.replace(_hardware(parse_toml(text, path, what="hardware profile"), path), text=text)


def _hardware(data: dict, path: str) -> Hardware:
    _known_keys(data, _TOP_KEYS, "", path)
    name = data.get("name", Path(path).stem)
    description = data.get("description", "")
    for field, value in (("name", name), ("description", description)):
        if not isinstance(value, str):
            raise ToastError(f"{path}: field '{field}' must be a string")

    compute = _table(data, "compute", path)
    peak_flops = {key: _positive(compute, key, "compute", path) for key in compute if key != "sources"}
    for dtype in ("bf16", "f32"):
        _positive(compute, dtype, "compute", path)
    memory = _table(data, "memory", path)
    _known_keys(memory, _MEMORY_KEYS, "memory.", path)

    levels = data.get("interconnect")
    if not isinstance(levels, list) or not levels or not all(isinstance(level, dict) for level in levels):
        raise ToastError(f"{path}: field 'interconnect' must be one or more [[interconnect]] tables")
    interconnect: tuple[InterconnectLevel, ...] = ()
    for i, level in enumerate(levels):
        interconnect += (_level(level, f"interconnect[{i}]", path, interconnect[-1] if interconnect else None),)
    for i in range(1, len(interconnect)):
        if interconnect[i].devices <= interconnect[i - 1].devices:
            raise ToastError(
                f"{path}: field 'interconnect[{i}].devices' must be larger than the level inside it "
                f"({interconnect[i - 1].devices}); list levels innermost first"
            )

    hbm_bytes = _positive(memory, "hbm_bytes", "memory", path)
    hbm_bandwidth = _positive(memory, "hbm_bandwidth", "memory", path)
    kernels = _table(data, "kernels", path)
    _known_keys(kernels, _KERNEL_KEYS, "kernels.", path)
    f32_matmul = kernels.get("f32_matmul")
    if not isinstance(f32_matmul, str) or f32_matmul not in peak_flops:
        raise ToastError(f"{path}: field 'kernels.f32_matmul' must name a [compute] entry "
                         f"({', '.join(sorted(peak_flops))})")
    fractions = {key: _fraction(kernels, key, "kernels", path) for key in ("matmul_efficiency", "hbm_efficiency")}
    compiler = _table(data, "compiler", path)
    _known_keys(compiler, _COMPILER_KEYS, "compiler.", path)
    combine_threshold = compiler.get("combine_threshold")
    if isinstance(combine_threshold, bool) or not isinstance(combine_threshold, int | float) \
            or not math.isfinite(combine_threshold) or combine_threshold < 0:
        raise ToastError(f"{path}: field 'compiler.combine_threshold' must be a number of bytes, 0 or more")
    collective_matmul = compiler.get("collective_matmul", False)  # optional: profiles written before it have none
    if not isinstance(collective_matmul, bool):
        raise ToastError(f"{path}: field 'compiler.collective_matmul' must be true or false")
    sources = (_sources(compute, "compute", path) + _sources(memory, "memory", path)
               + _sources(kernels, "kernels", path) + _sources(compiler, "compiler", path))
    host_bandwidth, host_efficiency = DEFAULT_HOST_BANDWIDTH, 1.0
    if "host" in data:  # optional: profiles written before memory kinds were priced have none
        host = _table(data, "host", path)
        _known_keys(host, _HOST_KEYS, "host.", path)
        host_bandwidth = _positive(host, "bandwidth", "host", path)
        if "efficiency" in host:
            host_efficiency = _fraction(host, "efficiency", "host", path)
        sources += _sources(host, "host", path)
    return Hardware(
        name=name,
        description=description,
        peak_flops=peak_flops,
        hbm_bytes=hbm_bytes,
        hbm_bandwidth=hbm_bandwidth,
        interconnect=interconnect,
        sources=tuple(dict.fromkeys(sources)),
        path=path,
        matmul_efficiency=fractions["matmul_efficiency"],
        matmul_overhead=_positive(kernels, "matmul_overhead", "kernels", path),
        f32_matmul=f32_matmul,
        hbm_efficiency=fractions["hbm_efficiency"],
        kernel_overhead=_positive(kernels, "kernel_overhead", "kernels", path),
        step_overhead=_positive(kernels, "step_overhead", "kernels", path),
        scatter_add_rate=_positive(kernels, "scatter_add_rate", "kernels", path),
        scatter_add_rate_16bit=_positive(kernels, "scatter_add_rate_16bit", "kernels", path),
        combine_threshold=float(combine_threshold),
        collective_matmul=collective_matmul,
        host_bandwidth=host_bandwidth,
        host_efficiency=host_efficiency,
    )


def _level(table: dict, where: str, path: str, inner: InterconnectLevel | None) -> InterconnectLevel:
    _known_keys(table, _LEVEL_KEYS, f"{where}.", path)
    name = table.get("level")
    if not isinstance(name, str) or not name:
        raise ToastError(f"{path}: field '{where}.level' must be a name")
    devices = _count(table, "devices", where, path)
    nics, nic_bandwidth = 0, 0.0
    if "bandwidth" in table or inner is None or ("nics" not in table and "nic_bandwidth" not in table):
        for key in ("nics", "nic_bandwidth"):
            if key in table:
                raise ToastError(f"{path}: field '{where}.{key}' goes with a level outside a node, instead of "
                                 f"'bandwidth'; give one or the other")
        bandwidth = _positive(table, "bandwidth", where, path)
    else:  # a network: the node's NICs, shared by the node's devices
        nics = _count(table, "nics", where, path)
        nic_bandwidth = _positive(table, "nic_bandwidth", where, path)
        bandwidth = nics * nic_bandwidth / inner.devices
    switch_reduction = table.get("switch_reduction")
    if not isinstance(switch_reduction, bool):
        raise ToastError(f"{path}: field '{where}.switch_reduction' must be true or false")
    if switch_reduction:
        switch_latency = _positive(table, "switch_latency", where, path)
        switch_efficiency = _fraction(table, "switch_efficiency", where, path)
    else:
        for key in _SWITCH_KEYS:
            if key in table:
                raise ToastError(f"{path}: field '{where}.{key}' needs switch_reduction = true")
        switch_latency = switch_efficiency = 0.0
    return InterconnectLevel(
        name=name,
        devices=devices,
        bandwidth=bandwidth,
        latency=_positive(table, "latency", where, path),
        sources=_sources(table, where, path),
        efficiency=_fraction(table, "efficiency", where, path),
        small_latency=_positive(table, "small_latency", where, path),
        small_efficiency=_fraction(table, "small_efficiency", where, path),
        switch_reduction=switch_reduction,
        switch_latency=switch_latency,
        switch_efficiency=switch_efficiency,
        nics=nics,
        nic_bandwidth=nic_bandwidth,
    )


def _count(table: dict, key: str, where: str, path: str) -> int:
    value = table.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ToastError(f"{path}: field '{where}.{key}' must be a positive integer")
    return value


def _fraction(table: dict, key: str, where: str, path: str) -> float:
    value = _positive(table, key, where, path)
    if value > 1:
        raise ToastError(f"{path}: field '{where}.{key}' must be a fraction in (0, 1]")
    return value


def _table(data: dict, key: str, path: str) -> dict:
    value = data.get(key)
    if not isinstance(value, dict):
        raise ToastError(f"{path}: field '{key}' must be a [{key}] table")
    return value


def _positive(table: dict, key: str, where: str, path: str) -> float:
    value = table.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        raise ToastError(f"{path}: field '{where}.{key}' must be a positive number")
    return float(value)


def _sources(table: dict, where: str, path: str) -> tuple[str, ...]:
    value = table.get("sources")
    if not isinstance(value, list) or not value or not all(isinstance(s, str) and s for s in value):
        raise ToastError(f"{path}: field '{where}.sources' must be a non-empty list of strings (cite each number)")
    return tuple(value)


def _known_keys(table: dict, known: tuple[str, ...], prefix: str, path: str) -> None:
    for key in table:
        if key not in known:
            raise ToastError(f"{path}: unknown field '{prefix}{key}' (known: {', '.join(known)})")
