"""``python -m toast``: the ``toast`` command."""

from toast.cli import main

raise SystemExit(main())
