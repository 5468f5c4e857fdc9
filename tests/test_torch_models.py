"""PyTorch models of two families, and the bundled PyTorch example, through toast end to end (``pip install
'toast[torch]'``; skipped without torch, torchax, optax or transformers).

* Hugging Face ``LlamaForCausalLM`` (a decoder: causal mask, RoPE, grouped KV heads, RMSNorm, SwiGLU) and
  ``ViTForImageClassification`` (an encoder over image patches: a strided convolution, a [CLS] token, LayerNorm,
  GELU, a classification loss), tiny random configs (``tests/torch_models.py``), and ``toast.examples.torch_gpt``
  (plain ``torch.nn``): every op of each training step has a rule and a kernel class, and the step computes eager
  PyTorch's loss and gradient.
* A strategy toast finds for each HF model on ``batch=4,model=2`` runs on 8 host CPU devices with the unsharded
  step's outputs, and XLA's collectives are the predicted ones (``toast validate``).
* ``toast.torch.autoshard`` on a module: the strategy's argument names are the step's (``state_dict`` names nested).
"""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest

import toast
from toast.cli import main
from toast.frontend.torch_step import require_torch, state_dict_name, step_arguments, training_step
from toast.search import Budget

MODELS = {"llama": "torch_models:tiny_llama", "vit": "torch_models:tiny_vit",
          "torch_gpt": "toast.examples.torch_gpt:gpt"}
# tests/test_torch_frontend.py checks the Llama's ops, arguments, loss and gradient.
OTHERS = ("torch_gpt", "vit")


@pytest.fixture(scope="module")
def torch():
    module = pytest.importorskip("torch")
    try:
        require_torch()
    except toast.InputError as err:
        pytest.skip(str(err))
    pytest.importorskip("optax")
    pytest.importorskip("transformers")
    return module


def _factory(spec):
    from toast.frontend.loading import resolve_factory

    return resolve_factory(spec)


@pytest.mark.parametrize("model", OTHERS)
def test_every_op_has_a_rule_and_a_kernel_class(torch, model):
    analysis = toast.analyze(MODELS[model], engine="embedded")
    assert len(analysis.program.ops) > 1000  # forward, backward and AdamW
    assert not analysis.unruled_ops and not analysis.unpriced_ops and not analysis.invalid


@pytest.mark.parametrize("model", OTHERS)
def test_the_step_is_eager_pytorchs_loss_and_gradient(torch, model):
    """With ``optax.sgd(1.0)`` the step's new parameters are ``p - grad``: eager PyTorch's gradient of its loss."""
    import optax

    module, inputs = _factory(MODELS[model])()
    fn, _ = training_step(module, inputs, optimizer=optax.sgd(1.0))
    params, _, loss = jax.jit(fn)(*step_arguments(module, inputs, optimizer=optax.sgd(1.0)))
    output = module(**inputs)
    eager = output if isinstance(output, torch.Tensor) else output.loss
    eager.backward()
    assert abs(float(loss) - eager.item()) <= 1e-5 * max(1.0, abs(eager.item()))
    moved = {state_dict_name(path): leaf for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]}
    assert sorted(moved) == sorted(name for name, p in module.named_parameters() if p.requires_grad)
    for name, parameter in module.named_parameters():
        np.testing.assert_allclose(np.asarray(moved[name]), (parameter - parameter.grad).detach().numpy(),
                                   atol=2e-5, err_msg=name)


def _validates(spec, tmp_path):
    """``toast autoshard`` on batch=4,model=2 (h100, a small budget), then ``toast validate`` of its strategy on 8
    host devices: the numerics match (status 0) and every collective XLA runs was predicted."""
    strategy = tmp_path / "strategy.json"
    report = tmp_path / "validate.json"
    assert main(["autoshard", spec, "--mesh", "batch=4,model=2", "--hardware", "h100", "--rollouts", "64",
                 "--workers", "1", "--engine", "embedded", "-o", str(strategy)]) == 0
    assert main(["validate", spec, str(strategy), "--devices", "8", "--engine", "embedded",
                 "--json", str(report)]) == 0
    found = json.loads(report.read_text())
    assert found["numerics"]["match"]
    rows = found["collectives"]
    assert rows and all(row["predicted"] == row["xla"] for row in rows), rows
    return json.loads(strategy.read_text())


def test_a_llama_strategy_validates_on_8_host_devices(torch, tmp_path):
    document = _validates(f"{MODELS['llama']}?batch=8", tmp_path)
    assert any(entry for argument in document["arguments"] for entry in argument["partition_spec"])  # not replicated


@pytest.mark.slow
def test_a_vit_strategy_validates_on_8_host_devices(torch, tmp_path):
    _validates(f"{MODELS['vit']}?batch=8", tmp_path)


def test_autoshard_a_module_from_python(torch):
    import toast.torch as toast_torch
    from toast.examples.torch_gpt import gpt

    module, inputs = gpt(batch=8, seq=16)
    strategy = toast_torch.autoshard(module, inputs, "batch=4,model=2", hardware="h100", engine="embedded",
                                     budget=Budget(rollouts=32, workers=1))
    specs = strategy.partition_specs
    assert {"input_ids", "labels", "params['blocks'][1]['attn']['q_proj']['weight']", "params['lm_head']['weight']"} \
        <= set(specs)
    assert all(axis in ("batch", "model") for spec in specs.values() for entry in spec if entry
               for axis in (entry if isinstance(entry, tuple) else (entry,)))
    assert strategy.cost["step_time_s"] > 0
