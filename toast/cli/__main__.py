"""``python -m toast.cli``: the ``toast`` command."""

from toast.cli.app import main

raise SystemExit(main())
