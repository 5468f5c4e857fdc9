"""A calibrated hardware profile as a TOML file: the base profile's text with the fitted numbers in place.

``toast calibrate`` keeps everything of the base profile a user may have written by hand (comments, sources,
the kernel numbers) and changes only the fitted fields of the ``[[interconnect]]`` levels, each with a comment
naming the fit, and adds the fit to those levels' ``sources``.
"""

from __future__ import annotations

import json
import re
import tomllib

from toast.cost.hardware import Hardware, hardware_from_text
from toast.errors import ToastError

_KEY = re.compile(r"^(\s*)([A-Za-z_][A-Za-z0-9_]*)\s*=")


def calibrated_profile_text(base: Hardware, parameters: dict[tuple[int, str], float], *, name: str,
                            source: str) -> str:
    """The text of ``base``'s profile file with ``{(level index, field): value}`` written into its levels.

    Args:
      base: the profile the fit started from (its file is read again).
      parameters: the fitted values.
      name: the new profile's ``name``.
      source: the ``sources`` entry added to each fitted level, e.g. ``"C1: toast calibrate on ... (date)"``.

    Raises:
      ToastError: the base file cannot be read, or the text written does not load back as the fitted profile.
    """
    try:
        lines = open(base.path, encoding="utf-8").read().split("\n")
    except (OSError, UnicodeDecodeError) as error:
        raise ToastError(f"{base.path}: cannot read the base profile ({error.__class__.__name__})") from None
    fitted_levels = {index for index, _ in parameters}
    out: list[str] = []
    level = -1
    table = ""
    index = 0
    named = False
    while index < len(lines):
        line = lines[index]
        stripped = line.strip()
        if stripped.startswith("["):
            table = stripped
            if stripped == "[[interconnect]]":
                level += 1
        key = _KEY.match(line)
        if key and not table:
            if key.group(2) == "name":
                line, named = f"name = {json.dumps(name)}", True
        elif key and table == "[[interconnect]]" and level in fitted_levels:
            field = key.group(2)
            if (level, field) in parameters:
                line = f"{field} = {parameters[level, field]:.4g}".ljust(26) + "# fitted by toast calibrate [C1]"
            elif field == "sources":
                # The whole list, however it is laid out, read back with TOML and written one entry a line.
                end = index
                while "]" not in lines[end].split("#")[0]:
                    end += 1
                entries = tomllib.loads("\n".join(lines[index:end + 1]))["sources"]
                out.append("sources = [")
                out.extend(f"    {json.dumps(entry)}," for entry in [source, *entries])
                out.append("]")
                index = end + 1
                continue
        out.append(line)
        index += 1
    if not named:
        out.insert(0, f"name = {json.dumps(name)}")
    text = "\n".join(out)
    written = hardware_from_text(text, f"{name}.toml")
    for (level_index, field), value in parameters.items():
        if f"{getattr(written.interconnect[level_index], field):.4g}" != f"{value:.4g}":
            raise ToastError(f"{base.path}: could not write interconnect[{level_index}].{field} into a copy of the "
                             f"profile; write it by hand: {value:.4g}")
    return text
