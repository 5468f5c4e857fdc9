"""Logical device meshes: named axes with sizes, as ``jax.sharding.Mesh`` names them.

``parse_mesh("batch=4,model=2")`` gives a ``Mesh`` whose axes are ordered major to minor, like
the axis names of ``jax.make_mesh((4, 2), ("batch", "model"))``: devices are laid out
row-major over the mesh shape, so the last axis joins the closest devices.

A mesh may lie over several *slices* (TPU slices joined by the data-center network, DCN):
``Mesh(axes, slices=2)`` splits the devices, numbered row-major, into 2 runs of equal length,
so the major axes cross slices, as ``jax.experimental.mesh_utils.create_hybrid_device_mesh``
lays out a mesh whose ``dcn_mesh_shape`` is spread over the leading axes (MaxText's
``dcn_data_parallelism=2`` with ``ici_fsdp_parallelism=64`` is ``data=2,fsdp=64`` on 2 slices).
The cost model prices a collective whose group crosses slices on the profile's outermost level.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from toast.errors import ToastError

_AXIS = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
MAX_AXES = 8  # shardings are bit masks over the axes, one byte per dimension name
MAX_DEVICES = 1 << 24  # far above any machine, and products with tensor sizes stay well inside int64


@dataclass(frozen=True, slots=True)
class Mesh:
    """Named mesh axes, major to minor.

    Attributes:
      axes: ``((name, size), ...)``; sizes are device counts.
      slices: the slices the devices lie over (1: one slice, or as many as the profile's innermost
        levels need): the devices, numbered row-major, in that many runs of equal length; the runs
        must split the mesh along its leading axes (``slice_shape``).
    """

    axes: tuple[tuple[str, int], ...]
    slices: int = 1

    def __post_init__(self) -> None:
        self.slice_shape()  # the slices must split the mesh along its leading axes

    def slice_shape(self) -> tuple[int, ...]:
        """How many slices each axis crosses, major to minor: the ``dcn_mesh_shape`` of
        ``mesh_utils.create_hybrid_device_mesh`` (``(2, 1)`` for ``data=2,fsdp=64`` on 2 slices); an axis
        crossing ``c`` slices has its ``size / c`` devices inside each.

        Raises:
          ToastError: ``slices`` not a whole number from 1 to the mesh's devices, or slices that do not split
            the mesh along its leading axes (3 slices of ``data=2,fsdp=4``).
        """
        slices = self.slices
        if isinstance(slices, bool) or not isinstance(slices, int) or not 1 <= slices <= max(self.devices, 1):
            raise ToastError(f"mesh {self.spec()}: {slices!r} slices; give a whole number from 1 to its "
                             f"{self.devices} devices")
        shape, remaining = [], slices
        for _, size in self.axes:
            crossing = math.gcd(remaining, size)
            if crossing not in (size, remaining):  # part of this axis and part of a later one: no run of devices
                break
            shape.append(crossing)
            remaining //= crossing
        if remaining != 1:
            raise ToastError(f"mesh {self.spec()}: {slices} slices do not split it along its leading axes (devices "
                             "are numbered row-major, so the slices take the major axes: a leading axis of the "
                             "slices' count, e.g. data=2,fsdp=64 on 2 slices)")
        return tuple(shape) + (1,) * (len(self.axes) - len(shape))

    @property
    def slice_devices(self) -> int:
        """Devices in one slice."""
        return self.devices // self.slices

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.axes)

    @property
    def sizes(self) -> tuple[int, ...]:
        return tuple(size for _, size in self.axes)

    @property
    def devices(self) -> int:
        return math.prod(self.sizes)

    def index(self, axis: str) -> int:
        """Position of ``axis``; a one-line error naming the known axes otherwise."""
        for position, (name, _) in enumerate(self.axes):
            if name == axis:
                return position
        raise ToastError(f"unknown mesh axis '{axis}' (the mesh has {', '.join(self.names)})")

    def size(self, axis: str) -> int:
        return self.axes[self.index(axis)][1]

    def mask_axes(self, mask: int) -> tuple[str, ...]:
        """The axis names of a bit mask (bit k is axis k), major to minor."""
        return tuple(name for position, (name, _) in enumerate(self.axes) if mask >> position & 1)

    def mask_size(self, mask: int) -> int:
        """Devices a dimension sharded by ``mask`` is split over (product of the axis sizes)."""
        return math.prod(size for position, (_, size) in enumerate(self.axes) if mask >> position & 1)

    def spec(self) -> str:
        return ",".join(f"{name}={size}" for name, size in self.axes)

    def label(self) -> str:
        """``spec()`` for messages, with the slices where there are several (``data=2,fsdp=64 on 2 slices``)."""
        return self.spec() + (f" on {self.slices} slices" if self.slices > 1 else "")


def parse_mesh(text: str, *, slices: int = 1) -> Mesh:
    """``"batch=4,model=2"`` -> ``Mesh`` over ``slices`` slices (``Mesh.slices``); one-line errors for malformed
    input."""
    axes: list[tuple[str, int]] = []
    for part in text.split(","):
        name, sep, size = part.strip().partition("=")
        name = name.strip()
        size = size.strip()
        if not sep or not _AXIS.match(name) or not (size.isascii() and size.isdigit()):
            raise ToastError(f"--mesh {text}: expected NAME=SIZE[,NAME=SIZE...], e.g. batch=4,model=2")
        if int(size) < 1:
            raise ToastError(f"--mesh {text}: axis '{name}' needs a size of at least 1")
        if int(size) > MAX_DEVICES:
            raise ToastError(f"--mesh {text}: axis '{name}' of {size} devices; at most {MAX_DEVICES:,} in all")
        if name in dict(axes):
            raise ToastError(f"--mesh {text}: axis '{name}' appears twice")
        axes.append((name, int(size)))
    if len(axes) > MAX_AXES:
        raise ToastError(f"--mesh {text}: at most {MAX_AXES} axes")
    if math.prod(size for _, size in axes) > MAX_DEVICES:
        raise ToastError(f"--mesh {text}: {math.prod(size for _, size in axes):,} devices; at most {MAX_DEVICES:,}")
    return Mesh(tuple(axes), slices)
