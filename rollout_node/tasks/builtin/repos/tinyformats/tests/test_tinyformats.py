from tinyformats.csvlite import parse, parse_line, read_dicts
from tinyformats.ini import parse_ini


def test_parse_line_quoted_separator():
    assert parse_line('a,"b,c",d') == ["a", "b,c", "d"]


def test_parse_line_custom_separator():
    assert parse_line("a;b", sep=";") == ["a", "b"]


def test_parse_rows():
    assert parse("a,b\nc,d") == [["a", "b"], ["c", "d"]]


def test_read_dicts():
    assert read_dicts("x,y\n1,2") == [{"x": "1", "y": "2"}]


def test_ini_sections():
    text = "top = 1\n# a note\n[db]\nhost = example\nport=5432\n"
    assert parse_ini(text) == {"": {"top": "1"}, "db": {"host": "example", "port": "5432"}}
