"""``python -m toast``: the ``toast`` command."""

from toast.cli import run

run()
