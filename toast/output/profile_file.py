"""A calibrated hardware profile as a TOML file: the base profile's text with the fitted numbers in place.

``toast calibrate`` keeps everything of the base profile a user may have written by hand (comments, sources,
the kernel numbers) and changes only the fitted fields of the ``[[interconnect]]`` levels, each with a comment
naming the fit, and adds the fit to those levels' ``sources``.
"""

from __future__ import annotations

import re
import tomllib

from toast.cost.hardware import Hardware, hardware_from_text
from toast.errors import ToastError

_KEY = re.compile(r"^(\s*)([A-Za-z_][A-Za-z0-9_]*)\s*=")


def calibrated_profile_text(base: Hardware, parameters: dict[tuple[int, str], float], *, name: str,
                            source: str, kernels: dict[str, float] | None = None) -> str:
    """The text of ``base``'s profile file with ``{(level index, field): value}`` written into its levels and
    ``kernels`` into its ``[kernels]`` table.

    Args:
      base: the profile the fit started from (its file is read again).
      parameters: the fitted collective values.
      name: the new profile's ``name``.
      source: the ``sources`` entry added to each changed table, e.g. ``"C1: toast calibrate on ... (date)"``.
      kernels: measured ``[kernels]`` numbers (``toast.cost.microbench.kernel_numbers``), if any.

    Raises:
      ToastError: the base file cannot be read, or the text written does not load back as the fitted profile.
    """
    try:
        lines = open(base.path, encoding="utf-8").read().split("\n")
    except (OSError, UnicodeDecodeError) as error:
        raise ToastError(f"{base.path}: cannot read the base profile ({error.__class__.__name__})") from None
    kernels = kernels or {}
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
                line, named = f"name = {toml_string(name)}", True
        elif key and (table == "[[interconnect]]" and level in fitted_levels or table == "[kernels]" and kernels):
            field = key.group(2)
            if table == "[kernels]" and field in kernels:
                line = _commented(f"{field} = {kernels[field]:.4g}", 31, "measured by toast calibrate --kernels [C1]")
            elif table == "[[interconnect]]" and (level, field) in parameters:
                line = _commented(f"{field} = {parameters[level, field]:.4g}", 26, "fitted by toast calibrate [C1]")
            elif field == "sources":
                # The whole list, however it is laid out (a "]" or "#" may be inside an entry), read back with
                # TOML and written one entry a line.
                end, entries = _toml_array(lines, index)
                out.append("sources = [")
                out.extend(f"    {toml_string(entry)}," for entry in [source, *entries])
                out.append("]")
                index = end + 1
                continue
        out.append(line)
        index += 1
    if not named:
        out.insert(0, f"name = {toml_string(name)}")
    text = "\n".join(out)
    written = hardware_from_text(text, f"{name}.toml")
    checks = [(f"interconnect[{index}].{field}", getattr(written.interconnect[index], field), value)
              for (index, field), value in parameters.items()]
    checks += [(f"kernels.{field}", getattr(written, field), value) for field, value in kernels.items()]
    for where, found, value in checks:
        if f"{found:.4g}" != f"{value:.4g}":
            raise ToastError(f"{base.path}: could not write {where} into a copy of the profile; write it by hand: "
                             f"{value:.4g}")
    return text


# What a TOML basic string written here does not hold as it is: the quote, the backslash, the control characters
# (U+0000-U+001F and U+007F, which TOML forbids), and everything past ASCII (escaped, so the file reads back the
# same whatever encoding writes and reads it).
_ESCAPED = re.compile(r'["\\\x00-\x1f\x7f-\U0010ffff]')
_SHORT_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}


def toml_string(text: str) -> str:
    """``text`` as a TOML basic string: quoted, in ASCII, escaped as TOML 1.0 says (``\\uXXXX``,
    ``\\UXXXXXXXX``); a lone surrogate (an undecodable byte of a file name), which is no character TOML can
    hold, becomes U+FFFD."""
    def escape(found: re.Match[str]) -> str:
        char = found.group()
        code = 0xFFFD if 0xD800 <= ord(char) <= 0xDFFF else ord(char)
        return _SHORT_ESCAPES.get(char) or (f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}")

    return '"' + _ESCAPED.sub(escape, text) + '"'


def _toml_array(lines: list[str], index: int) -> tuple[int, list]:
    """``(last line, value)`` of the array assigned on ``lines[index]`` (lines of a file TOML has read)."""
    for end in range(index, len(lines)):
        if "]" in lines[end]:
            try:
                return end, next(iter(tomllib.loads("\n".join(lines[index:end + 1])).values()))
            except tomllib.TOMLDecodeError:
                continue  # the "]" was inside a string or a comment
    raise ToastError(f"line {index + 1}: an array with no end")


def _commented(assignment: str, column: int, comment: str) -> str:
    """``assignment`` with ``# comment`` from ``column`` on, or one space after it when it is longer."""
    return f"{assignment.ljust(column - 1)} # {comment}"

