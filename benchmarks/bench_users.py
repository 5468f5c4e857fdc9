"""toast against the best manual strategy on the zoo and on programs written the way users write them.

    python benchmarks/bench_users.py [--program SPEC ...] [--mesh batch=4,model=2 batch=2,model=2,seq=2]
                                     [--hardware h100 tpu_v3] [--memory hbm] [--rollouts 2000] [--seed 0]

SPEC is ``module:function[?name=value&...]`` (the zoo's factories, or ``benchmarks.programs.*``: Flax NNX,
Equinox, Hugging Face Flax, scan + remat, MoE; they need ``pip install -e '.[bench]'``). Each program is
analyzed once (embedded engine); for each mesh and profile toast searches (default settings, seed 0, one
worker per core) with the roles file beside the module as candidates, and every manual strategy of that
roles file (and its combinations) is priced under the same cost model and memory limit. Prints Markdown rows
for BENCHMARKS.md: the best manual strategy that fits, toast's step time and where toast's strategy came
from (``search``, or the manual strategy that beat it), the search's own step time (before the manual
candidates), toast / best manual, both peaks, and the search seconds.
"""

from __future__ import annotations

import argparse
import os
import platform
import time

import toast
from toast.evaluation.compare import FSDP_ALL, compare_manual
from toast.output.report import human_bytes, human_seconds
from toast.search import Budget
from toast.search.find import find_strategy
from toast.sharding.roles import roles_for_input

# The zoo at the paper's sizes, and the users' programs at the benchmark sizes their docstrings give.
ZOO = ["toast.examples.mlp:mlp", "toast.examples.attention:attention", "toast.examples.gpt:gpt_train_step",
       "toast.examples.gpt:gpt_scan", "toast.examples.gemma:t2b", "toast.examples.itx:itx", "toast.examples.gns:gns",
       "toast.examples.unet:unet"]
USERS = ["benchmarks.programs.nnx_lm:nnx_lm?layers=12&d_model=768&heads=12&seq=1024&batch=16&vocab=50304",
         "benchmarks.programs.equinox_vit:equinox_vit?image=224&patch=16&layers=12&d_model=768&heads=12&classes=1000"
         "&batch=64",
         "benchmarks.programs.moe:moe?layers=12&d_model=768&heads=12&experts=8&d_ff=3072&seq=1024&batch=16"
         "&vocab=50304",
         "benchmarks.programs.scan_llama:scan_llama?layers=16&d_model=2048&heads=16&kv_heads=8&ffn=5632&vocab=32000"
         "&seq=2048&batch=16",
         "benchmarks.programs.hf_whisper:hf_whisper?encoder_layers=8&decoder_layers=8&d_model=512&heads=8&ffn=2048"
         "&vocab=51865&mel_bins=80&source_positions=1500&target_len=448&batch=8",
         # The three a new user tried for issue 38: DiT-S/2 on 32x32 latents (Flax NNX), T5-small (Hugging Face
         # Flax), a Mamba + MoE LM.
         "benchmarks.programs.dit:dit?layers=12&d_model=384&heads=6&image=32&patch=2&batch=32&classes=1000",
         "benchmarks.programs.flax_t5:flax_t5?layers=6&decoder_layers=6&d_model=512&d_kv=64&heads=8&d_ff=2048"
         "&vocab=32128&source_len=512&target_len=128&batch=16",
         "benchmarks.programs.mamba_moe:mamba_moe?layers=8&d_model=512&state=16&experts=8&top=2&d_ff=1024"
         "&vocab=32000&seq=1024&batch=8"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--program", nargs="+", default=ZOO + USERS)
    parser.add_argument("--mesh", nargs="+", default=["batch=4,model=2", "batch=2,model=2,seq=2"])
    parser.add_argument("--hardware", nargs="+", default=["h100", "tpu_v3"])
    parser.add_argument("--memory", default="hbm", help="GiB per device, or hbm for the profile's")
    parser.add_argument("--rollouts", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    options = parser.parse_args()
    memory = None if options.memory == "hbm" else float(options.memory)
    print(f"machine: {platform.machine()} {os.cpu_count()} cores, python {platform.python_version()}; rollouts "
          f"{options.rollouts}, seed {options.seed}, memory {options.memory}")
    print("| program | ops | mesh | hardware | best manual that fits | toast | origin | search alone | toast / manual "
          "| toast / fsdp_all | peak toast / manual | search s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for spec in options.program:
        start = time.perf_counter()
        analysis = toast.analyze(spec, engine="embedded")
        analysis_s = time.perf_counter() - start
        roles = roles_for_input(spec.partition("?")[0])
        label = spec.partition(":")[2].partition("?")[0]
        for mesh_text in options.mesh:
            for name in options.hardware:
                hardware = toast.load_hardware(name)
                budget = Budget(seed=options.seed, rollouts=options.rollouts)
                found = find_strategy(analysis, toast.parse_mesh(mesh_text), hardware, budget=budget,
                                      memory_gib=memory, roles=roles)
                applies = [row for row in compare_manual(found) if row.cost is not None]
                manual = [row for row in applies if not row.over_memory]
                best = min(manual, key=lambda row: row.cost.step_time_s, default=None)
                cost, searched = found.result.cost, found.searched
                alone = human_seconds(searched.cost.step_time_s) if searched is not None else "-"
                over = " **over memory**" if found.over_memory else ""
                if best is None:
                    manual_text = "none fits" if applies else "none applies"
                    ratio, peaks = "-", human_bytes(cost.peak_bytes)
                else:
                    manual_text = f"{best.name} {human_seconds(best.cost.step_time_s)}"
                    ratio = f"{cost.step_time_s / best.cost.step_time_s:.3f}"
                    peaks = f"{human_bytes(cost.peak_bytes)} / {human_bytes(best.cost.peak_bytes)}"
                # FSDP over every device (the batch and the parameters over all axes): the baseline a user tries
                # first on a multi-axis mesh.
                fsdp_all = next((row for row in applies if row.name == FSDP_ALL), None)
                versus_fsdp_all = "-" if fsdp_all is None else (
                    f"{cost.step_time_s / fsdp_all.cost.step_time_s:.3f}" + (" (over memory)" if fsdp_all.over_memory
                                                                            else ""))
                print(f"| {label} | {len(analysis.program.ops)} ({analysis_s:.0f} s) | {mesh_text} | {name} | "
                      f"{manual_text} | {human_seconds(cost.step_time_s)}{over} | {found.origin} | {alone} | {ratio} | "
                      f"{versus_fsdp_all} | {peaks} | {found.result.seconds:.1f} |", flush=True)


if __name__ == "__main__":
    main()
