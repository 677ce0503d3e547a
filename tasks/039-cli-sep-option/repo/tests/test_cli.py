import io
from rowexport.cli import main, parse_row


def test_parse_row():
    assert parse_row("a=1, b = 2") == {"a": "1", "b": "2"}


def test_default_output():
    buf = io.StringIO()
    assert main(["a=1,b=2", "a=3,b=4"], out=buf) == 0
    assert buf.getvalue() == "a,b\n1,2\n3,4\n"
