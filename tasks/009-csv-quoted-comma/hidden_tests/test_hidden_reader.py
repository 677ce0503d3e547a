from tabular.reader import parse_line, read_records


def test_comma_inside_quotes():
    assert parse_line('1,"Smith, John",42') == ["1", "Smith, John", "42"]


def test_escaped_quote():
    assert parse_line('"say ""hi""",x') == ['say "hi"', "x"]


def test_records_with_quoted_comma():
    text = 'name,city\n"Doe, Jane","Paris"\n'
    assert read_records(text) == [{"name": "Doe, Jane", "city": "Paris"}]


def test_empty_fields():
    assert parse_line("a,,c") == ["a", "", "c"]


def test_other_separator():
    assert parse_line("a;b", sep=";") == ["a", "b"]
