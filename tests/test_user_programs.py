"""Programs written the way users write them (benchmarks/programs: Flax NNX, Equinox, Hugging Face Flax,
scan + remat, remat per layer, MoE, an NNX DiT, Flax T5, a Mamba + MoE LM), at small sizes: every op has a
rule, and toast, given no roles, finds a strategy no slower than the best manual strategy of the roles file an
expert wrote for the program, that fits where one fits.

The full sizes are BENCHMARKS.md's table (benchmarks/bench_users.py)."""

from __future__ import annotations

import pytest

import toast
from toast.evaluation.compare import compare_manual
from toast.search import Budget
from toast.search.find import find_strategy
from toast.sharding.roles import roles_for_input

PROGRAMS = {
    "benchmarks.programs.nnx_lm:nnx_lm": "flax",
    "benchmarks.programs.equinox_vit:equinox_vit": "equinox",
    "benchmarks.programs.moe:moe": "optax",
    "benchmarks.programs.scan_llama:scan_llama": "optax",
    "benchmarks.programs.llama3:llama3": "optax",
    "benchmarks.programs.hf_whisper:hf_whisper": "transformers",
    "benchmarks.programs.dit:dit": "flax",
    "benchmarks.programs.flax_t5:flax_t5": "transformers",
    "benchmarks.programs.mamba_moe:mamba_moe": "optax",
}
CASES = [("batch=4,model=2", "h100"), ("batch=2,model=2,seq=2", "tpu_v3")]


@pytest.fixture(scope="module", params=sorted(PROGRAMS))
def program(request):
    pytest.importorskip(PROGRAMS[request.param])
    analysis = toast.analyze(request.param, engine="embedded")
    return request.param, analysis


def test_every_op_has_a_rule(program):
    _, analysis = program
    assert not analysis.unruled_ops and not analysis.invalid


@pytest.mark.parametrize("mesh, hardware", CASES)
def test_toast_without_roles_is_no_slower_than_the_experts_roles(program, mesh, hardware):
    spec, analysis = program
    written = roles_for_input(spec)
    assert written.dims, f"{spec} has no roles file"
    found = find_strategy(analysis, toast.parse_mesh(mesh), toast.load_hardware(hardware),
                         budget=Budget(rollouts=200, workers=1))
    assert found.roles is not None and found.roles.source != written.source  # proposed, not the file's
    fitting = [row for row in compare_manual(found, written) if row.cost is not None and not row.over_memory]
    assert fitting, "no manual strategy of the roles file applies"
    best = min(row.cost.step_time_s for row in fitting)
    assert not found.over_memory
    assert found.result.cost.step_time_s <= best * (1 + 1e-9)
