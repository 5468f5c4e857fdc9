"""One rule base, two engines: Soufflé and the embedded engine derive the same relations.

Needs ``souffle`` on PATH. Without it, ``tests/test_goldens.py`` still checks the agreement in
every run: the embedded engine against the committed Soufflé goldens of the bundled examples.
"""

from __future__ import annotations

import pytest
from conftest import SOUFFLE_MISSING, kept_analysis_of

from toast.datalog.souffle import souffle_binary
from toast.examples import EXAMPLES

pytestmark = [pytest.mark.souffle, pytest.mark.skipif(souffle_binary() is None, reason=SOUFFLE_MISSING)]

SPECS = sorted(set(EXAMPLES.values()) - {"toast.examples.gpt:gpt_train_step"})


@pytest.mark.parametrize("spec", SPECS)
def test_engines_agree(spec):
    embedded, embedded_outputs = kept_analysis_of(spec, "embedded")
    souffle, souffle_outputs = kept_analysis_of(spec, "souffle")
    # The engines' outputs of both stages, row for row (what the goldens hold).
    for stage, relations in souffle_outputs.items():
        for name, rows in relations.items():
            assert embedded_outputs[stage][name] == rows, (spec, stage, name)
    # And what Python builds from them.
    assert embedded.identities == souffle.identities
    assert embedded.m_edges == souffle.m_edges
    assert embedded.major_factors == souffle.major_factors
    assert embedded.unruled_ops == souffle.unruled_ops
    assert embedded.colors == souffle.colors
    assert (embedded.node_of == souffle.node_of).all()
    assert embedded.conflicts == souffle.conflicts
    assert embedded.invalid == souffle.invalid == ()
