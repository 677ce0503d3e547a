import argparse
import sys

from .render import render


def parse_row(spec: str) -> dict:
    """'a=1,b=2' -> {'a': '1', 'b': '2'}"""
    row = {}
    for part in spec.split(","):
        key, _, value = part.partition("=")
        row[key.strip()] = value.strip()
    return row


def main(argv=None, out=None) -> int:
    parser = argparse.ArgumentParser(prog="rowexport")
    parser.add_argument("--sep", default=",", help="field separator")
    parser.add_argument("rows", nargs="*")
    args = parser.parse_args(argv)
    out = out or sys.stdout
    text = render([parse_row(r) for r in args.rows])
    if text:
        print(text, file=out)
    return 0
