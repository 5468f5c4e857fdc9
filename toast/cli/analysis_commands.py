"""The commands on one program's analysis: ``analyze``, ``roles``, ``explain`` and ``graph``."""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

from toast.cli.command import Command
from toast.cli.options import add_analysis_options, check_dim, parse_color

__all__ = ["ANALYSIS_COMMANDS"]


def _analyze_arguments(parser: argparse.ArgumentParser) -> None:
    add_analysis_options(parser)
    parser.add_argument("--json", metavar="FILE", help="write the analysis as JSON to FILE")
    parser.add_argument("--propose-roles", metavar="FILE", help="write the roles toast proposes from the "
                        "analysis (what autoshard and compare use without a roles file) as a roles file")


def _run_analyze(options: argparse.Namespace, analysis, plan: None) -> int:
    from toast.output.files import Output, json_text, write_outputs
    from toast.output.report import summary, to_json

    outputs = [Output("--json", Path(options.json), json_text(to_json(analysis)))] if options.json else []
    if options.propose_roles:
        from toast.sharding.propose import propose_roles

        outputs.append(Output("--propose-roles", Path(options.propose_roles), propose_roles(analysis).to_toml()))
    write_outputs(outputs)
    print(summary(analysis), end="")
    return 0


def _roles_arguments(parser: argparse.ArgumentParser) -> None:
    add_analysis_options(parser)
    parser.add_argument("-o", "--output", metavar="FILE", help="write the proposed roles as a roles file "
                        "(TOML, for --roles)")


def _run_roles(options: argparse.Namespace, analysis, plan: None) -> int:
    from toast.output.files import Output, write_outputs
    from toast.output.report import argument_table
    from toast.sharding.propose import propose_roles

    proposed = propose_roles(analysis).to_toml()
    if options.output:
        write_outputs([Output("-o", Path(options.output), proposed)])
    print(argument_table(analysis), end="")
    print(f"roles proposed from the analysis{f' (written to {options.output})' if options.output else ''}:")
    print(proposed, end="")
    return 0


@dataclass(frozen=True)
class ExplainPlan:
    """The two dims to explain, as the user wrote them (checked to read as dims)."""

    dims: tuple[str, str]


def _explain_arguments(parser: argparse.ArgumentParser) -> None:
    add_analysis_options(parser)
    parser.add_argument("dim_a", metavar="DIM_A",
                        help="VALUE:DIM as the JSON names it, e.g. x:0, or VALUE[DIM] as the summary prints it")
    parser.add_argument("dim_b", metavar="DIM_B", help="VALUE:DIM, e.g. result[0]:0")


def _check_explain(options: argparse.Namespace) -> ExplainPlan:
    return ExplainPlan((check_dim(options.dim_a), check_dim(options.dim_b)))


def _run_explain(options: argparse.Namespace, analysis, plan: ExplainPlan) -> int:
    from toast.analysis.explain import explain, format_explanation
    from toast.analysis.naming import resolve_dim

    first, second = (resolve_dim(analysis, text) for text in plan.dims)
    print(format_explanation(analysis, explain(analysis, first, second)))
    return 0


@dataclass(frozen=True)
class GraphPlan:
    """The color to draw and the format (``dot`` or ``svg``; Graphviz found where ``svg``)."""

    color: int
    format: str


def _graph_arguments(parser: argparse.ArgumentParser) -> None:
    add_analysis_options(parser)
    parser.add_argument("--color", required=True, metavar="C", help="color id (as in analyze's output)")
    parser.add_argument("--format", default=None, metavar="{dot,svg}",
                        help="dot (plain text) or svg (needs Graphviz); default: from --output's "
                        "suffix, else dot")
    parser.add_argument("-o", "--output", metavar="FILE", help="write to FILE instead of stdout")
    parser.add_argument("--full", action="store_true", help="draw every node even of a big component (by "
                        "default one of more than 200 nodes is drawn as a summary: Graphviz may take minutes)")


def _check_graph(options: argparse.Namespace) -> GraphPlan:
    from toast.output.dimension_graph import graph_format, require_graphviz

    color = parse_color(options.color)
    chosen = graph_format(options.output, options.format)
    if chosen == "svg":
        require_graphviz()  # before the analysis: fail fast
    return GraphPlan(color, chosen)


def _run_graph(options: argparse.Namespace, analysis, plan: GraphPlan) -> int:
    from toast.output.dimension_graph import dimension_graph_dot, render_svg
    from toast.output.files import Output, write_outputs

    text = dimension_graph_dot(analysis, plan.color, full=options.full)
    if plan.format == "svg":
        text = render_svg(text)
    if options.output:
        write_outputs([Output("-o", Path(options.output), text)])
    else:
        sys.stdout.write(text)
    return 0


ANALYSIS_COMMANDS = (
    Command("analyze", arguments=_analyze_arguments, run=_run_analyze,
            help="find the colors of a program"),
    Command("roles", arguments=_roles_arguments, run=_run_roles,
            help="list the program's arguments and the roles toast proposes from the analysis; -o writes them as "
                 "a roles file to edit"),
    Command("explain", arguments=_explain_arguments, run=_run_explain, check=_check_explain,
            help="why two dims share a color"),
    Command("graph", arguments=_graph_arguments, run=_run_graph, check=_check_graph,
            help="draw the dimension graph of a color with its conflicts"),
)
