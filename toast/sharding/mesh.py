"""Logical device meshes: named axes with sizes, as ``jax.sharding.Mesh`` names them.

``parse_mesh("batch=4,model=2")`` gives a ``Mesh`` whose axes are ordered major to minor, like
the axis names of ``jax.make_mesh((4, 2), ("batch", "model"))``: devices are laid out
row-major over the mesh shape, so the last axis joins the closest devices.
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
    """

    axes: tuple[tuple[str, int], ...]

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


def parse_mesh(text: str) -> Mesh:
    """``"batch=4,model=2"`` -> ``Mesh``; one-line errors for malformed input."""
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
    return Mesh(tuple(axes))
