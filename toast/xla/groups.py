"""Device groups of XLA's collectives: its ``replica_groups`` / ``source_target_pairs`` text as partition ids,
and the mesh axes a group varies along. Pure; tests: ``tests/test_xla_check.py``."""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Sequence

from toast.errors import ToastError

__all__ = ["device_count", "group_axes", "parse_groups"]


def parse_groups(text: str, device_count: int) -> tuple[tuple[int, ...], ...]:
    """Device groups of ``replica_groups=``/``source_target_pairs=`` text.

    Forms: ``{{0,1},{2,3}}``; ``{}`` (all ``device_count`` devices in one group); the iota form
    ``[G,S]<=[d0,d1,...]`` or ``[G,S]<=[d0,d1,...]T(p0,p1,...)``: ``arange(prod(d))`` reshaped
    to ``d``, transposed by ``p``, reshaped to ``G`` groups of ``S``; the mesh-axes form (see
    ``_mesh_axes_groups``).
    """
    import numpy as np

    text = text.strip()
    if text.startswith("mesh["):
        return _mesh_axes_groups(text, device_count)
    iota = re.fullmatch(r"\[([\d,\s]+)\]<=\[([\d,\s]+)\](?:T\(([\d,\s]+)\))?", text)
    if iota is not None:
        shape, reshape = (tuple(int(x) for x in g.split(",")) for g in iota.group(1, 2))
        perm = tuple(int(x) for x in iota.group(3).split(",")) if iota.group(3) else tuple(range(len(reshape)))
        ids = np.arange(math.prod(reshape)).reshape(reshape).transpose(perm).reshape(shape[0], -1)
        return tuple(tuple(int(x) for x in row) for row in ids)
    if re.fullmatch(r"\{\s*\}", text):
        return (tuple(range(device_count)),)
    if not (text.startswith("{") and text.endswith("}")):
        raise ToastError(f"cannot read device groups {text[:60]!r}")
    groups = re.findall(r"\{([\d,\s]*)\}", text[1:-1])
    return tuple(tuple(int(x) for x in g.split(",") if x.strip()) for g in groups)


def _mesh_axes_groups(text: str, device_count: int) -> tuple[tuple[int, ...], ...]:
    """Device groups of XLA's mesh-axes replica groups (``MeshAxesReplicaGroupList``).

    Form: ``mesh['a'=4,'b'=1,'c'=2] {'a'}``, with ``, device_ids=(IDS)`` after the ``]`` when
    the mesh's devices are not in iota order (``IDS`` is ``[r0,r1,...]T(p0,...)`` or an
    explicit id list), and sub-axes ``'a':(pre)size`` in the braces. XLA's mesh here is its own
    (names like ``axis_0``), not the user's. A group is every device reached by varying the
    listed (sub-)axes with the others fixed; a sub-axis ``(pre)size`` of an axis of size ``n``
    is the middle factor of ``n`` split major-to-minor as ``[pre, size, n / (pre * size)]``.
    """
    import numpy as np

    match = re.fullmatch(r"mesh\[([^\]]*)\](?:\s*,\s*device_ids=\((.*)\))?\s*\{([^}]*)\}", text.strip())
    if match is None:
        raise ToastError(f"cannot read mesh-axes device groups {text[:80]!r}")
    axes = re.findall(r"'?([^',=\s]+)'?\s*=\s*(\d+)", match.group(1))
    names = [name for name, _ in axes]
    sizes = [int(size) for _, size in axes]
    count = math.prod(sizes)
    if count != device_count:
        raise ToastError(f"mesh-axes device groups over {count} devices, the mesh has {device_count}: {text[:80]!r}")
    ids = np.arange(count)
    if match.group(2):
        listed = [int(x) for x in re.findall(r"\d+", match.group(2).split("]")[0])]
        transpose = re.search(r"T\(([\d,\s]+)\)", match.group(2))
        if len(listed) == count and sorted(listed) == list(range(count)):
            ids = np.array(listed)  # explicit ids (never a valid reshape: it holds a 0)
        else:
            perm = [int(x) for x in transpose.group(1).split(",")] if transpose else list(range(len(listed)))
            ids = np.arange(count).reshape(listed).transpose(perm).reshape(-1)
    refs = []
    for ref in (r.strip() for r in match.group(3).split(",") if r.strip()):
        parsed = re.fullmatch(r"'?([^':]+)'?(?::\((\d+)\)(\d+))?", ref)
        if parsed is None or parsed.group(1) not in names:
            raise ToastError(f"cannot read mesh axis '{ref}' in device groups {text[:80]!r}")
        axis = names.index(parsed.group(1))
        pre, size = (int(parsed.group(2)), int(parsed.group(3))) if parsed.group(2) else (1, sizes[axis])
        refs.append((axis, pre, size))
    # Split each axis at its sub-axes' boundaries: factors of the axis, major to minor.
    bounds = [sorted({1, n, *(b for a, pre, size in refs if a == axis for b in (pre, pre * size))})
              for axis, n in enumerate(sizes)]
    factors: list[int] = []
    first: list[int] = []
    for axis_bounds in bounds:
        first.append(len(factors))
        factors.extend(hi // lo for lo, hi in itertools.pairwise(axis_bounds))
    grouped = [first[a] + i for a, pre, size in refs
               for i, (lo, hi) in enumerate(itertools.pairwise(bounds[a])) if pre <= lo and hi <= pre * size]
    kept = [i for i in range(len(factors)) if i not in grouped]
    group_size = math.prod(factors[i] for i in grouped)
    table = ids.reshape(factors or [1]).transpose(kept + grouped).reshape(-1, group_size)
    return tuple(tuple(int(x) for x in row) for row in table)


def group_axes(groups: Sequence[Sequence[int]], mesh_axes: Sequence[tuple[str, int]]) -> tuple[str, ...]:
    """Mesh axes along which the members of some group differ (partition ids, row-major mesh)."""
    import numpy as np

    sizes = tuple(size for _, size in mesh_axes)
    varying = [False] * len(sizes)
    for group in groups:
        if any(not 0 <= device < math.prod(sizes) for device in group):
            raise ToastError(f"device group {list(group)} has ids outside the mesh of {math.prod(sizes)} devices")
        coords = np.array(np.unravel_index(np.asarray(group, dtype=np.int64), sizes)).reshape(len(sizes), -1)
        for axis in range(len(sizes)):
            varying[axis] |= bool(len(np.unique(coords[axis])) > 1)
    return tuple(name for (name, _), vary in zip(mesh_axes, varying, strict=True) if vary)


def device_count(mesh_axes: Sequence[tuple[str, int]]) -> int:
    """The number of devices of a mesh: the product of its axis sizes."""
    return math.prod(int(size) for _, size in mesh_axes)
