from termtable.table import render_table
from termtable.width import display_width, pad


def test_cjk_width():
    assert display_width("北京") == 4


def test_fullwidth_letters():
    assert display_width("ＡＢ") == 4


def test_pad_cjk():
    assert pad("日本", 6) == "日本  "


def test_table_aligns():
    out = render_table([["北京", "x"], ["Oslo!", "y"]])
    assert out == "北京  | x\nOslo! | y"


def test_ascii_unchanged():
    assert display_width("hello") == 5
