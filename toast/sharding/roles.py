"""Roles: which argument dims play which part in a model; the data manual strategies are built from.

A role names dims of the program's arguments by argument name and dim: the batch dim of the
tokens, the heads dim of the attention weights, the hidden dim of the MLP, the sequence dim, the
experts dim of a mixture of experts' stacked weights.
The strategies (``toast.sharding.strategies``) shard the colors of these dims, so they need
nothing else from the program. Roles are data, written in a TOML roles file::

    [roles]
    batch = ["tokens:0"]
    sequence = ["tokens:1"]
    heads = ["params['blocks'][*]['wq']:1", "params['blocks'][*]['wv']:1"]
    mlp = ["params['blocks'][*]['w_fc']:1"]
    experts = ["params['blocks'][*]['w_in']:0"]  # a mixture of experts' w_in [E, D, F]

Each entry is ``NAME:DIM``: an argument name as ``toast analyze`` prints it (``x``,
``params['w1']``), where only ``*`` is a wildcard (any characters), and after the last colon
the dim (0-based) of that argument. A role is one entry or a list of them. The roles are
``ROLE_NAMES``; a strategy uses some of them (``toast.sharding.strategies.EXPERT_STRATEGIES``).

An optional ``[axes]`` table says which mesh axes a role's colors go on, each a list of axis names
(major to minor), and ``params`` the axes FSDP stores the parameters on: MaxText's batch over
``data`` x ``fsdp`` with the parameters stored over ``fsdp``::

    [axes]
    batch = ["data", "fsdp"]
    params = ["fsdp"]

A role it leaves out takes each strategy's own axes (``toast.sharding.strategies``: for most, the batch
on the data axis, the other roles on the model axis, the parameters on the batch's axes).

``roles_for_input`` finds the roles of what ``toast shard`` reads: an explicit roles file,
else, for a ``module:function`` input, the file ``<module>.roles.toml`` beside the module
(the bundled examples ship theirs in ``toast/examples/``); a ``--batch ARG:DIM`` hint gives
the batch role (over the file's, if any).
"""

from __future__ import annotations

import importlib.util
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from toast.errors import ToastError
from toast.toml_files import read_toml

ROLE_NAMES = ("batch", "heads", "mlp", "sequence", "experts")
AXES_KEYS = (*ROLE_NAMES, "params")  # keys of the [axes] table: the roles, and FSDP's storage axes
ROLES_SUFFIX = ".roles.toml"
_AXIS_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")  # as toast.sharding.mesh spells an axis

PROPOSED_SOURCE = "roles proposed from the analysis"  # Roles.source of toast.sharding.propose's roles


@dataclass(frozen=True, slots=True)
class Roles:
    """Role name -> the argument dims that play it, e.g. ``Roles({"batch": [("x", 0)]})``.

    Attributes:
      dims: role (one of ``ROLE_NAMES``) -> ``(argument-name pattern, dim)`` pairs; a pattern
        matches whole argument names with ``*`` for any characters; ``dim`` indexes the
        argument's shape from 0. Stored as a read-only mapping of tuples.
      source: where the roles come from, for messages: a file path, ``--batch x:0``.
      axes: ``AXES_KEYS`` entry -> the mesh axes it uses, major to minor (``{"batch": ("data", "fsdp"),
        "params": ("fsdp",)}``); a key left out takes the strategies' default. Stored read-only.
    """

    dims: Mapping[str, Sequence[tuple[str, int]]]
    source: str = "the roles given"
    axes: Mapping[str, Sequence[str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        checked = {}
        for role, pairs in self.dims.items():
            _check_role_name(role, self.source)
            for pair in pairs:
                if not (isinstance(pair, tuple) and len(pair) == 2 and isinstance(pair[0], str) and pair[0]
                        and isinstance(pair[1], int) and pair[1] >= 0):
                    raise ToastError(f"{self.source}: role '{role}': {pair!r} is not (argument name, dim >= 0)")
            checked[role] = tuple(pairs)
        object.__setattr__(self, "dims", MappingProxyType(checked))
        axes = {}
        for key, names in self.axes.items():
            axes[key] = _checked_axes(key, names, self.source)
        object.__setattr__(self, "axes", MappingProxyType(axes))

    def get(self, role: str) -> tuple[tuple[str, int], ...]:
        """The ``(pattern, dim)`` pairs of ``role``; empty when the roles lack it."""
        return tuple(self.dims.get(role, ()))

    def axes_of(self, key: str) -> tuple[str, ...]:
        """The mesh axes ``key`` (a role or ``params``) uses; empty where the roles leave it to the default."""
        return tuple(self.axes.get(key, ()))

    def to_toml(self) -> str:
        """The roles as a roles file (``load_roles`` reads it back to equal roles), headed by their source."""
        lines = [f"# {line}" for line in self.source.splitlines()] + ["[roles]"]
        lines += [f"{role} = [{', '.join(json.dumps(f'{name}:{dim}') for name, dim in self.dims[role])}]"
                  for role in ROLE_NAMES if role in self.dims]
        if self.axes:
            lines += ["", "[axes]"] + [f"{key} = [{', '.join(json.dumps(a) for a in self.axes[key])}]"
                                       for key in AXES_KEYS if key in self.axes]
        return "\n".join(lines) + "\n"


def _checked_axes(key: str, names: object, source: str) -> tuple[str, ...]:
    """An ``[axes]`` entry as a tuple of distinct axis names; a one-line error naming ``source`` otherwise."""
    if key not in AXES_KEYS:
        raise ToastError(f"{source}: [axes] has unknown key '{key}' (known: {', '.join(AXES_KEYS)})")
    if isinstance(names, str):
        names = (names,)
    if (not isinstance(names, list | tuple) or not names
            or not all(isinstance(n, str) and _AXIS_NAME.match(n) for n in names)):
        raise ToastError(f"{source}: [axes] {key} should be a list of mesh axis names, e.g. [\"data\", \"fsdp\"]")
    if len(set(names)) < len(names):
        raise ToastError(f"{source}: [axes] {key} names a mesh axis twice")
    return tuple(names)


def _check_role_name(role: str, source: str) -> None:
    if role not in ROLE_NAMES:
        raise ToastError(f"{source}: unknown role '{role}' (known: {', '.join(ROLE_NAMES)})")


def _parse_role_dim(text: str, *, where: str) -> tuple[str, int]:
    """``NAME:DIM`` split at the last colon (names hold colons and brackets) into ``(name, dim)``.

    Args:
      text: the entry, e.g. ``params['wq']:1``.
      where: what holds it, to start the error message (a file and role, or ``--batch``).
    """
    name, sep, dim = text.rpartition(":")
    if not sep or not name:
        raise ToastError(f"{where}: '{text}' should be NAME:DIM, e.g. x:0 or params['wq']:1")
    if not dim.isdigit():
        raise ToastError(f"{where}: '{text}': dim '{dim}' is not an integer >= 0")
    return name, int(dim)


def load_roles(path: str | Path) -> Roles:
    """Read a roles file (the module docstring has the format).

    Raises:
      ToastError: one line naming the file (and line:column, for TOML syntax errors): no such
        file, malformed TOML, unknown keys or roles, an entry not ``NAME:DIM``.
    """
    path = Path(path)
    if not path.is_file():
        raise ToastError(f"{path}: no such roles file")
    data = read_toml(path, what="roles file")
    unknown = sorted(set(data) - {"roles", "axes"})
    if unknown or not isinstance(data.get("roles"), dict) or not isinstance(data.get("axes", {}), dict):
        found = (f"unknown key '{unknown[0]}'" if unknown else "no [roles] table" if "roles" not in data
                 else "'roles' is not a table" if not isinstance(data["roles"], dict) else "'axes' is not a table")
        raise ToastError(f"{path}: {found}; a roles file has one [roles] table, e.g. batch = [\"x:0\"], and may "
                         "have an [axes] table, e.g. batch = [\"data\", \"fsdp\"]")
    dims = {}
    for role, entries in data["roles"].items():
        _check_role_name(role, str(path))
        if isinstance(entries, str):
            entries = [entries]
        if not isinstance(entries, list) or not all(isinstance(e, str) for e in entries):
            raise ToastError(f"{path}: role '{role}' should be a list of \"NAME:DIM\" strings")
        dims[role] = tuple(_parse_role_dim(entry, where=f"{path}: role '{role}'") for entry in entries)
    return Roles(dims, source=str(path), axes=data.get("axes", {}))


def _roles_beside_module(source: str) -> Path | None:
    """The roles file shipped beside the module of a ``module:function`` input:
    ``<module directory>/<last module name>.roles.toml`` (``toast/examples/gpt.roles.toml`` for
    ``toast.examples.gpt:gpt_small``); ``None`` for a file input or when there is none."""
    module, sep, _ = source.partition(":")
    if not sep or source.endswith(".mlir") or Path(source).is_file():
        return None
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None  # the analysis reports the unknown module
    if spec is None or not spec.origin:
        return None
    path = Path(spec.origin).with_name(module.rpartition(".")[2] + ROLES_SUFFIX)
    return path if path.is_file() else None


def roles_for_input(source: str, *, roles_path: str | Path | None = None, batch: str | None = None) -> Roles:
    """The roles ``toast shard`` applies to ``source`` (a ``.mlir`` file or ``module:function``).

    Args:
      source: the program input, as ``toast shard`` takes it.
      roles_path: a roles file; without it, the one beside a ``module:function``'s module
        (``_roles_beside_module``), if any.
      batch: ``ARG:DIM`` naming the batch dim (``ids:0``); it replaces the file's batch role.

    Returns:
      The roles, possibly empty (then every strategy reports the role it needs).
    """
    path = roles_path if roles_path is not None else _roles_beside_module(source)
    roles = load_roles(path) if path is not None else Roles({}, source=f"no roles file for {source}")
    if batch is None:
        return roles
    hint = f"--batch {batch}"
    dims = {**roles.dims, "batch": (_parse_role_dim(batch, where="--batch"),)}
    return Roles(dims, source=f"{roles.source} with {hint}" if path is not None else hint, axes=roles.axes)
