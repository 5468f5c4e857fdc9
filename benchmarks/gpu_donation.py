"""XLA's memory with and without donated parameters, and step times, for the GPU reference programs.

``python benchmarks/gpu_donation.py OUT.json`` (on a GPU machine) builds the ten programs of
``../shared/reference/gpu-h100/programs.py`` from ``toast/examples`` (loaded by file path, so only jax is
needed), compiles each with ``jax.jit`` as is and with ``donate_argnums=(0,)`` (the parameters: the new
parameters may reuse their buffers), and records XLA's compiled memory stats for both and the median step
time (3 warm-ups, 20 runs) of the undonated one. The measurement of ``toast cost --donate``.
"""

from __future__ import annotations

import datetime
import importlib.util
import json
import pathlib
import statistics
import sys
import time

import jax
import jax.numpy as jnp

EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / "toast" / "examples"


def _example(name: str):
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _memory(compiled) -> dict:
    stats = compiled.memory_analysis()
    return {key: int(getattr(stats, key)) for key in dir(stats) if key.endswith("_in_bytes")}


def _inputs(args, *, nodes_bound: int):
    """Random floats; integers uniform in ``[0, nodes_bound)`` (all zeros when 0; labels and tokens < 4)."""
    key = jax.random.PRNGKey(0)
    leaves, tree = jax.tree.flatten(args)
    values = []
    for i, s in enumerate(leaves):
        k = jax.random.fold_in(key, i)
        if jnp.issubdtype(s.dtype, jnp.floating):
            values.append(jax.random.normal(k, s.shape, jnp.float32).astype(s.dtype) * 0.02)
        elif nodes_bound == 0:
            values.append(jnp.zeros(s.shape, s.dtype))
        else:
            bound = nodes_bound if s.shape and s.shape[0] > 100_000 else 4
            values.append(jax.random.randint(k, s.shape, 0, bound, dtype=s.dtype))
    return jax.tree.unflatten(tree, values)


def main() -> None:
    gpt, convnet, gnn, attention = (_example(n) for n in ("gpt", "convnet", "gnn", "attention"))
    bf = jnp.bfloat16
    programs = {
        "gpt2s_L12_B8_S1024_bf16": lambda: gpt.gpt_train_step(layers=12, batch=8, seq=1024, dtype=bf),
        "gpt2s_L12_B2_S1024_bf16": lambda: gpt.gpt_train_step(layers=12, batch=2, seq=1024, dtype=bf),
        "gpt2s_L12_B8_S1024_f32": lambda: gpt.gpt_train_step(layers=12, batch=8, seq=1024),
        "gpt2s_L12_B32_S128_bf16": lambda: gpt.gpt_train_step(layers=12, batch=32, seq=128, dtype=bf),
        "gpt2s_scan_L12_B8_S1024_bf16": lambda: gpt.gpt_train_step(layers=12, batch=8, seq=1024, dtype=bf,
                                                                   scan_layers=True),
        "gpt2m_L24_B4_S1024_bf16": lambda: gpt.gpt_train_step(layers=24, batch=4, seq=1024, d_model=1024,
                                                              heads=16, dtype=bf),
        "gpt_L4_B16_S512_D2048_bf16": lambda: gpt.gpt_train_step(layers=4, batch=16, seq=512, d_model=2048,
                                                                 heads=16, dtype=bf),
        "convnet_B256_128px_bf16": lambda: convnet.convnet(batch=256, height=128, width=128, c1=64, c2=128,
                                                           dtype=bf),
        "gnn_N100k_E1M_bf16": lambda: gnn.gnn(nodes=100_000, edges=1_000_000, features=128, hidden=256, dtype=bf),
        "attention_S8192_f32": lambda: attention.attention(seq=8192, d_model=1024, h1=512, h2=512),
    }
    rows = {}
    for name, make in programs.items():
        fn, args = make()
        plain = jax.jit(fn).lower(*args).compile()
        row = {"memory_bytes": _memory(plain)}
        if not name.startswith("attention"):
            donated = jax.jit(fn, donate_argnums=(0,)).lower(*args).compile()
            row["donated_memory_bytes"] = _memory(donated)
        for label, bound in (("", None), ("_zero_indices", 0)):
            if label and not name.startswith("gnn"):
                continue
            concrete = _inputs(args, nodes_bound=bound if bound is not None else (100_000 if name.startswith("gnn")
                                                                                  else 4))
            for _ in range(3):
                jax.block_until_ready(plain(*concrete))
            times = []
            for _ in range(20):
                start = time.perf_counter()
                jax.block_until_ready(plain(*concrete))
                times.append(time.perf_counter() - start)
            row["step_ms_median" + label] = statistics.median(times) * 1e3
        rows[name] = row
        print(name, f"{row['step_ms_median']:.2f} ms", row["memory_bytes"]["peak_memory_in_bytes"],
              row.get("donated_memory_bytes", {}).get("peak_memory_in_bytes"), flush=True)
    device = jax.devices()[0]
    result = {"device": getattr(device, "device_kind", str(device)), "jax": jax.__version__,
              "date": datetime.date.today().isoformat(),
              "how": "jax.jit(fn) and jax.jit(fn, donate_argnums=(0,)) compiled; compiled.memory_analysis(); "
                     "median of 20 runs after 3 warm-ups on random normal floats x0.02, integers uniform in [0, 4) "
                     "except the GNN's edge endpoints in [0, nodes) (and, as step_ms_median_zero_indices, all zero)",
              "programs": rows}
    with open(sys.argv[1], "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
