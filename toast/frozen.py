"""Frozen dataclasses that pickle through their constructor.

A frozen dataclass with ``slots=True`` unpickles field by field through ``dataclasses.fields()`` for each
object: most of the time of reading a cached analysis (tens of thousands of identities, dims and ops) back.
Calling the constructor with the fields in order is several times faster and gives the same object.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["constructor", "pickled_by_constructor"]

T = TypeVar("T")


def pickled_by_constructor(cls: type[T]) -> type[T]:
    """Class decorator: instances of the frozen dataclass ``cls`` pickle as ``cls(*fields)``.

    Every field must be an ``__init__`` parameter (no ``init=False`` fields).
    """
    fields = dataclasses.fields(cls)  # type: ignore[arg-type]
    if any(not field.init for field in fields):
        raise TypeError(f"{cls.__name__}: a field that is not an __init__ parameter cannot be rebuilt by it")
    names = [field.name for field in fields]
    values = operator.attrgetter(*names)

    def __reduce__(self: Any) -> tuple[Any, ...]:
        return (cls, values(self) if len(names) > 1 else (values(self),))

    cls.__reduce__ = __reduce__  # type: ignore[assignment,method-assign]
    return cls


def constructor(cls: type[T]) -> Callable[..., T]:
    """A function building an instance of the frozen, slotted dataclass ``cls`` from all its fields, in order and
    by position: the object ``cls(*fields)`` is, in about half the time (the fields set through their slots'
    descriptors, as the dataclass's ``__init__`` sets them through ``object.__setattr__``; no ``__init__`` call).
    For the hot loops that build hundreds of thousands of ops, values and identities.

    Raises:
      TypeError: ``cls`` has a ``__post_init__``, a field that is not an ``__init__`` parameter, or no slots.
    """
    fields = dataclasses.fields(cls)  # type: ignore[arg-type]
    if hasattr(cls, "__post_init__") or any(not field.init for field in fields):
        raise TypeError(f"{cls.__name__}: its constructor does more than set its fields")
    setters = {}
    for k, field in enumerate(fields):
        slot = cls.__dict__.get(field.name)
        if slot is None or not hasattr(slot, "__set__") or type(slot).__name__ != "member_descriptor":
            raise TypeError(f"{cls.__name__}: field {field.name} is not a slot")
        setters[f"_set{k}"] = slot.__set__
    parameters = ", ".join(f"f{k}" for k in range(len(fields)))
    body = "".join(f"    _set{k}(self, f{k})\n" for k in range(len(fields)))
    defaults = ", ".join(f"_set{k}=_set{k}" for k in range(len(fields)))
    source = (f"def make({parameters}, *, _new=_new, _cls=_cls, {defaults}):\n"
              f"    self = _new(_cls)\n{body}    return self\n")
    namespace: dict[str, Any] = {"_new": object.__new__, "_cls": cls, **setters}
    exec(source, namespace)  # noqa: S102 - generated from the field count only, as dataclasses does
    make = namespace["make"]
    make.__qualname__ = make.__name__ = f"make_{cls.__name__}"
    make.__doc__ = f"``{cls.__name__}(*fields)``, built field by field (``toast.frozen.constructor``)."
    return make  # type: ignore[no-any-return]
