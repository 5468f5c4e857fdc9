"""``toast.search.shared_states.SharedStates``: the table a search's forked workers read and write at once."""

from __future__ import annotations

import multiprocessing
import os

import pytest

from toast.search.shared_states import SharedStates

FORK = multiprocessing.get_context("fork") if "fork" in multiprocessing.get_all_start_methods() else None
pytestmark = pytest.mark.skipif(FORK is None, reason="the table is for forked workers")


@pytest.mark.filterwarnings("ignore:os.fork:RuntimeWarning")  # JAX's, once imported: the child runs no JAX
def test_a_forked_process_writes_what_its_parent_then_reads():
    table = SharedStates(context=FORK)
    table.add_costed(b"parent", 0.25, 7)
    child = os.fork()
    if child == 0:  # the worker: reads the parent's state, writes two of its own
        ok = table.find(b"parent") == ((0.25, 7), None)
        table.add_costed(b"costed", 1.5, 2**40)
        table.add_bounded(b"bounded", 0.125, 3)
        os._exit(0 if ok else 1)
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert table.find(b"costed") == ((1.5, 2**40), None)
    assert table.find(b"bounded") == (None, (0.125, 3))
    assert table.find(b"never written") == (None, None)
    assert len(table) == 3


def test_a_state_is_written_once_and_a_half_full_table_takes_no_more():
    table = SharedStates(context=FORK, slots=8)
    table.add_costed(b"a", 1.0, 1)
    table.add_costed(b"a", 2.0, 2)  # another process's write of the same state: the first stays
    assert table.find(b"a") == ((1.0, 1), None)
    for name in (b"b", b"c", b"d", b"e", b"f"):
        table.add_costed(name, 3.0, 3)
    assert len(table) == 4  # half of 8 slots
    assert sum(table.find(name)[0] is not None for name in (b"a", b"b", b"c", b"d", b"e", b"f")) == 4
    assert table.find(b"g") == (None, None)  # a probe ends at a free slot


@pytest.mark.parametrize("slots", [0, 6])
def test_slots_are_a_power_of_two(slots):
    with pytest.raises(ValueError, match="power of two"):
        SharedStates(context=FORK, slots=slots)


@pytest.mark.filterwarnings("ignore:os.fork:RuntimeWarning")
def test_a_process_killed_holding_the_lock_turns_the_table_off_instead_of_hanging(monkeypatch):
    """A worker killed (SIGKILL) while it holds the lock: the others wait ``LOCK_TIMEOUT_S`` once, then price
    everything themselves (nothing found, nothing written), never waiting again."""
    import signal
    import time

    from toast.search import shared_states

    monkeypatch.setattr(shared_states, "LOCK_TIMEOUT_S", 0.2)
    table = SharedStates(context=FORK)
    table.add_costed(b"before", 1.0, 1)
    reader, writer = os.pipe()
    child = os.fork()
    if child == 0:
        table._lock.acquire()
        os.write(writer, b"x")
        time.sleep(60)
        os._exit(0)
    os.read(reader, 1)
    os.kill(child, signal.SIGKILL)
    os.waitpid(child, 0)
    start = time.monotonic()
    assert table.find(b"before") == (None, None)
    table.add_costed(b"after", 2.0, 2)
    assert table.find(b"after") == (None, None) and len(table) == 0
    assert time.monotonic() - start < 1.0  # one wait of 0.2 s, not one per call
