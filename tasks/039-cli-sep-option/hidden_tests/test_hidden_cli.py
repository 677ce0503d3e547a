import io
from rowexport.cli import main
from rowexport.render import render


def test_render_sep():
    assert render([{"a": 1, "b": 2}], sep=";") == "a;b\n1;2"


def test_cli_sep():
    buf = io.StringIO()
    main(["--sep", ";", "name=Ann,age=31"], out=buf)
    assert buf.getvalue() == "name;age\nAnn;31\n"


def test_cli_tab():
    buf = io.StringIO()
    main(["--sep", "\t", "x=1"], out=buf)
    assert buf.getvalue() == "x\n1\n"


def test_missing_column_empty():
    assert render([{"a": 1, "b": 2}, {"a": 3}], sep="|") == "a|b\n1|2\n3|"


def test_no_rows():
    buf = io.StringIO()
    main([], out=buf)
    assert buf.getvalue() == ""
