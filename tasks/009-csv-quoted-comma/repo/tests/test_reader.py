from tabular.reader import parse_line, read_records


def test_plain():
    assert parse_line("a,b,c\n") == ["a", "b", "c"]


def test_quoted_simple():
    assert parse_line('"a",b') == ["a", "b"]


def test_records():
    assert read_records("x,y\n1,2\n") == [{"x": "1", "y": "2"}]
