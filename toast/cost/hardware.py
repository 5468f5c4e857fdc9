"""Accelerator profiles for the analytical cost model: peak FLOP/s, HBM and interconnect levels.

A profile is a TOML file, ``hardware/<name>.toml`` for the bundled ones (see ``hardware/README.md`` for the
schema). Units are SI throughout: FLOP/s, bytes, bytes/s and seconds. Every number in a bundled profile cites
its source; ``load_hardware`` checks that every section lists some.

Mesh axes map to interconnect levels the way JAX numbers devices: row-major over the mesh shape, so the last
axis is innermost (stride 1) and an axis of size ``n`` and stride ``s`` spans ``n * s`` consecutive devices.
``axis_levels`` gives each axis the innermost level that holds that many devices.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from toast.errors import ToastError
from toast.resources import resource_dir
from toast.toml_files import read_toml

_TOP_KEYS = ("name", "description", "compute", "memory", "kernels", "interconnect")
_KERNEL_KEYS = ("matmul_efficiency", "matmul_overhead", "f32_matmul", "hbm_efficiency", "kernel_overhead",
                "step_overhead", "scatter_add_rate", "scatter_add_rate_16bit", "sources")
_MEMORY_KEYS = ("hbm_bytes", "hbm_bandwidth", "sources")
_LEVEL_KEYS = ("level", "devices", "bandwidth", "latency", "sources")


@dataclass(frozen=True, slots=True)
class InterconnectLevel:
    """One level of the device hierarchy (NVLink domain, InfiniBand fabric, TPU ICI, DCN).

    Attributes:
      name: the level's name, e.g. ``"nvlink"``.
      devices: how many devices the level joins (8 GPUs per NVLink domain; a TPU slice).
      bandwidth: bytes/s per device available to a collective over this level. GPU profiles give one
        direction; TPU ICI gives the bidirectional per-axis ring bandwidth W of the scaling book.
      latency: seconds per collective step (the alpha of an alpha-beta model).
      sources: where the numbers come from.
    """

    name: str
    devices: int
    bandwidth: float
    latency: float
    sources: tuple[str, ...]


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

    def level_for(self, devices: int) -> InterconnectLevel:
        """The innermost level that joins at least ``devices`` devices; the outermost level when none does
        (a cluster grows by adding devices on its outermost network)."""
        for level in self.interconnect:
            if level.devices >= devices:
                return level
        return self.interconnect[-1]


def axis_levels(mesh_axes: list[tuple[str, int]], hardware: Hardware) -> dict[str, InterconnectLevel]:
    """The interconnect level each mesh axis's collectives run over.

    Devices are numbered row-major over the mesh shape, as JAX does, so the last axis is innermost. An axis of
    size ``n`` whose stride is ``s`` (the product of the sizes after it) spans ``n * s`` devices and maps to
    ``hardware.level_for(n * s)``; an axis of size 1 moves nothing and maps to the innermost level.

    >>> h100 = load_hardware("h100")
    >>> {a: l.name for a, l in axis_levels([("data", 2), ("model", 8)], h100).items()}
    {'data': 'infiniband', 'model': 'nvlink'}
    """
    levels: dict[str, InterconnectLevel] = {}
    stride = 1
    for name, size in reversed(mesh_axes):
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ToastError(f"mesh axis '{name}' has size {size!r}; a size must be a positive integer")
        levels[name] = hardware.level_for(size * stride if size > 1 else 1)
        stride *= size
    return {name: levels[name] for name, _ in mesh_axes}


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
    return _hardware(read_toml(path, what="hardware profile"), str(path))


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
    interconnect = tuple(_level(level, f"interconnect[{i}]", path) for i, level in enumerate(levels))
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
    fractions = {}
    for key in ("matmul_efficiency", "hbm_efficiency"):
        fractions[key] = _positive(kernels, key, "kernels", path)
        if fractions[key] > 1:
            raise ToastError(f"{path}: field 'kernels.{key}' must be a fraction in (0, 1]")
    sources = (_sources(compute, "compute", path) + _sources(memory, "memory", path)
               + _sources(kernels, "kernels", path))
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
    )


def _level(table: dict, where: str, path: str) -> InterconnectLevel:
    _known_keys(table, _LEVEL_KEYS, f"{where}.", path)
    name = table.get("level")
    if not isinstance(name, str) or not name:
        raise ToastError(f"{path}: field '{where}.level' must be a name")
    devices = table.get("devices")
    if isinstance(devices, bool) or not isinstance(devices, int) or devices < 1:
        raise ToastError(f"{path}: field '{where}.devices' must be a positive integer")
    return InterconnectLevel(
        name=name,
        devices=devices,
        bandwidth=_positive(table, "bandwidth", where, path),
        latency=_positive(table, "latency", where, path),
        sources=_sources(table, where, path),
    )


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
