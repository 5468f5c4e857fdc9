"""Frozen dataclasses that pickle through their constructor.

A frozen dataclass with ``slots=True`` unpickles field by field through ``dataclasses.fields()`` for each
object: most of the time of reading a cached analysis (tens of thousands of identities, dims and ops) back.
Calling the constructor with the fields in order is several times faster and gives the same object.
"""

from __future__ import annotations

import dataclasses
import operator
from typing import Any, TypeVar

__all__ = ["pickled_by_constructor"]

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
