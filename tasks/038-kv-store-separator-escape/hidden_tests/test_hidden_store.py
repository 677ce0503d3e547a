from kvstore.writer import dumps
from kvstore.reader import loads


def test_round_trip_newline_and_tab():
    data = {"note": "line1\nline2", "cols": "a\tb"}
    assert loads(dumps(data)) == data


def test_round_trip_backslash():
    data = {"path": "C:\\temp\\new", "odd": "ends with \\"}
    assert loads(dumps(data)) == data


def test_written_form_is_one_line_per_key():
    assert dumps({"k": "x\ny"}).count("\n") == 1


def test_old_files_still_load():
    assert loads("a\t1\nb\tplain text\n") == {"a": "1", "b": "plain text"}


def test_empty():
    assert loads(dumps({})) == {}
