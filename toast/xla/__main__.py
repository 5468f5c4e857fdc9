"""``python -m toast.xla``: the XLA check worker (``toast.xla.worker.main``), one request per run."""

from toast.xla.worker import main

main()
