"""XLA's host offloading on a GPU: the host link's bandwidth, the device memory it saves, and the step's wait.

``python benchmarks/gpu_host_offload.py OUT.json`` (on a GPU machine; only jax is needed) measures

1. the host link: a jitted copy of a 512 MiB array into pinned host memory and one back to the device (median
   of 10 after 2 warm-ups), bytes/s each way: what a profile's ``[host] bandwidth`` stands for;
2. the chain of tests/test_memory_kinds.py at 8192x8192 bf16: four matmuls whose first product is kept on the
   device until a final reduction, or offloaded to pinned host memory and fetched back for it. XLA's compiled
   memory stats for both (offloaded, the device's temporaries should be one product, 128 MiB, smaller) and their
   median step times; toast prices the offloaded step's wait at ``2 copy - 3 matmul`` (the fetch reads what the
   offload wrote; the reduction was due after the fourth matmul), when that is positive. Once more with an
   optimization barrier before the fetch, as remat's backward reads its residuals;
3. MaxText's form: the gradient of a scan over 8 layers whose remat policy saves, or offloads, each layer's
   ``q`` (bf16[8192,4096], 64 MiB): memory stats and step times of both.

The measurement behind toast's host-transfer pricing (``toast.cost.schedule.host_transfers``).
"""

from __future__ import annotations

import datetime
import json
import sys

import jax
import jax.numpy as jnp

from toast.cost.microbench import median_seconds

HOST, DEVICE = jax.memory.Space.Host, jax.memory.Space.Device


def _median_seconds(fn, *args) -> float:
    return median_seconds(fn, args, warmups=2, runs=10)


def _memory(compiled) -> dict:
    stats = compiled.memory_analysis()
    return {key: int(getattr(stats, key)) for key in dir(stats) if key.endswith("_in_bytes")}


def host_link(nbytes: int = 512 << 20) -> dict:
    device = jax.devices()[0]
    sharding = jax.sharding.SingleDeviceSharding(device)
    on_device = jax.device_put(jnp.ones((nbytes // 4,), jnp.float32), sharding)
    to_host = jax.jit(lambda a: a, out_shardings=sharding.with_memory_kind("pinned_host"))
    to_device = jax.jit(lambda a: a, out_shardings=sharding.with_memory_kind("device"))
    on_host = jax.block_until_ready(to_host(on_device))
    down, up = _median_seconds(to_host, on_device), _median_seconds(to_device, on_host)
    return {"bytes": nbytes, "to_host_s": down, "to_device_s": up, "to_host_bytes_per_s": nbytes / down,
            "to_device_bytes_per_s": nbytes / up}


def _chain(offload: bool, barrier: bool = False):
    def chain(x, w):
        a = x @ w
        kept = jax.device_put(a, HOST) if offload else a
        b = a @ w
        c = b @ w
        d = c @ w
        if barrier:  # as remat's backward reads its residuals: after an optimization barrier
            kept, d = jax.lax.optimization_barrier((kept, d))
        back = jax.device_put(kept, DEVICE) if offload else kept
        return jnp.sum(back.astype(jnp.float32) * d.astype(jnp.float32))
    return chain


def scan(layers: int = 8, batch: int = 8192, width: int = 4096) -> dict:
    """A scan over layers whose remat policy saves (``kept``) or offloads each layer's ``q``: MaxText's form."""
    from jax.ad_checkpoint import checkpoint_name

    policies = {
        "kept": jax.checkpoint_policies.save_only_these_names("q"),
        "offloaded": jax.checkpoint_policies.save_and_offload_only_these_names(
            names_which_can_be_saved=[], names_which_can_be_offloaded=["q"], offload_src="device",
            offload_dst="pinned_host"),
    }
    key = jax.random.PRNGKey(0)
    ws = jax.random.normal(key, (layers, width, width), jnp.bfloat16) * 0.01
    x = jax.random.normal(jax.random.fold_in(key, 1), (batch, width), jnp.bfloat16)
    found: dict = {"layers": layers, "q_bytes": batch * width * 2}
    for name, policy in policies.items():
        def layer(h, w, policy=policy):
            q = checkpoint_name(h @ w, "q")
            return h + jnp.sin(q), None

        def loss(ws, x, layer=layer, policy=policy):
            h, _ = jax.lax.scan(jax.checkpoint(layer, policy=policy), x, ws)
            return jnp.sum(h.astype(jnp.float32))

        compiled = jax.jit(jax.grad(loss)).lower(ws, x).compile()
        found[name] = {"memory": _memory(compiled), "step_s": _median_seconds(compiled, ws, x)}
    return found


def chain(n: int = 8192) -> dict:
    key = jax.random.PRNGKey(0)
    x = jax.random.normal(key, (n, n), jnp.bfloat16) * 0.01
    w = jax.random.normal(jax.random.fold_in(key, 1), (n, n), jnp.bfloat16) * 0.01
    found: dict = {"n": n, "product_bytes": n * n * 2}
    for name, offload, barrier in (("kept", False, False), ("offloaded", True, False),
                                   ("offloaded_behind_barrier", True, True)):
        compiled = jax.jit(_chain(offload, barrier)).lower(x, w).compile()
        found[name] = {"memory": _memory(compiled), "step_s": _median_seconds(compiled, x, w)}
    matmul = jax.jit(lambda x, w: x @ w).lower(x, w).compile()
    found["matmul_s"] = _median_seconds(matmul, x, w)
    return found


def main() -> None:
    out = sys.argv[1] if len(sys.argv) > 1 else "gpu_host_offload.json"
    result: dict = {"date": datetime.date.today().isoformat(), "device": str(jax.devices()[0].device_kind),
                    "jax": jax.__version__}
    for name, measure in (("host_link", host_link), ("chain", chain), ("scan", scan)):
        try:
            result[name] = measure()
        except Exception as err:  # one part failing still reports the other
            result[name] = {"error": f"{type(err).__name__}: {err}"[:2000]}
        print(name, json.dumps(result[name], indent=1), flush=True)
    with open(out, "w") as file:
        json.dump(result, file, indent=1)


if __name__ == "__main__":
    main()
