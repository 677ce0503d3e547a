from termtable.table import render_table
from termtable.width import display_width


def test_ascii_table():
    assert render_table([["a", "bb"], ["ccc", "d"]]) == "a   | bb\nccc | d"


def test_combining_mark_zero_width():
    assert display_width("e\u0301") == 1


def test_empty():
    assert render_table([]) == ""
