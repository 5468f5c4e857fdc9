"""The published MaxText runs (``../shared/reference/published/maxtext.json``) in toast's cost model: each row's
step, priced with the run's own strategy, against the published step time.

    python benchmarks/bench_maxtext.py [--rows T6 T15 T11 G1] [--engine auto] [--json FILE] [--autoshard ROLLOUTS]

For each row: ``benchmarks/programs/maxtext.py`` writes the row's training step at its global shapes, lowered
for its platform (the Pallas TPU kernels for ``tpu``; for G1 the step with cuDNN's fused attention as lowered on
an H100, ``benchmarks/data/maxtext_g1_cudnn.mlir.gz``, since cuDNN lowers only where it is installed); ``toast.analyze``
reads it; ``manual_strategy(..., "fsdp", ...)`` with ``benchmarks/programs/maxtext.roles.toml`` prices the run's
FSDP on its mesh: ``data=CHIPS`` for one slice, and T15's ``dcn_data 2 x ici_fsdp 64`` as mesh
``data=2,fsdp=64`` on 2 slices (the batch over both axes, the parameters stored over ``fsdp``, ``data`` on DCN);
the arguments donated (MaxText donates the train state), on the row's hardware profile. Prints a Markdown table:
toast's step, the published step and their ratio, the peak memory per device against the chip's HBM, the step's
breakdown (and the exposed host transfers), and the seconds each stage took; notes under it say where the priced
program or strategy differs from the run's. ``--autoshard`` also runs toast's search on the same program and mesh
(its own strategy, not a manual candidate) and sets it against the run's.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
import time
from pathlib import Path
from typing import Any, Literal, NamedTuple

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # benchmarks.programs, when run as a script

from benchmarks.programs import maxtext  # noqa: E402

ROLES = HERE / "programs" / "maxtext.roles.toml"
DATA = HERE / "data"
GIB = 2.0**30
EngineName = Literal["auto", "souffle", "embedded"]
# maxtext.json's accelerator (its start) -> toast's hardware profile.
HARDWARE = (("TPU v5e", "tpu_v5e"), ("TPU v4", "tpu_v4"), ("TPU v6e", "tpu_v6e"), ("H100", "h100"))


def hardware_of(accelerator: str) -> str:
    """The hardware profile of a maxtext.json accelerator, e.g. ``"TPU v6e (Trillium)"`` -> ``tpu_v6e``."""
    for prefix, profile in HARDWARE:
        if accelerator.startswith(prefix):
            return profile
    raise SystemExit(f"bench_maxtext: no hardware profile for accelerator {accelerator!r}")


class RowModel(NamedTuple):
    """A maxtext.json row set up for pricing: its sharding model and the run's strategy on its mesh."""

    model: Any  # toast.ShardingModel
    state: Any  # toast.ShardingState: the run's FSDP
    hardware: Any  # toast.Hardware
    donate: tuple[int, ...]
    roles: Any  # toast.Roles
    settings: dict[str, Any]  # maxtext()'s keywords as priced
    mesh: str  # e.g. "data=2,fsdp=64 on 2 slices"
    profile: str
    notes: list[str]
    seconds: dict[str, float]  # lower, analyze


def row_model(entry: dict[str, Any], *, engine: EngineName, published: Path) -> RowModel:
    """Lower and analyze one maxtext.json row and apply the run's strategy on its mesh."""
    import toast

    notes: list[str] = []
    settings = maxtext.row_settings(entry["id"], published=published)
    start = time.perf_counter()
    lowered_on_gpu = DATA / f"maxtext_{entry['id'].lower()}_cudnn.mlir.gz"
    if "cuDNN" in entry["attention"] and lowered_on_gpu.is_file():
        # cuDNN's fused attention lowers only where cuDNN is: the row's step as lowered on an H100
        # (python -m benchmarks.programs.maxtext --row G1 --attention cudnn, jax 0.11.2).
        settings["attention"] = "cudnn"
        text = gzip.decompress(lowered_on_gpu.read_bytes()).decode()
    else:
        if "cuDNN" in entry["attention"]:
            notes.append("cuDNN flash attention cannot be lowered here: the Pallas GPU (Triton) mha kernel stands in")
        text = maxtext.stablehlo_text(**settings)
    lowered = time.perf_counter()
    analysis = toast.analyze(toast.read_text(text, source=entry["id"]), engine=engine)
    analyzed = time.perf_counter()
    chips = entry["chips"]
    roles = toast.load_roles(ROLES)
    slices = 1
    if "dcn_data" in entry["parallelism"]:
        # MaxText's dcn_data x ici_fsdp: the batch over both axes, the parameters stored over fsdp, the data axis
        # across the slices (DCN).
        slices = int(entry["parallelism"].split("dcn_data ")[1].split()[0])
        mesh = f"data={slices},fsdp={chips // slices}"
        roles = toast.Roles(roles.dims, source=f"{ROLES} with [axes] batch = data x fsdp, params = fsdp",
                            axes={"batch": ("data", "fsdp"), "params": ("fsdp",)})
    else:
        mesh = f"data={chips}"
    profile = hardware_of(entry["accelerator"])
    hardware = toast.load_hardware(profile)
    model = toast.ShardingModel(analysis, toast.parse_mesh(mesh, slices=slices))
    state, _ = toast.manual_strategy(model, "fsdp", roles)
    donate = tuple(range(len(analysis.program.arguments)))
    return RowModel(model, state, hardware, donate, roles, settings,
                    mesh + (f" on {slices} slices" if slices > 1 else ""), profile, notes,
                    {"lower": lowered - start, "analyze": analyzed - lowered})


def price_row(entry: dict[str, Any], *, engine: EngineName, published: Path, autoshard_rollouts: int = 0
              ) -> dict[str, Any]:
    """Lower, analyze and price one maxtext.json row; a dict of the table's columns (seconds, bytes)."""
    import toast

    row = row_model(entry, engine=engine, published=published)
    analysis, hardware = row.model.analysis, row.hardware
    start = time.perf_counter()
    cost = toast.CostModel(row.model, hardware, donate=row.donate).evaluate(row.state)
    priced = time.perf_counter()
    searched: dict[str, Any] = {}
    if autoshard_rollouts:
        # toast autoshard on the same program and mesh: the search's own strategy (not a manual candidate),
        # priced as the run's strategy is (donated arguments), against the run's.
        from toast.search.base import Budget
        from toast.search.find import find_strategy

        found = find_strategy(analysis, row.model.mesh, hardware, roles=row.roles, manual_candidates=False,
                              budget=Budget(rollouts=autoshard_rollouts, seed=0))
        own = toast.CostModel(found.model, hardware, donate=row.donate).evaluate(found.searched.state)
        searched = {"step_s": own.step_time_s, "peak_bytes": own.peak_bytes, "rollouts": autoshard_rollouts,
                    "seconds": time.perf_counter() - priced}
    return {
        "row": entry["id"], "model": entry["model"], "chips": entry["chips"], "hardware": row.profile,
        "mesh": row.mesh, "strategy": "fsdp", "attention": row.settings["attention"], "remat": row.settings["remat"],
        "ops": len(analysis.program.ops), "unruled_ops": [u.kind for u in analysis.unruled_ops],
        "unpriced_ops": [u.kind for u in analysis.unpriced_ops],
        "toast_step_s": cost.step_time_s, "published_step_s": entry["published_step_s"],
        "ratio": cost.step_time_s / entry["published_step_s"], "peak_bytes": cost.peak_bytes,
        "hbm_bytes": hardware.hbm_bytes, "breakdown": dict(cost.breakdown),
        "communication_s": dict(cost.communication_s), "notes": row.notes, "autoshard": searched,
        "seconds": {**row.seconds, "price": priced - start},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", nargs="+", default=None, help="row ids (default: every row of maxtext.json)")
    parser.add_argument("--engine", default="auto", choices=("auto", "souffle", "embedded"))
    parser.add_argument("--published", default=str(maxtext.PUBLISHED))
    parser.add_argument("--json", default=None, help="also write the rows to this JSON file")
    parser.add_argument("--autoshard", type=int, default=0, metavar="ROLLOUTS",
                        help="also run the search with this rollout budget and set its strategy against the run's")
    options = parser.parse_args()
    published = Path(options.published)
    if not published.is_file():
        parser.error(f"{published}: no such file (maxtext.json of ../shared/reference/published)")
    entries = json.loads(published.read_text())["rows"]
    if options.rows:
        known = [entry["id"] for entry in entries]
        unknown = [r for r in options.rows if r not in known]
        if unknown:
            parser.error(f"no row {unknown[0]!r} in {published} (rows: {', '.join(known)})")
        entries = [entry for entry in entries if entry["id"] in options.rows]
    print("| row | chips | hardware | mesh | attention | remat | toast step s | published step s | toast / published "
          "| peak GiB / device | HBM GiB | compute s | memory s | overhead s | exposed comm s | hidden comm s "
          "| exposed host transfer s | lower + analyze + price s |")
    print("|---" * 18 + "|")
    results = []
    for entry in entries:
        result = price_row(entry, engine=options.engine, published=published,
                           autoshard_rollouts=options.autoshard)
        results.append(result)
        b, s = result["breakdown"], result["seconds"]
        cells = [result["row"], result["chips"], result["hardware"], result["mesh"], result["attention"],
                 result["remat"],
                 f"{result['toast_step_s']:.2f}", f"{result['published_step_s']:.2f}", f"{result['ratio']:.2f}",
                 f"{result['peak_bytes'] / GIB:.1f}", f"{result['hbm_bytes'] / GIB:.1f}",
                 f"{b['compute_bound_s']:.2f}", f"{b['memory_bound_s']:.2f}", f"{b['launch_overhead_s']:.3f}",
                 f"{b['exposed_communication_s']:.2f}", f"{b['hidden_communication_s']:.2f}",
                 f"{b.get('exposed_host_transfer_s', 0.0):.2f}",  # where the cost model prices memory kinds
                 f"{s['lower']:.1f} + {s['analyze']:.1f} + {s['price']:.1f}"]
        print("| " + " | ".join(map(str, cells)) + " |", flush=True)
    if options.autoshard:
        print("\n| row | run's strategy step s | peak GiB | autoshard step s | peak GiB | HBM GiB | autoshard / run "
              "| search s |")
        print("|---" * 8 + "|")
        for result in results:
            found = result["autoshard"]
            print(f"| {result['row']} | {result['toast_step_s']:.2f} | {result['peak_bytes'] / GIB:.1f} | "
                  f"{found['step_s']:.2f} | {found['peak_bytes'] / GIB:.1f} | {result['hbm_bytes'] / GIB:.1f} | "
                  f"{found['step_s'] / result['toast_step_s']:.3f} | {found['seconds']:.0f} |")
    for result in results:
        if result["unruled_ops"] or result["unpriced_ops"]:
            print(f"- {result['row']}: unruled {result['unruled_ops']}, unpriced {result['unpriced_ops']}")
        for note in result["notes"]:
            print(f"- {result['row']}: {note}")
    if options.json:
        Path(options.json).write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
