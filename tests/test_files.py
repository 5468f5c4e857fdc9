"""Output files are written whole, with the mode any new file of the user's gets."""

from __future__ import annotations

import os
import stat

from toast.output.files import write_text_atomic


def test_atomic_write_gives_the_usual_file_mode(tmp_path):
    mask = os.umask(0o022)
    try:
        target = tmp_path / "out.json"
        write_text_atomic("{}\n", target)
        assert target.read_text() == "{}\n"
        assert stat.S_IMODE(target.stat().st_mode) == 0o644
        assert [p.name for p in tmp_path.iterdir()] == ["out.json"]  # no temporary left behind
    finally:
        os.umask(mask)
