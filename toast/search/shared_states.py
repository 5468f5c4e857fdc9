"""What a search's worker processes tell each other about states, as soon as one of them has it: a table in
memory they all map (made before they are forked), keyed by a digest of a state's key.

Each worker keeps its own memo of the states it costed (``toast.search.mcts._Memo``); two workers descending
from neighbouring moves at once reach the same states (the original sharding plus its best next action), and each
would price them: on a 70B-shaped step's search in two workers, 649 of the 5,107 states priced up to their
schedule were priced twice (4,458 distinct), and 1,710 states were costed outright where one process costs 1,677.
With the table (4,553 and 1,696 there), a worker about to price a state first looks it up there, and one that
prices a state writes it there. Only numbers pricing gives whoever prices (a state's step time, or a lower bound
of it, and its peak) go in, so what a search finds does not depend on which worker wrote what, nor when.

Two tables, one for states costed (their step time) and one for states priced up to their schedule (a lower bound
of it); a slot is written once, under one lock shared by the workers, which every read takes too (so no reader
sees a half-written slot, on any processor). A key is found by 96 bits of it (Python's hash and a CRC-32: two of a
search's states sharing them, about one chance in 10**20). A table more than half full takes no more states: the
workers then price those themselves, as without it. A process that waits ``LOCK_TIMEOUT_S`` for the lock (its
holder was killed holding it: SIGKILL, the kernel's out-of-memory killer) stops using the table, and prices
everything itself, rather than hang.
"""

from __future__ import annotations

import mmap
import zlib
from typing import Any

# Slots per table (a power of two): a search's default budget scores about 10,000 states; a table half full takes
# no more.
DEFAULT_SLOTS = 1 << 16
_COSTED, _BOUNDED = 0, 1
# Per slot: the digest's two halves (the first never 0 in a written slot: 0 marks a free slot), the step time's
# bits (float64: seconds, a lower bound in the bounded table) and the peak (bytes).
_FIELDS = 4
_WORD = (1 << 64) - 1
# Seconds a process waits for the lock (held for microseconds) before it takes its holder for dead.
LOCK_TIMEOUT_S = 1.0


class SharedStates:
    """States' step times and peaks every process forked after this is made reads and writes.

    Args:
      slots: slots per table (a power of two).
      context: the ``multiprocessing`` context the workers are forked with (its lock is shared with them).
    """

    def __init__(self, *, context: Any, slots: int = DEFAULT_SLOTS):
        if slots <= 0 or slots & (slots - 1):
            raise ValueError(f"slots must be a power of two, not {slots}")
        self._slots = slots
        # An anonymous mapping is shared with the processes forked from this one (MAP_SHARED).
        self._memory = mmap.mmap(-1, (2 * slots * _FIELDS + 2) * 8)
        # Two views of the same words (a slot's third is a float64), read one word at a time: flat, as
        # ``memoryview`` items (a numpy scalar's read costs several times more).
        self._words = memoryview(self._memory).cast("Q")
        self._floats = memoryview(self._memory).cast("d")
        self._used = 2 * slots * _FIELDS  # the word counting each table's states, after the tables
        self._lock = context.Lock()
        self._off = False  # this process gave up on the table (``LOCK_TIMEOUT_S``)

    def find(self, key: bytes) -> tuple[tuple[float, int] | None, tuple[float, int] | None]:
        """What the processes know of the state: ``(step time s, peak bytes)`` if one costed it, and ``(lower
        bound of its step time s, peak bytes)`` if one priced it up to its schedule (each ``None`` if not)."""
        digest = self._digest(key)
        if not self._acquire():
            return None, None
        try:
            return self._find(_COSTED, digest), self._find(_BOUNDED, digest)
        finally:
            self._lock.release()

    def add_costed(self, key: bytes, step_time_s: float, peak_bytes: int) -> None:
        """The state's step time (seconds) and peak (bytes), as costing it gives."""
        self._add(_COSTED, key, step_time_s, peak_bytes)

    def add_bounded(self, key: bytes, step_bound_s: float, peak_bytes: int) -> None:
        """A lower bound of the state's step time (seconds, ``CostModel.step_time_bound``) and its peak (bytes)."""
        self._add(_BOUNDED, key, step_bound_s, peak_bytes)

    def __len__(self) -> int:
        """States in both tables (0 where this process gave up on the table)."""
        if not self._acquire():
            return 0
        try:
            return self._words[self._used] + self._words[self._used + 1]
        finally:
            self._lock.release()

    def _acquire(self) -> bool:
        """Take the lock; ``False`` (and the table off in this process) where it stays taken ``LOCK_TIMEOUT_S``."""
        if self._off:
            return False
        if self._lock.acquire(False) or self._lock.acquire(timeout=LOCK_TIMEOUT_S):  # free nearly always
            return True
        self._off = True
        return False
    def _digest(self, key: bytes) -> tuple[int, int]:
        """96 bits of the key: Python's hash of it (computed once per bytes object, and the same in forked
        processes: one hash seed) and its CRC-32."""
        return (hash(key) & _WORD) or 1, zlib.crc32(key)

    def _find(self, table: int, digest: tuple[int, int]) -> tuple[float, int] | None:
        """The slot's numbers, under the lock."""
        first, second = digest
        words, mask, base = self._words, self._slots - 1, table * self._slots
        slot = first & mask
        while True:
            at = (base + slot) * _FIELDS
            found = words[at]
            if found == 0:
                return None
            if found == first and words[at + 1] == second:
                return self._floats[at + 2], words[at + 3]
            slot = (slot + 1) & mask

    def _add(self, table: int, key: bytes, seconds: float, peak_bytes: int) -> None:
        first, second = self._digest(key)
        words, mask, base = self._words, self._slots - 1, table * self._slots
        slot = first & mask
        if not self._acquire():
            return
        try:
            if 2 * words[self._used + table] >= self._slots:
                return
            while True:
                at = (base + slot) * _FIELDS
                found = words[at]
                if found == 0:
                    break
                if found == first and words[at + 1] == second:
                    return  # another process wrote it: the same numbers
                slot = (slot + 1) & mask
            # The digest's first half last: a writer killed before it leaves the slot free.
            words[at + 1] = second
            self._floats[at + 2] = seconds
            words[at + 3] = peak_bytes
            words[at] = first
            words[self._used + table] += 1
        finally:
            self._lock.release()
