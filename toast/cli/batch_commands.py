"""The commands that run many programs or none: ``sweep`` (a sweep file's comparisons) and ``calibrate`` (a
profile fitted to measurements)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from toast.cli.command import Command
from toast.cli.options import PROCESSES, add_search_option, positive_seconds
from toast.errors import ToastError

__all__ = ["BATCH_COMMANDS"]


def _sweep_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("sweep", metavar="FILE", help="sweep file (TOML, a [sweep] table)")
    parser.add_argument("-o", "--output", required=True, metavar="DIR", help="folder of the job records "
                        "(jobs/*.json; a rerun skips the jobs recorded there) and summary.csv, summary.md")
    parser.add_argument("--jobs", type=PROCESSES, default=0, metavar="N", help="jobs at once on this machine "
                        "(default: one per core)")
    parser.add_argument("--report", metavar="FILE", help="write an HTML report (the summary, then every "
                        "job's comparison) to FILE")
    parser.add_argument("--job-timeout", type=positive_seconds, metavar="SECONDS", help="stop a job that "
                        "runs longer and record it as timed out (default: no limit)")
    parser.add_argument("--ray", nargs="?", const="auto", metavar="ADDRESS", help="run the jobs as tasks on "
                        "a Ray cluster: ADDRESS, or the one `ray start --head` runs here (auto); 'local' "
                        "starts one for this run")
    add_search_option(parser, sweep=True)


def _sweep(options: argparse.Namespace) -> int:
    from toast.evaluation.sweep import load_sweep, sweep

    plan = load_sweep(options.sweep, search=options.search)

    def progress(record, done: int, total: int) -> None:
        outcome = "ok" if record["status"] == "ok" else f"error: {record['error']}"
        print(f"[{done}/{total}] {record['job']}: {outcome} ({record['job_seconds']:.1f} s)", file=sys.stderr,
              flush=True)

    if options.report:
        from toast.output.files import check_output

        check_output(options.report, option="--report")
        if Path(options.report).resolve() == Path(options.output).resolve():
            raise ToastError(f"--report {options.report} is the sweep's folder (-o): give the report its own file")
    records = sweep(plan.jobs, options.output, workers=options.jobs, ray_address=options.ray,
                    job_timeout=options.job_timeout, progress=progress)
    if options.report:
        from toast.evaluation.report import report_html
        from toast.evaluation.sweep import summary_row
        from toast.output.files import Output, write_outputs

        sections = [record["report"] for record in records if record["status"] == "ok"]
        write_outputs([Output("--report", Path(options.report), report_html(
            sections, title=f"toast sweep: {plan.source} ({len(records)} jobs)",
            summary=[summary_row(record) for record in records]))])
    print((Path(options.output) / "summary.md").read_text(), end="")
    failed = [record["job"] for record in records if record["status"] != "ok"]
    if failed:
        print(f"toast: {len(failed)} of {len(records)} jobs failed (their errors are in the table)", file=sys.stderr)
        return 1
    return 0


def _calibrate_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nccl-tests", nargs="+", default=[], metavar="LOG",
                        help="outputs of all_reduce_perf, all_gather_perf, reduce_scatter_perf or "
                        "alltoall_perf (with their '#  Rank' header lines), on one node or several")
    kernels = parser.add_mutually_exclusive_group()
    kernels.add_argument("--kernels", action="store_true", help="run the kernel microbenchmarks on this machine's "
                         "accelerator (a few minutes) and measure the [kernels] numbers")
    kernels.add_argument("--kernels-from", metavar="JSON", help="the [kernels] numbers from a microbenchmark run "
                         "saved before (benchmarks/gpu_microbench.py OUT.json)")
    parser.add_argument("--base", default="h100", help="the profile to start from: its bandwidths, node "
                        "size and kernel numbers are kept (hardware/NAME.toml or a TOML path)")
    parser.add_argument("-o", "--output", required=True, metavar="FILE",
                        help="the new profile (a .toml file; load it with --hardware FILE)")


def _calibrate(options: argparse.Namespace) -> int:
    import datetime

    from toast.cost.calibration import OUTLIER_RATIO, fit_collectives, read_nccl_tests, shown
    from toast.cost.hardware import load_hardware
    from toast.output.files import Output, check_output, write_outputs
    from toast.output.profile_file import calibrated_profile_text
    from toast.output.report import human_seconds

    output = Path(options.output)
    if output.suffix != ".toml":
        raise ToastError(f"-o {options.output}: a profile is a .toml file")
    if not options.nccl_tests and not options.kernels and not options.kernels_from:
        raise ToastError("calibrate needs measurements: --nccl-tests LOG..., --kernels or --kernels-from JSON")
    check_output(output, option="-o")
    base = load_hardware(options.base)
    curves = [read_nccl_tests(path) for path in options.nccl_tests]
    document = None
    if options.kernels_from:
        from toast.cost.microbench import read_microbench

        document = read_microbench(options.kernels_from)
    elif options.kernels:
        import jax

        platform = jax.devices()[0].platform
        if platform == "cpu":
            raise ToastError("--kernels measures this machine's accelerator, and jax sees none here (only the CPU); "
                             "run it where the GPU is, or give --kernels-from JSON")
        from toast.cost.microbench import measure_kernels

        document = measure_kernels(progress=lambda line: print(line, file=sys.stderr, flush=True))
    # Everything is worked out and written before anything is printed: an error prints its line alone.
    kernel_fields: dict[str, float] = {}
    if document is not None:
        from toast.cost.microbench import kernel_numbers

        try:
            kernel_fields = kernel_numbers(document, base)
        except ToastError as error:
            raise ToastError(f"{shown(options.kernels_from)}: {error}" if options.kernels_from else str(error)) \
                from None
    report: list[str] = []
    parameters: dict = {}
    if curves:
        report.append(f"fitting profile '{base.name}' to {len(curves)} nccl-tests output{'s' * (len(curves) > 1)}")
        fit = fit_collectives(curves, [base] * len(curves), outlier_ratio=OUTLIER_RATIO)
        parameters = fit.parameters
        left_out = {(outlier.curve, outlier.row) for outlier in fit.outliers}
        for index, (curve, ratios) in enumerate(zip(curves, fit.ratios, strict=True)):
            report.append(f"{curve.source}: {curve.kind}, {curve.ranks} ranks on {curve.nodes} "
                          f"node{'s' * (curve.nodes > 1)}")
            report.append(f"  {'bytes':>12} {'measured':>10} {'model':>10} {'model/measured':>14}")
            for row, (size, seconds, ratio) in enumerate(zip(curve.sizes, curve.seconds, ratios.tolist(), strict=True)):
                mark = "  outlier, left out" if (index, row) in left_out else ""
                report.append(f"  {size:>12} {human_seconds(seconds):>10} {human_seconds(seconds * ratio):>10} "
                              f"{ratio:>14.2f}{mark}")
        if fit.outliers:
            report.append(f"{len(fit.outliers)} outlier{'s' * (len(fit.outliers) > 1)} left out of the fit (the model "
                          f"fitted to the other rows misses {'them' if len(fit.outliers) > 1 else 'it'} by more than "
                          f"{OUTLIER_RATIO:g}x):")
            report.extend(f"  {outlier.where}: {outlier.size} bytes measured {human_seconds(outlier.seconds)}, "
                          f"fitted {human_seconds(outlier.fitted)}" for outlier in fit.outliers)
        report.extend(f"interconnect[{level}] ({base.interconnect[level].name}).{field} = {value:.4g} "
                      f"(was {getattr(base.interconnect[level], field):.4g})"
                      for (level, field), value in sorted(parameters.items()))
    if document is not None:
        report.append(f"kernels measured on {document.get('device', 'an unnamed device')} "
                      f"({document.get('date', 'no date')}):")
        report.extend(f"  kernels.{field} = {value:.4g} (was {getattr(base, field):.4g})"
                      for field, value in kernel_fields.items())
    measured = [Path(path).name for path in [*options.nccl_tests, *([options.kernels_from] if options.kernels_from
                                                                     else [])]]
    if options.kernels:
        measured.append("the kernel microbenchmarks")
    source = f"C1: toast calibrate on {', '.join(measured)} ({datetime.date.today().isoformat()})"
    text = calibrated_profile_text(base, parameters, name=output.stem, source=source, kernels=kernel_fields)
    write_outputs([Output("-o", output, text)])
    print("\n".join(report))
    print(f"wrote {shown(output)}")
    return 0


BATCH_COMMANDS = (
    Command("sweep", arguments=_sweep_arguments, run=_sweep, analyzes=False,
            help="run a sweep file's comparisons (models x meshes x hardware x memory x seeds) in parallel; one "
                 "record per job and a summary table"),
    Command("calibrate", arguments=_calibrate_arguments, run=_calibrate, analyzes=False,
            help="fit a profile's collective parameters to your cluster's nccl-tests outputs and write it as a "
                 "new profile"),
)
