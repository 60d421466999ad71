"""Command line: ``onnxforge inspect | verify | ...``."""
from __future__ import annotations

import argparse
import sys


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="onnxforge", description=__doc__)
    p.add_subparsers(dest="command", required=True)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
