"""The built-in instances as edits on the packaged repositories (the source of ``tasks.jsonl``).

Each instance fixes one bug: ``fix`` edits the library (the gold patch), ``tests`` adds the tests
that fail before the fix (the test patch). An edit is ``(path, old, new)``: ``old`` is replaced
once (it must occur exactly once); an empty ``old`` appends ``new`` to the file (creating it).
PASS_TO_PASS is every test already in the test files the test patch touches, plus those in
``p2p_files``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

Edit = tuple[str, str, str]


def replaced_value(arguments: Mapping[str, Any], path: str, old: str) -> str | None:
    """The ``new`` text of a ``str_replace`` call's ``arguments`` when it replaces ``old`` in ``path``, else None."""
    if arguments.get("path") == path and arguments.get("old") == old:
        new = arguments.get("new")
        return new if isinstance(new, str) else None
    return None


@dataclass(frozen=True)
class Spec:
    repo: str
    number: int
    problem_statement: str
    fix: tuple[Edit, ...]
    tests: tuple[Edit, ...]
    fail_to_pass: tuple[str, ...]
    p2p_files: tuple[str, ...] = ()


TK_CORE = "textkit/core.py"
TK_TEST = "tests/test_textkit.py"
IV_CODE = "intervals/interval.py"
IV_TEST = "tests/test_intervals.py"
TF_CSV = "tinyformats/csvlite.py"
TF_INI = "tinyformats/ini.py"
TF_TEST = "tests/test_tinyformats.py"
UN_MONEY = "units/money.py"
UN_MONEY_TEST = "tests/test_money.py"

SPECS: tuple[Spec, ...] = (
    Spec("textkit", 1,
         "truncate() returns strings longer than the requested width\n\n"
         "`truncate(\"hello world\", 8)` returns `\"hello wo...\"` (11 characters). The docstring promises at "
         "most `width` characters including the suffix, so it should return `\"hello...\"`.\n",
         ((TK_CORE, "    return text[:width] + suffix\n",
           "    return text[: max(width - len(suffix), 0)] + suffix\n"),),
         ((TK_TEST, "", "\n\ndef test_truncate_respects_width():\n    out = truncate(\"hello world\", 8)\n"
                        "    assert out == \"hello...\"\n    assert len(out) <= 8\n"),),
         (f"{TK_TEST}::test_truncate_respects_width",)),
    Spec("textkit", 2,
         "slugify() leaves repeated and trailing separators\n\n"
         "`slugify(\"  Hello,  World! \")` gives `\"--hello---world--\"` instead of `\"hello-world\"`. Each run of "
         "non-alphanumeric characters should become a single separator and the slug should not start or end "
         "with one.\n",
         ((TK_CORE, "    words = re.split(r\"[^a-z0-9]\", text.lower())\n",
           "    words = [w for w in re.split(r\"[^a-z0-9]+\", text.lower()) if w]\n"),),
         ((TK_TEST, "", "\n\ndef test_slugify_collapses_separators():\n"
                        "    assert slugify(\"  Hello,  World! \") == \"hello-world\"\n"
                        "    assert slugify(\"a--b\", sep=\"_\") == \"a_b\"\n"),),
         (f"{TK_TEST}::test_slugify_collapses_separators",)),
    Spec("textkit", 3,
         "wrap() breaks lines that would fit exactly\n\n"
         "`wrap(\"aaa bbb\", 7)` returns `[\"aaa\", \"bbb\"]` although `\"aaa bbb\"` is exactly 7 characters "
         "and fits on one line. Lines of length equal to `width` should be allowed.\n",
         ((TK_CORE, "        if len(candidate) < width or not current:\n",
           "        if len(candidate) <= width or not current:\n"),),
         ((TK_TEST, "", "\n\ndef test_wrap_word_fills_line_exactly():\n"
                        "    assert wrap(\"aaa bbb\", 7) == [\"aaa bbb\"]\n"
                        "    assert wrap(\"ab cd ef\", 5) == [\"ab cd\", \"ef\"]\n"),),
         (f"{TK_TEST}::test_wrap_word_fills_line_exactly",)),
    Spec("textkit", 4,
         "count_words() miscounts with irregular whitespace\n\n"
         "`count_words(\"  one   two \")` returns 7 and `count_words(\"\")` returns 1. Words are separated by "
         "any amount of whitespace (spaces, tabs, newlines); an empty or blank text has 0 words.\n",
         ((TK_CORE, "    return len(text.split(\" \"))\n", "    return len(text.split())\n"),),
         ((TK_TEST, "", "\n\ndef test_count_words_irregular_spacing():\n"
                        "    assert count_words(\"  one   two \") == 2\n"
                        "    assert count_words(\"one\\ttwo\\nthree\") == 3\n"
                        "\n\ndef test_count_words_empty():\n"
                        "    assert count_words(\"\") == 0\n    assert count_words(\"   \") == 0\n"),),
         (f"{TK_TEST}::test_count_words_irregular_spacing", f"{TK_TEST}::test_count_words_empty")),
    Spec("intervals", 1,
         "Interval.contains() includes the end point\n\n"
         "Intervals are half-open `[start, end)`, but `Interval(1, 5).contains(5)` returns True.\n",
         ((IV_CODE, "        return self.start <= x <= self.end\n", "        return self.start <= x < self.end\n"),),
         ((IV_TEST, "", "\n\ndef test_contains_excludes_end():\n    assert not Interval(1, 5).contains(5)\n"
                        "    assert not Interval(3, 3).contains(3)\n"),),
         (f"{IV_TEST}::test_contains_excludes_end",)),
    Spec("intervals", 2,
         "Touching intervals are reported as overlapping\n\n"
         "`Interval(1, 3).overlaps(Interval(3, 5))` returns True, but with half-open intervals they share no "
         "point: 3 is not in `[1, 3)`.\n",
         ((IV_CODE, "        return self.start <= other.end and other.start <= self.end\n",
           "        return self.start < other.end and other.start < self.end\n"),),
         ((IV_TEST, "", "\n\ndef test_touching_intervals_do_not_overlap():\n"
                        "    assert not Interval(1, 3).overlaps(Interval(3, 5))\n"
                        "    assert not Interval(3, 5).overlaps(Interval(1, 3))\n"),),
         (f"{IV_TEST}::test_touching_intervals_do_not_overlap",)),
    Spec("intervals", 3,
         "intersection() of disjoint intervals raises ValueError\n\n"
         "`Interval(1, 2).intersection(Interval(4, 5))` raises `ValueError: end 2 is before start 4` and "
         "`Interval(1, 3).intersection(Interval(3, 5))` returns the empty `Interval(3, 3)`. The docstring says "
         "it returns None when the intervals share no point.\n",
         ((IV_CODE, "        return Interval(start, end)\n",
           "        if start >= end:\n            return None\n        return Interval(start, end)\n"),),
         ((IV_TEST, "", "\n\ndef test_intersection_of_disjoint_is_none():\n"
                        "    assert Interval(1, 2).intersection(Interval(4, 5)) is None\n"
                        "    assert Interval(1, 3).intersection(Interval(3, 5)) is None\n"),),
         (f"{IV_TEST}::test_intersection_of_disjoint_is_none",)),
    Spec("intervals", 4,
         "merge() shrinks an interval that encloses a later one\n\n"
         "`merge([Interval(1, 10), Interval(2, 3)])` returns `[Interval(1, 3)]`; expected `[Interval(1, 10)]`.\n",
         ((IV_CODE, "            merged[-1] = Interval(merged[-1].start, iv.end)\n",
           "            merged[-1] = Interval(merged[-1].start, max(merged[-1].end, iv.end))\n"),),
         ((IV_TEST, "", "\n\ndef test_merge_keeps_enclosing_interval():\n"
                        "    assert merge([Interval(1, 10), Interval(2, 3)]) == [Interval(1, 10)]\n"),),
         (f"{IV_TEST}::test_merge_keeps_enclosing_interval",)),
    Spec("tinyformats", 1,
         "csvlite: doubled quotes inside a quoted field are dropped\n\n"
         "In CSV a quote inside a quoted field is written twice. `parse_line('\"say \"\"hi\"\"\",x')` returns "
         "`['say hi', 'x']`; expected `['say \"hi\"', 'x']`.\n",
         ((TF_CSV, "            if ch == '\"':\n                quoted = False\n",
           "            if ch == '\"' and line[i + 1 : i + 2] == '\"':\n                current.append('\"')\n"
           "                i += 1\n            elif ch == '\"':\n                quoted = False\n"),),
         ((TF_TEST, "", "\n\ndef test_parse_line_doubled_quotes():\n"
                        "    assert parse_line('\"say \"\"hi\"\"\",x') == ['say \"hi\"', \"x\"]\n"),),
         (f"{TF_TEST}::test_parse_line_doubled_quotes",)),
    Spec("tinyformats", 2,
         "csvlite.parse() returns a spurious empty row for a trailing newline\n\n"
         "`parse(\"a,b\\nc,d\\n\")` returns `[['a', 'b'], ['c', 'd'], ['']]`, and `parse(\"\")` returns `[['']]` "
         "instead of `[]`. Files almost always end with a newline. Windows line endings should work too.\n",
         ((TF_CSV, "    return [parse_line(line, sep) for line in text.split(\"\\n\")]\n",
           "    return [parse_line(line, sep) for line in text.splitlines()]\n"),),
         ((TF_TEST, "", "\n\ndef test_parse_trailing_newline():\n"
                        "    assert parse(\"a,b\\nc,d\\n\") == [[\"a\", \"b\"], [\"c\", \"d\"]]\n"
                        "    assert parse(\"a\\r\\nb\\r\\n\") == [[\"a\"], [\"b\"]]\n"
                        "    assert parse(\"\") == []\n"),),
         (f"{TF_TEST}::test_parse_trailing_newline",)),
    Spec("tinyformats", 3,
         "csvlite.read_dicts() crashes on short rows\n\n"
         "`read_dicts(\"a,b,c\\n1,2\")` raises IndexError. The docstring says missing trailing fields are None.\n",
         ((TF_CSV, "    return [{name: row[i] for i, name in enumerate(header)} for row in body]\n",
           "    return [{name: row[i] if i < len(row) else None for i, name in enumerate(header)} for row in body]\n"),),
         ((TF_TEST, "", "\n\ndef test_read_dicts_short_row():\n"
                        "    assert read_dicts(\"a,b,c\\n1,2\") == [{\"a\": \"1\", \"b\": \"2\", \"c\": None}]\n"),),
         (f"{TF_TEST}::test_read_dicts_short_row",)),
    Spec("tinyformats", 4,
         "ini: lines starting with ';' are not treated as comments\n\n"
         "`parse_ini(\"; generated\\n[s]\\nk = v\\n\")` raises `ValueError: expected 'key = value'`. INI files "
         "commonly use `;` as well as `#` for full-line comments.\n",
         ((TF_INI, "        if not line or line.startswith(\"#\"):\n",
           "        if not line or line.startswith((\"#\", \";\")):\n"),),
         ((TF_TEST, "", "\n\ndef test_ini_semicolon_comments():\n"
                        "    assert parse_ini(\"; generated\\n[s]\\nk = v\\n\") == {\"\": {}, \"s\": {\"k\": \"v\"}}\n"),),
         (f"{TF_TEST}::test_ini_semicolon_comments",)),
    Spec("units", 1,
         "Money.parse() gets negative amounts wrong\n\n"
         "`Money.parse(\"-0.50\")` gives `Money(cents=50)` and `Money.parse(\"-1.25\")` gives "
         "`Money(cents=-75)`; expected -50 and -125 cents. The sign applies to the whole amount.\n",
         ((UN_MONEY, "        whole, _, frac = text.strip().partition(\".\")\n        frac = (frac + \"00\")[:2]\n"
                     "        return cls(int(whole) * 100 + int(frac), currency)\n",
           "        text = text.strip()\n        sign = -1 if text.startswith(\"-\") else 1\n"
           "        whole, _, frac = text.lstrip(\"+-\").partition(\".\")\n        frac = (frac + \"00\")[:2]\n"
           "        return cls(sign * (int(whole or \"0\") * 100 + int(frac)), currency)\n"),),
         ((UN_MONEY_TEST, "", "\n\ndef test_parse_negative():\n    assert Money.parse(\"-0.50\") == Money(-50)\n"
                              "    assert Money.parse(\"-1.25\") == Money(-125)\n"
                              "    assert Money.parse(\"-1.25\").format() == \"-1.25 EUR\"\n"),),
         (f"{UN_MONEY_TEST}::test_parse_negative",)),
    Spec("units", 2,
         "Money.split() loses cents\n\n"
         "`Money(100).split(3)` returns three times 33 cents: one cent disappears. The parts should add up to "
         "the amount and differ by at most one cent (`[34, 33, 33]`).\n",
         ((UN_MONEY, "        share = self.cents // parts\n"
                     "        return [Money(share, self.currency) for _ in range(parts)]\n",
           "        share, extra = divmod(self.cents, parts)\n"
           "        return [Money(share + (1 if i < extra else 0), self.currency) for i in range(parts)]\n"),),
         ((UN_MONEY_TEST, "", "\n\ndef test_split_keeps_every_cent():\n    parts = Money(100).split(3)\n"
                              "    assert parts == [Money(34), Money(33), Money(33)]\n"
                              "    assert sum(p.cents for p in Money(1001).split(4)) == 1001\n"),),
         (f"{UN_MONEY_TEST}::test_split_keeps_every_cent",)),
    Spec("units", 3,
         "Adding amounts in different currencies silently mixes them\n\n"
         "`Money(100, \"EUR\") + Money(100, \"USD\")` returns `Money(200, \"EUR\")`. It should raise "
         "ValueError naming both currencies.\n",
         ((UN_MONEY, "    def __add__(self, other: Money) -> Money:\n",
           "    def __add__(self, other: Money) -> Money:\n        if other.currency != self.currency:\n"
           "            raise ValueError(f\"cannot add {other.currency} to {self.currency}\")\n"),),
         ((UN_MONEY_TEST, "from units import Money\n", "import pytest\n\nfrom units import Money\n"),
          (UN_MONEY_TEST, "", "\n\ndef test_add_different_currencies_raises():\n"
                              "    with pytest.raises(ValueError, match=\"USD\"):\n"
                              "        Money(100, \"EUR\") + Money(100, \"USD\")\n")),
         (f"{UN_MONEY_TEST}::test_add_different_currencies_raises",)),
    Spec("units", 4,
         "convert(): unknown units give a bare KeyError\n\n"
         "`convert(1, \"furlong\", \"m\")` raises `KeyError: 'furlong'`. Please raise a dedicated "
         "`units.errors.UnknownUnitError` (a ValueError subclass, also exported as `units.UnknownUnitError`) "
         "whose message names the unknown unit and lists the known ones.\n",
         (("units/errors.py", "", "\"\"\"Errors of the units package.\"\"\"\n\n\n"
                                  "class UnknownUnitError(ValueError):\n"
                                  "    \"\"\"A unit name that the conversion table does not know.\"\"\"\n\n"
                                  "    def __init__(self, unit: str, known: list[str]) -> None:\n"
                                  "        super().__init__(f\"unknown unit {unit!r}; known units: {', '.join(known)}\")\n"
                                  "        self.unit = unit\n"),
          ("units/convert.py", "from __future__ import annotations\n",
           "from __future__ import annotations\n\nfrom units.errors import UnknownUnitError\n"),
          ("units/convert.py", "    return value * METRES",
           "    for unit in (from_unit, to_unit):\n        if unit not in METRES:\n"
           "            raise UnknownUnitError(unit, sorted(METRES))\n    return value * METRES"),
          ("units/__init__.py", "from units.convert import convert\n",
           "from units.convert import convert\nfrom units.errors import UnknownUnitError\n"),
          ("units/__init__.py", '__all__ = ["Money", "convert"]', '__all__ = ["Money", "UnknownUnitError", "convert"]')),
         (("tests/test_errors.py", "", "import pytest\n\nfrom units import convert\n"
                                       "from units.errors import UnknownUnitError\n\n\n"
                                       "def test_unknown_unit_names_the_unit():\n"
                                       "    with pytest.raises(UnknownUnitError, match=\"furlong\"):\n"
                                       "        convert(1, \"furlong\", \"m\")\n"
                                       "    with pytest.raises(ValueError, match=\"known units: cm, ft\"):\n"
                                       "        convert(1, \"m\", \"parsec\")\n"),),
         ("tests/test_errors.py::test_unknown_unit_names_the_unit",), p2p_files=("tests/test_convert.py",)),
)
