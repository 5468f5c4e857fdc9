"""``--report``: one self-contained HTML page, checked as a person would see it: rendered by headless Chromium
(Debian's ``chromium``; ``.ci/run`` installs it), whose page text must show the tables and both plots, with no
console error, and nothing loaded from elsewhere."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from toast.cli import main

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="headless Chromium is not installed (Debian's "
                                    "chromium package; .ci/run installs it)")


def _render(path) -> tuple[str, str]:
    """``(the DOM Chromium built, its log)`` of the page at ``path``."""
    assert CHROMIUM is not None
    done = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr",
                           "--v=0", "--dump-dom", path.resolve().as_uri()], capture_output=True, text=True,
                          timeout=120, check=True)
    return done.stdout, done.stderr


def _text(dom: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", dom))


def _self_contained(page: str) -> None:
    assert "<script" not in page and "src=" not in page and "href=" not in page and "@import" not in page


@needs_chromium
def test_compare_report_renders_the_tables_and_both_plots(tmp_path, capsys):
    report = tmp_path / "report.html"
    assert main(["compare", "toast.examples.mlp:mlp", "--engine", "embedded", "--mesh", "batch=4,model=2",
                 "--rollouts", "100", "--workers", "1", "--report", str(report)]) == 0
    capsys.readouterr()
    page = report.read_text()
    _self_contained(page)
    dom, log = _render(report)
    assert ":CONSOLE" not in log, [line for line in log.splitlines() if ":CONSOLE" in line]
    text = _text(dom)
    for heading in ("Strategies side by side", "Memory timeline of one device", "Best cost per search round",
                    "Colors each mesh axis took", "Argument shardings", "Collectives"):
        assert heading in text, heading
    for strategy in ("toast", "data_parallel", "megatron", "fsdp", "fsdp+megatron"):
        assert f" {strategy} " in text, strategy
    assert "does not apply: strategy 'sequence' needs role 'sequence'" in text
    assert "gain over the best expert strategy (" in text and "over FSDP over all devices (fsdp_all): " in text
    # Both plots: inline SVG with a line, labelled axes.
    assert dom.count("<svg") == 2 and dom.count("<polyline") == 2
    assert "live bytes per device" in text and "best step time" in text and "round" in text
    assert "w1" in text and "P(" in text


@needs_chromium
def test_sweep_report_has_the_summary_and_every_job(tmp_path, capsys):
    sweep_file = tmp_path / "sweep.toml"
    sweep_file.write_text('[sweep]\nmodels = ["mlp", "no_such_model"]\nmeshes = ["batch=4,model=2"]\n'
                          'rollouts = 30\n')
    report = tmp_path / "sweep.html"
    assert main(["sweep", str(sweep_file), "-o", str(tmp_path / "out"), "--jobs", "1", "--report", str(report)]) == 1
    capsys.readouterr()
    _self_contained(report.read_text())
    dom, log = _render(report)
    assert ":CONSOLE" not in log
    text = _text(dom)
    assert "Sweep summary" in text and "did not run" in text and "no_such_model" in text
    assert text.count("Strategies side by side") == 1  # the job that ran
    assert dom.count("<svg") == 2


def test_report_path_is_checked_before_any_work(tmp_path, capsys):
    missing = tmp_path / "no_such_folder" / "report.html"
    assert main(["compare", "toast.examples.mlp:mlp", "--engine", "embedded", "--mesh", "batch=4,model=2",
                 "--report", str(missing)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--report" in err[0] and "Traceback" not in err[0], err
    assert not missing.exists()
