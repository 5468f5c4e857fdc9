"""Tests of the C-preprocessor subset (toast.datalog.preprocess)."""

from __future__ import annotations

from pathlib import Path

import pytest

from toast.datalog.preprocess import SourceLocation, preprocess_file, preprocess_text
from toast.errors import RuleError


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_define_expands_outside_strings_and_comments(tmp_path: Path) -> None:
    source = preprocess_text('#define N 42\n#define EMPTY\nr(N, "N"). // N\n/* N */ s(EMPTY N).\n', tmp_path / "a.dl")
    assert source.text.split("\n") == ['r(42, "N"). // N', "/* N */ s( 42).", ""]


def test_macros_expand_recursively_but_not_into_themselves(tmp_path: Path) -> None:
    source = preprocess_text("#define A B + 1\n#define B A\nx(A).\n", tmp_path / "a.dl")
    # A -> B + 1 -> (A is disabled inside its own expansion) A + 1
    assert source.text.split("\n")[0] == "x(A + 1)."


def test_macro_inside_hex_number_is_not_expanded(tmp_path: Path) -> None:
    source = preprocess_text("#define x1F 7\nr(0x1F, x1F).\n", tmp_path / "a.dl")
    assert source.text.split("\n")[0] == "r(0x1F, 7)."


def test_initial_defines(tmp_path: Path) -> None:
    source = preprocess_text("#ifdef FAST\nfast().\n#else\nslow().\n#endif\n", tmp_path / "a.dl", defines={"FAST": ""})
    assert source.text.split("\n")[0] == "fast()."


def test_ifdef_ifndef_else_nesting(tmp_path: Path) -> None:
    text = "\n".join(
        [
            "#define A",
            "#ifdef A",
            "a1.",
            "#ifdef B",
            "b1.",
            "#else",
            "notb.",
            "#endif",
            "#else",
            "nota.",
            "#ifndef B",
            "hidden.",
            "#endif",
            "#endif",
            "#ifndef C",
            "notc.",
            "#endif",
            "#undef A",
            "#ifdef A",
            "gone.",
            "#endif",
        ]
    )
    source = preprocess_text(text, tmp_path / "a.dl")
    assert [line for line in source.text.split("\n") if line] == ["a1.", "notb.", "notc."]
    path = str(tmp_path / "a.dl")
    assert [loc for loc in source.lines] == [SourceLocation(path, 3), SourceLocation(path, 7), SourceLocation(path, 16)]


def test_directives_inside_block_comments_are_ignored(tmp_path: Path) -> None:
    source = preprocess_text('/*\n#include "missing.dl"\n*/\nok.\n', tmp_path / "a.dl")
    assert source.text.split("\n") == ["/*", '#include "missing.dl"', "*/", "ok.", ""]


def test_file_and_line_macros(tmp_path: Path) -> None:
    main = write(tmp_path / "main.dl", 'a(__LINE__).\n#include "sub/inc.dl"\nb(__FILE__, __LINE__).\nc("__LINE__").\n')
    write(tmp_path / "sub" / "inc.dl", "\n\ni(__FILE__, __LINE__).\n")
    source = preprocess_file(main)
    lines = source.text.split("\n")
    assert lines[0] == "a(1)."
    assert f'i("{tmp_path / "sub" / "inc.dl"}", 3).' in lines
    assert f'b("{main}", 3).' in lines
    assert 'c("__LINE__").' in lines


def test_line_macro_inside_a_macro_value_is_the_line_of_use(tmp_path: Path) -> None:
    source = preprocess_text("#define HERE __FILE__, __LINE__\n\nw(HERE).\n", tmp_path / "x.dl")
    assert source.text.split("\n")[1] == f'w("{tmp_path / "x.dl"}", 3).'


def test_source_map_through_includes(tmp_path: Path) -> None:
    main = write(tmp_path / "main.dl", 'one.\n#include "inc.dl"\ntwo.\n')
    write(tmp_path / "inc.dl", "x.\ny.\n")
    source = preprocess_file(main)
    lines = source.text.split("\n")
    inc = str(tmp_path / "inc.dl")
    assert source.location(lines.index("one.") + 1) == SourceLocation(str(main), 1)
    assert source.location(lines.index("x.") + 1) == SourceLocation(inc, 1)
    assert source.location(lines.index("y.") + 1) == SourceLocation(inc, 2)
    assert source.location(lines.index("two.") + 1) == SourceLocation(str(main), 3)


def test_include_searches_include_dirs_after_the_including_directory(tmp_path: Path) -> None:
    main = write(tmp_path / "src" / "main.dl", '#include "common.dl"\n#include <lib.dl>\n')
    write(tmp_path / "src" / "common.dl", "local.\n")
    write(tmp_path / "inc" / "common.dl", "shadowed.\n")
    write(tmp_path / "inc" / "lib.dl", "lib.\n")
    source = preprocess_file(main, include_dirs=[tmp_path / "inc"])
    assert [line for line in source.text.split("\n") if line] == ["local.", "lib."]


def test_same_file_included_twice_appears_twice(tmp_path: Path) -> None:
    main = write(tmp_path / "main.dl", '#include "x.dl"\n#include "x.dl"\n')
    write(tmp_path / "x.dl", "x.\n")
    assert [line for line in preprocess_file(main).text.split("\n") if line] == ["x.", "x."]


def test_defines_persist_across_includes(tmp_path: Path) -> None:
    main = write(tmp_path / "main.dl", '#include "defs.dl"\nv(V).\n')
    write(tmp_path / "defs.dl", "#define V 5\n")
    assert "v(5)." in preprocess_file(main).text.split("\n")


def test_missing_include_names_the_directive_line(tmp_path: Path) -> None:
    main = write(tmp_path / "main.dl", 'a.\n\n#include "x.dl"\n')
    with pytest.raises(RuleError) as info:
        preprocess_file(main)
    assert str(info.value) == f"{main}:3: cannot find include file 'x.dl'"


def test_missing_include_inside_an_include(tmp_path: Path) -> None:
    main = write(tmp_path / "main.dl", '#include "a.dl"\n')
    inner = write(tmp_path / "a.dl", '\n#include "nope.dl"\n')
    with pytest.raises(RuleError) as info:
        preprocess_file(main)
    assert str(info.value) == f"{inner}:2: cannot find include file 'nope.dl'"


def test_include_cycle_is_an_error(tmp_path: Path) -> None:
    main = write(tmp_path / "a.dl", '#include "b.dl"\n')
    b = write(tmp_path / "b.dl", 'b.\n#include "a.dl"\n')
    with pytest.raises(RuleError) as info:
        preprocess_file(main)
    assert str(info.value) == f"{b}:2: include cycle: a.dl -> b.dl -> a.dl"


def test_missing_top_level_file(tmp_path: Path) -> None:
    with pytest.raises(RuleError) as info:
        preprocess_file(tmp_path / "none.dl")
    assert str(info.value).startswith(f"{tmp_path / 'none.dl'}: cannot read file")


@pytest.mark.parametrize(
    ("text", "line", "message"),
    [
        ("x.\n#endif\n", 2, "#endif without matching #ifdef/#ifndef"),
        ("#else\n", 1, "#else without matching #ifdef/#ifndef"),
        ("\n#ifdef A\n", 2, "unterminated #ifdef/#ifndef (missing #endif)"),
        ("#ifdef A\n#else\n#else\n#endif\n", 3, "#else after #else"),
        ("#define F(x) x\n", 1, "function-like macro 'F' is not supported"),
        ("#if 1\n#endif\n", 1, "unsupported preprocessor directive '#if'"),
        ("\n#error stop here\n", 2, "#error stop here"),
        ("#ifdef\n#endif\n", 1, "#ifdef requires a single macro name"),
        ("#include missing.dl\n", 1, '#include expects "file" or <file>'),
    ],
)
def test_directive_errors(tmp_path: Path, text: str, line: int, message: str) -> None:
    path = tmp_path / "bad.dl"
    with pytest.raises(RuleError) as info:
        preprocess_text(text, path)
    assert str(info.value) == f"{path}:{line}: {message}"


def test_skipped_blocks_nest_unsupported_conditionals(tmp_path: Path) -> None:
    text = "#ifdef NOPE\n#if whatever\n#elif other\n#pragma x\n#endif\n#endif\nok.\n"
    source = preprocess_text(text, tmp_path / "a.dl")
    assert source.text.split("\n")[0] == "ok."
