"""``python -m tests.fuzz --cases 20000``: totals by outcome; exit status 1 on any crash,
untyped error or mismatch. ``--only I`` judges case I in this process and prints it."""
from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.fuzz", description=__doc__)
    p.add_argument("--cases", type=int, default=1000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--start", type=int, default=0)
    p.add_argument("--jobs", type=int, default=2, help="worker processes at a time")
    p.add_argument("--batch", type=int, default=100, help="cases per worker process")
    p.add_argument("--op", help="only this operator (Name or domain/Name)")
    p.add_argument("--only", type=int, help="judge this one case in-process and describe it")
    p.add_argument("--show", type=int, default=20, help="failures to list")
    p.add_argument("--verbose", action="store_true", help="list oracle disagreements and out-of-spec cases too")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--stop", type=int, help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.worker:
        from tests.fuzz.harness import run_batch

        with open(a.out, "a") as out:
            run_batch(a.seed, a.start, a.stop, out, a.op)
        return 0
    if a.only is not None:
        from tests.fuzz.case import Skip
        from tests.fuzz.runner import judge, make_case, op_table, ops_for

        table = op_table()
        ops = ops_for(table, a.op)
        try:
            case = make_case(a.seed, a.only, ops, table)
        except Skip as e:
            print(f"skipped: {e}")
            return 0
        print(case.describe())
        res = judge(case)
        print(f"{res.status}: {res.reason}\n{res.detail}")
        return 1 if res.status in ("untyped", "mismatch") else 0
    from tests.fuzz.harness import run_fuzz

    totals = run_fuzz(a.cases, seed=a.seed, jobs=a.jobs, batch=a.batch, start=a.start, op=a.op)
    print(totals.report(a.show, a.verbose))
    return 1 if totals.failed else 0


if __name__ == "__main__":
    sys.exit(main())
