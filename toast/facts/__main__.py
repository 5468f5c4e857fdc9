"""``python -m toast.facts [nda|conflicts]``: print a stage's declarations file (``rules/schema.dl``,
``rules/conflicts/schema.dl``), generated from ``toast.facts.schema``."""

import sys

from toast.facts.schema import STAGES, schema_dl

chosen = sys.argv[1] if len(sys.argv) > 1 else "nda"
if chosen not in STAGES:
    sys.exit(f"usage: python -m toast.facts [{'|'.join(STAGES)}]")
sys.stdout.write(schema_dl(STAGES[chosen]))
