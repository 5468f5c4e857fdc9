"""PyTorch models in (``toast.frontend.torch_step``, ``pip install 'toast[torch]'``): a ``module:factory`` returning a
``torch.nn.Module`` and its inputs is traced through torchax as one training step, ``fn(params, opt_state, *inputs)
-> (params, opt_state, loss)``, with the parameters as a nested pytree of their ``state_dict`` names.

The tiny Hugging Face Llama (``tests/torch_models.py``): every op of its step has a rule and a kernel class, the
step's loss and gradient are eager PyTorch's, its parameters' pytree paths are its ``state_dict`` names, a model
given no labels fails in one line, and its ops are located in transformers' code (``toast.frontend.torch_locations``),
as a module of this file's is at its ``forward``'s lines in ``toast explain``. The tests that need torch skip without
it (or without torchax, optax, transformers); the pytree helpers and the missing-package errors are tested without
them."""

from __future__ import annotations

import importlib.machinery
import inspect
import linecache
import os
import re
import sys

import jax
import numpy as np
import pytest

import toast
from toast.cli import main
from toast.errors import InputError
from toast.frontend import torch_step
from toast.frontend.torch_step import nest_state_dict, require_torch, state_dict_name, step_arguments, training_step

LLAMA = "torch_models:tiny_llama"


def _names(tree):
    return [state_dict_name(path) for path, _ in jax.tree_util.tree_flatten_with_path(tree)[0]]


def test_parameters_nest_by_dotted_name_with_list_indices():
    flat = {"model.layers.0.w": 1, "model.layers.1.w": 2, "model.layers.10.w": 3, "model.norm.weight": 4,
            "head.0.weight": 5, "head.2.weight": 6, "lm_head.weight": 7}
    flat.update({f"model.layers.{k}.w": k + 10 for k in range(2, 10)})
    tree = nest_state_dict(flat)
    assert [layer["w"] for layer in tree["model"]["layers"]] == [1, 2, *range(12, 20), 3]  # 0 .. 10, in order
    assert tree["head"] == {"0": {"weight": 5}, "2": {"weight": 6}}  # nn.Sequential around a ReLU: not 0 .. n-1
    assert sorted(_names(tree)) == sorted(flat)
    assert nest_state_dict({"0.weight": 1, "1.weight": 2}) == [{"weight": 1}, {"weight": 2}]


@pytest.mark.parametrize("flat, message", [({"a": 1, "a.b": 2}, "'a.b': a is a tensor"),
                                           ({"a.b": 2, "a": 1}, "'a': a module"),
                                           ({"a..b": 1}, "not a dotted state_dict name")])
def test_nesting_refuses_names_that_are_not_a_state_dict(flat, message):
    with pytest.raises(ValueError, match=message):
        nest_state_dict(flat)


def test_missing_torch_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(InputError, match=r"^a PyTorch model needs torch and torchax: pip install 'toast\[torch\]'$"):
        require_torch()
    assert not torch_step.is_torch_module(object())


class _Failing:
    """Finds a ``torchax`` whose import fails as torchax 0.0.13's does on torch 2.13."""

    @classmethod
    def find_spec(cls, name, path=None, target=None):
        return importlib.machinery.ModuleSpec(name, cls) if name == "torchax" else None

    @staticmethod
    def create_module(spec):
        return None

    @staticmethod
    def exec_module(module):
        raise RuntimeError("no overload name 'dim_Dimname'\nmore detail")


def test_missing_or_incompatible_torchax_says_what_to_install(monkeypatch):
    pytest.importorskip("torch")
    monkeypatch.setitem(sys.modules, "torchax", None)
    with pytest.raises(InputError, match=r"^tracing a PyTorch model needs torchax: pip install 'toast\[torch\]'$"):
        require_torch()
    monkeypatch.delitem(sys.modules, "torchax")
    monkeypatch.setattr(sys, "meta_path", [_Failing, *sys.meta_path])
    with pytest.raises(InputError) as raised:
        require_torch()
    message = str(raised.value)
    assert message.startswith("torchax does not import with torch ") and "\n" not in message
    assert "RuntimeError: no overload name 'dim_Dimname'" in message and "pip install 'toast[torch]'" in message


@pytest.fixture(scope="module")
def torch():
    module = pytest.importorskip("torch")
    try:
        require_torch()
    except InputError as err:
        pytest.skip(str(err))
    pytest.importorskip("optax")
    return module


@pytest.fixture(scope="module")
def llama(torch):
    pytest.importorskip("transformers")
    from torch_models import tiny_llama

    return tiny_llama


@pytest.fixture(scope="module")
def llama_analysis(llama):
    return toast.analyze(LLAMA, engine="embedded")


def test_every_op_of_the_llama_step_has_a_rule_and_a_kernel_class(llama_analysis):
    program = llama_analysis.program
    assert len(program.ops) > 1000  # forward, backward and AdamW of two layers
    assert not llama_analysis.unruled_ops and not llama_analysis.unpriced_ops and not llama_analysis.invalid
    arguments = {program.values[k].name for k in program.arguments}
    assert {"input_ids", "labels", "params['model']['layers'][1]['self_attn']['q_proj']['weight']",
            "params['lm_head']['weight']"} <= arguments
    assert program.name == "jit_LlamaForCausalLM_training_step"


def test_the_llama_parameters_are_its_state_dict_as_a_nested_pytree(llama):
    model, inputs = llama()
    _, (params, opt_state, input_ids, labels) = training_step(model, inputs)
    assert sorted(_names(params)) == sorted(model.state_dict())  # inv_freq is a constant, not a parameter
    assert isinstance(params["model"]["layers"], list) and len(params["model"]["layers"]) == 2
    assert params["model"]["embed_tokens"]["weight"] == jax.ShapeDtypeStruct((256, 64), np.float32)
    assert input_ids == labels == jax.ShapeDtypeStruct((2, 16), np.int32)  # int64 without x64
    adam = opt_state[0]  # optax.adamw: (ScaleByAdamState(count, mu, nu), ...)
    assert jax.tree.structure(adam.mu) == jax.tree.structure(params)


def test_the_llama_step_is_eager_pytorchs_loss_and_gradient(torch, llama):
    import optax

    model, inputs = llama()
    fn, _ = training_step(model, inputs, optimizer=optax.sgd(1.0))  # new params = params - gradient
    args = step_arguments(model, inputs, optimizer=optax.sgd(1.0))
    params, _, loss = jax.jit(fn)(*args)
    eager = model(**inputs).loss
    eager.backward()
    assert abs(float(loss) - eager.item()) <= 1e-5
    moved = {state_dict_name(path): leaf for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]}
    for name, parameter in model.named_parameters():
        expected = (parameter - parameter.grad).detach().numpy()
        np.testing.assert_allclose(np.asarray(moved[name]), expected, atol=1e-5, err_msg=name)


# The tiny Llama's parameters (hidden 64, MLP 128, 4 heads of 16, 2 KV heads, vocabulary 256), float32 gradients:
# embed_tokens and lm_head [256, 64]: 65536 B each; per layer q_proj and o_proj [64, 64]: 16384 B, k_proj and
# v_proj [32, 64]: 8192 B, gate_proj and up_proj [128, 64], down_proj [64, 128]: 32768 B, input_layernorm and
# post_attention_layernorm [64]: 256 B; the final norm [64]: 256 B. 2 x 65536 + 2 x (2 x 16384 + 2 x 8192 +
# 3 x 32768 + 2 x 256) + 256 = 427264 B = 106816 parameters x 4 B.
LLAMA_GRADIENT_BYTES = [65536] * 2 + [32768] * 6 + [16384] * 4 + [8192] * 4 + [256] * 5


def test_the_llama_loss_keeps_the_batch_split_under_data_parallelism(llama, llama_analysis):
    """HF's own loss (ForCausalLMLoss: cross_entropy -> nll_loss, through torchax) picks each label's
    log-probability with a coordinate gather, logp[arange(32), labels] of the [batch x seq = 32, vocab = 256]
    log-probabilities, and its gradient with the matching scatter-add. Split along batch=2, each device picks
    from its own 16 rows: data parallelism moves only each parameter's gradient (one all-reduce of its bytes,
    above) and the loss's two scalars, its sum over the labels and their count (float32 and int32: 4 B each).
    Without the coordinate rule the gather's operand rows were not the batch: an all-gather of the
    log-probabilities (16384 -> 32768 B per device) and a reduce-scatter of their gradient."""
    model, _ = llama()
    assert sum(p.numel() for p in model.parameters()) * 4 == sum(LLAMA_GRADIENT_BYTES) == 427264
    sharding = toast.ShardingModel(llama_analysis, toast.parse_mesh("batch=2"))
    state, _ = toast.manual_strategy(sharding, "data_parallel", toast.Roles({"batch": [("input_ids", 0)]}))
    cost = toast.CostModel(sharding, toast.load_hardware("a100_80gb")).evaluate(state)
    moved = sorted((c.kind, c.axes, c.bytes_in, c.bytes_out) for c in cost.collectives)
    expected = [("all-reduce", ("batch",), size, size) for size in LLAMA_GRADIENT_BYTES + [4, 4]]
    assert moved == sorted(expected)
    # The labels' batch is the inputs' (through the gather's indices, its rows and the logits).
    assert llama_analysis.color_of_dim("labels", 0) == llama_analysis.color_of_dim("input_ids", 0)


@pytest.mark.slow  # about 30 s: XLA compiles and runs the step on 2 host devices
def test_xla_keeps_the_llama_log_probabilities_split_too(llama_analysis):
    """XLA's partitioner, given the same data-parallel step, keeps the log-probabilities split as well: no
    all-gather of their [32, 256] float32 (16384 -> 32768 B per device). It does not use the iota as the rule
    does: it all-gathers the [32, 1, 2] int32 indices (128 -> 256 B) and the scatter-add's [32, 1] float32 updates
    (64 -> 128 B), and each device picks from its own rows with the others masked, then all-reduces the [32, 1]
    picks (128 B, in its one combined all-reduce with the gradients): 512 B toast does not predict. The rest is
    the prediction: the gradients (427264 B) and the loss's sum (float32) and label count (int32)."""
    from toast.xla.worker import check_sharded_module

    sharding = toast.ShardingModel(llama_analysis, toast.parse_mesh("batch=2"))
    state, _ = toast.manual_strategy(sharding, "data_parallel", toast.Roles({"batch": [("input_ids", 0)]}))
    report = check_sharded_module(toast.sharded_module_text(sharding, state), sharding.mesh.axes)
    assert report.numerics.match
    moved = sorted((c.kind, c.axes, c.bytes_in, c.bytes_out) for c in report.collectives)
    combined = sum(LLAMA_GRADIENT_BYTES) + 128
    assert moved == sorted([("all-gather", ("batch",), 128, 256), ("all-gather", ("batch",), 64, 128),
                            ("all-reduce", ("batch",), combined, combined), ("all-reduce", ("batch",), 4, 4),
                            ("all-reduce", ("batch",), 4, 4)])


def test_a_model_given_no_labels_fails_in_one_line(llama, capsys):
    spec = f"{LLAMA}?labels=False"
    with pytest.raises(InputError) as raised:
        toast.analyze(spec, engine="embedded")
    message = str(raised.value)
    assert message.startswith(f"{spec}: the model's output (CausalLMOutputWithPast) has no .loss: ")
    assert "labels=" in message and "loss=" in message and "\n" not in message
    assert main(["analyze", spec, "--engine", "embedded"]) == 2
    stderr = capsys.readouterr().err
    assert stderr.strip().splitlines() == [f"toast: error: {message}"]


def _small(torch):
    """An MLP of a ModuleList (a list in the pytree) and an nn.Sequential around a ReLU (dict keys 0 and 2), a
    persistent and a non-persistent buffer, a frozen parameter; its forward takes (x, y) and returns predictions."""

    class Small(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = torch.nn.ModuleList([torch.nn.Linear(8, 8) for _ in range(2)])
            self.head = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
            self.register_buffer("scale", torch.full((4,), 0.5))
            self.register_buffer("shift", torch.arange(4.0), persistent=False)
            self.frozen = torch.nn.Parameter(torch.ones(8), requires_grad=False)

        def forward(self, x, y):
            for block in self.blocks:
                x = torch.tanh(block(x * self.frozen))
            return self.head(x) * self.scale + self.shift

    torch.manual_seed(0)
    return Small(), (torch.randn(4, 8), torch.randn(4, 4))


def test_a_module_with_a_loss_of_its_own_and_the_default_adamw(torch):
    model, inputs = _small(torch)

    def mse(output, x, y):
        return ((output - y) ** 2).mean()

    fn, example_args = training_step(model, inputs, loss=mse)
    params = example_args[0]
    assert sorted(_names(params)) == sorted(name for name, p in model.named_parameters() if p.requires_grad)
    assert isinstance(params["blocks"], list) and set(params["head"]) == {"0", "2"}
    text = jax.jit(fn).lower(*example_args).as_text(debug_info=True)
    assert 'loc("x")' in text and 'loc("y")' in text  # the inputs are named as forward names them
    new_params, opt_state, loss = jax.jit(fn)(*step_arguments(model, inputs))
    assert abs(float(loss) - mse(model(*inputs), *inputs).item()) <= 1e-6
    first = np.asarray(new_params["blocks"][0]["weight"])
    assert 0 < np.max(np.abs(first - model.blocks[0].weight.detach().numpy())) <= 1.01e-3  # one AdamW step, lr 1e-3


def test_errors_a_pytorch_user_can_act_on(torch):
    model, inputs = _small(torch)
    fn, example_args = training_step(model, inputs)  # the output is [4, 4]: no .loss, and not a scalar
    with pytest.raises(InputError, match=r"^the model's output \(Tensor\) has no \.loss: "):
        jax.jit(fn).lower(*example_args)
    fn, example_args = training_step(model, inputs, loss=lambda output, x, y: output - y)
    with pytest.raises(InputError, match=r"^the loss should be a scalar tensor, not one of shape \[4, 4\]"):
        jax.jit(fn).lower(*example_args)
    with pytest.raises(InputError, match="optimizer should be an optax GradientTransformation"):
        training_step(model, inputs, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(InputError, match="example input 'y' is a list"):
        training_step(model, {"x": inputs[0], "y": [inputs[1]]})


def test_a_module_that_returns_its_loss_with_keyword_inputs_and_a_plain_value(torch):
    model, (x, y) = _small(torch)

    class WithLoss(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, x, y=None, *, scale=1.0):
            return ((self.model(x, y) - y) ** 2).mean() * scale

    wrapped = WithLoss()
    inputs = {"y": y, "scale": 2.0, "x": x}  # keyword order kept; the float is passed as it is
    fn, example_args = training_step(wrapped, inputs)
    trained = [f"model.{name}" for name, p in model.named_parameters() if p.requires_grad]
    assert sorted(_names(example_args[0])) == sorted(trained)  # the frozen parameter and the buffers are constants
    assert [a.shape for a in example_args[2:]] == [(4, 4), (4, 8)]  # y, x: the tensors, in the dict's order
    _, _, loss = jax.jit(fn)(*step_arguments(wrapped, inputs))
    assert abs(float(loss) - wrapped(x, y, scale=2.0).item()) <= 1e-6


def test_a_tensor_forward_makes_with_no_device_is_traced(torch):
    """``torch.arange(n)`` in forward, as code written for the CPU makes it, is a torchax tensor in the step (a CPU
    tensor there fails in torchax: "mixed math between XLATensor and torch.Tensor")."""

    class Shifted(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(8, 8)

        def forward(self, x):
            return (self.linear(x) + torch.arange(8.0) * torch.ones(8)).sum()

    torch.manual_seed(0)
    model, x = Shifted(), torch.randn(2, 8)
    fn, _ = training_step(model, (x,))
    _, _, loss = jax.jit(fn)(*step_arguments(model, (x,)))
    assert abs(float(loss) - model(x).item()) <= 1e-5 * abs(model(x).item())


def _source_line(loc):
    """The text of the Python line ``file:line`` names (``""`` when it names none)."""
    filename, _, line = loc.rpartition(":")
    return linecache.getline(filename, int(line)).strip() if filename else ""


def _line_in(function, text):
    """``file:line`` of the first line of ``function``'s source that contains ``text``, from inspect (a decorated
    function's own, as ``inspect.getsourcelines`` reads it)."""
    function = inspect.unwrap(function)
    lines, first = inspect.getsourcelines(function)
    index = next(i for i, line in enumerate(lines) if text in line)
    return f"{inspect.getsourcefile(function)}:{first + index}"


def test_the_llama_ops_are_located_in_the_models_code_not_torchax(llama_analysis):
    """Each op's location is the innermost frame of the model's code (torch, torchax, JAX and optax frames left out,
    and the frames of whoever called toast): the q_proj matmul at LlamaAttention.forward's line that calls q_proj,
    the attention softmax's exponential where transformers calls scaled_dot_product_attention (or its own softmax),
    the loss's division in transformers' cross entropy; the ops no model frame made (AdamW) at toast's step."""
    import torchax
    from transformers.loss import loss_utils
    from transformers.models.llama import modeling_llama

    program = llama_analysis.program
    q_proj = next(k for k in program.arguments
                  if program.values[k].name == "params['model']['layers'][0]['self_attn']['q_proj']['weight']")
    matmul = next(op for op in program.ops if op.kind == "stablehlo.dot_general" and op.operands[1] == q_proj)
    assert matmul.loc == _line_in(modeling_llama.LlamaAttention.forward, "self.q_proj(")
    assert "self.q_proj(hidden_states)" in _source_line(matmul.loc)

    # the attention scores' exponentials: [batch 2, heads 4, seq 16, seq 16]
    scores = [op for op in program.ops if op.kind == "stablehlo.exponential"
              and program.values[op.operands[0]].shape == (2, 4, 16, 16)]
    assert scores and all("/transformers/" in op.loc for op in scores)
    assert all("scaled_dot_product_attention(" in _source_line(op.loc) or "softmax(" in _source_line(op.loc)
               for op in scores)

    defined_by = {value: op for op in program.ops for value in op.results}
    loss = defined_by[program.results[-1]]  # toast's reshape of the loss to a scalar, then the model's loss
    assert loss.kind == "stablehlo.reshape" and _source_line(loss.loc) == "return jnp.reshape(env.t2j_iso(value), ())"
    mean = defined_by[loss.operands[0]]
    assert mean.kind == "stablehlo.divide"
    assert mean.loc == _line_in(loss_utils.fixed_cross_entropy, "nn.functional.cross_entropy(")

    torchax_dir = os.path.dirname(torchax.__file__) + os.sep
    locations = {op.loc for op in program.ops} | {value.loc for value in program.values}
    assert not [loc for loc in locations if loc.startswith(torchax_dir)]
    # every op is the model's (transformers'), toast's step (AdamW's update, the loss's reshape) or unlocated
    # (the constants JAX hoists out of the step: buffers such as inv_freq); none is this test's or pytest's
    import transformers

    transformers_dir = os.path.dirname(transformers.__file__) + os.sep
    step_file = inspect.getsourcefile(torch_step)
    assert [loc for loc in locations if loc and not loc.startswith((transformers_dir, f"{step_file}:"))] == []
    adam = _line_in(torch_step.training_step, "chosen.update(")
    assert sum(op.loc == adam for op in program.ops) > 100


def two_layers():
    """A module defined here, ``module:factory`` for the CLI: ``up`` 8 -> 16, ReLU, ``down`` 16 -> 4, its MSE."""
    import torch

    class TwoLayers(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.up = torch.nn.Linear(8, 16)
            self.down = torch.nn.Linear(16, 4)

        def forward(self, x, y):
            hidden = torch.relu(self.up(x))
            return ((self.down(hidden) - y) ** 2).mean()

    torch.manual_seed(0)
    return TwoLayers(), (torch.randn(4, 8), torch.randn(4, 4))


def test_explain_names_the_line_of_a_modules_forward(torch, capsys):
    """``toast explain`` on a module defined in this file: the chain from the input's features to the updated ``up``
    weight goes through the matmul of ``self.up(x)``, located at that line of ``forward``, and AdamW's update, located
    at toast's step (not at this test's call of ``main``, the outermost frame, as JAX's locations have it)."""
    assert main(["explain", "test_torch_frontend:two_layers", "x:1", "result[0]['up']['weight']:1",
                 "--engine", "embedded"]) == 0
    out = capsys.readouterr().out
    up_line = _line_in(type(two_layers()[0]).forward, "self.up(x)")
    update_line = _line_in(torch_step.training_step, "optax.apply_updates(")
    assert re.search(rf"identified by stablehlo\.dot_general %\d+ at {re.escape(up_line)}, rule ", out), out
    assert re.search(rf"identified by stablehlo\.add result\[0\]\['up'\]\['weight'\] at {re.escape(update_line)}, "
                     "rule ", out), out
    assert set(re.findall(r" at (\S+:\d+)", out)) == {up_line, update_line}


def test_a_factory_without_the_extra_or_that_fails_is_one_line(monkeypatch, capsys):
    """The bundled PyTorch example without torch installed (``None`` in ``sys.modules`` stops its import) names the
    install command; a factory's own error is its first line; both exit 2 without a traceback."""
    monkeypatch.setitem(sys.modules, "torch", None)
    spec = "toast.examples.torch_gpt:gpt"
    assert main(["analyze", spec, "--engine", "embedded"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"toast: error: {spec}: the factory imports torch, which is not installed: pip install 'toast[torch]'"]
    assert main(["analyze", f"{spec}?heads=5", "--engine", "embedded"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"toast: error: {spec}?heads=5: the factory failed: ValueError: width 64 is not a multiple of heads 5"]
