"""Batches of cases in worker subprocesses, so that a crash (a signal, an abort) or a hang
is counted against its case instead of ending the run; totals by outcome and reason."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["Totals", "run_fuzz", "run_batch"]

REPO = Path(__file__).resolve().parents[2]
FAILING = ("crash", "untyped", "mismatch", "generator-error")


@dataclass
class Totals:
    cases: int = 0
    by_status: Counter = field(default_factory=Counter)
    by_reason: dict[str, Counter] = field(default_factory=dict)
    failures: list[dict[str, Any]] = field(default_factory=list)
    noted: list[dict[str, Any]] = field(default_factory=list)  # disagreements and out-of-spec cases
    seconds: float = 0.0

    def add(self, rec: dict[str, Any]) -> None:
        self.cases += 1
        st = rec["status"]
        self.by_status[st] += 1
        if st != "ok":
            self.by_reason.setdefault(st, Counter())[rec.get("reason", "")] += 1
        if st in FAILING:
            self.failures.append(rec)
        elif st in ("oracle-disagreement", "out-of-spec"):
            self.noted.append(rec)

    def count(self, status: str) -> int:
        return self.by_status.get(status, 0)

    @property
    def failed(self) -> bool:
        return any(self.count(s) for s in FAILING)

    def report(self, show: int = 20, verbose: bool = False) -> str:
        lines = [f"cases: {self.cases}  ({self.seconds:.1f} s)",
                 f"  ok: {self.count('ok')}",
                 f"  crashes: {self.count('crash')}",
                 f"  untyped errors: {self.count('untyped')}",
                 f"  mismatches: {self.count('mismatch')}",
                 f"  oracle-disagreements: {self.count('oracle-disagreement')}",
                 f"  typed rejections outside the spec: {self.count('out-of-spec')}",
                 f"  skipped: {self.count('skipped')}"]
        for st in ("skipped", "oracle-disagreement", "out-of-spec"):
            for reason, n in sorted(self.by_reason.get(st, {}).items(), key=lambda kv: -kv[1]):
                lines.append(f"    {st} {n:6d}  {reason[:150]}")
        for rec in self.failures[:show]:
            lines.append(f"  {rec['status'].upper()} case {rec['index']} (seed {rec['seed']}): {rec.get('reason', '')}"
                         f"\n      {rec.get('detail', '')}"
                         f"\n      repro: python -m tests.fuzz --seed {rec['seed']} --only {rec['index']}")
        if len(self.failures) > show:
            lines.append(f"  ... {len(self.failures) - show} more")
        if verbose:
            for rec in self.noted:
                lines.append(f"  {rec['status']} case {rec['index']}: {rec.get('reason', '')[:60]}"
                             f"\n      {rec.get('detail', '')}")
        return "\n".join(lines)


def run_batch(seed: int, start: int, stop: int, out: Any, op: str | None = None) -> None:
    """Worker side: judge cases [start, stop), one JSON line each, flushed before the next."""
    from tests.fuzz.case import Skip
    from tests.fuzz.runner import judge, make_case, op_table, ops_for

    table = op_table()
    ops = ops_for(table, op)
    for i in range(start, stop):
        rec: dict[str, Any] = {"index": i, "seed": seed, "op": "/".join(ops[i % len(ops)])}
        try:
            case = make_case(seed, i, ops, table)
        except Skip as e:
            rec.update(status="skipped", reason=str(e))
        except Exception as e:  # noqa: BLE001 - a generator bug: counted, never fatal
            rec.update(status="generator-error", reason=f"{type(e).__name__}: {str(e)[:200]}")
        else:
            res = judge(case)
            rec.update(status=res.status, reason=res.reason, detail=res.detail)
        out.write(json.dumps(rec) + "\n")
        out.flush()


def _spawn(seed: int, start: int, stop: int, path: Path, op: str | None) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "tests.fuzz", "--worker", "--seed", str(seed), "--start", str(start),
           "--stop", str(stop), "--out", str(path)]
    if op:
        cmd += ["--op", op]
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
    return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def run_fuzz(cases: int, seed: int = 0, jobs: int = 2, batch: int = 100, start: int = 0,
             op: str | None = None, per_case_timeout: float = 20.0, progress: bool = False) -> Totals:
    """Judge cases [start, start + cases) in up to ``jobs`` worker processes at a time."""
    totals = Totals()
    t0 = time.monotonic()
    queue = [(a, min(a + batch, start + cases)) for a in range(start, start + cases, batch)]
    running: list[tuple[subprocess.Popen, Path, int, int, float]] = []
    with tempfile.TemporaryDirectory(prefix="onnxforge-fuzz-") as tmp:
        serial = 0
        while queue or running:
            while queue and len(running) < jobs:
                a, b = queue.pop(0)
                serial += 1
                path = Path(tmp) / f"batch{serial}.jsonl"
                running.append((_spawn(seed, a, b, path, op), path, a, b, time.monotonic()))
            time.sleep(0.05)
            still = []
            for proc, path, a, b, t in running:
                done = _read(path)
                budget = 60.0 + per_case_timeout * (b - a) / 4
                hung = proc.poll() is None and time.monotonic() - t > budget and len(done) < b - a
                if proc.poll() is None and not hung:
                    still.append((proc, path, a, b, t))
                    continue
                if hung:
                    proc.kill()
                    proc.wait()
                for rec in done:
                    totals.add(rec)
                nxt = a + len(done)
                if nxt < b:  # the worker died (or hung) in case nxt: count it, go on after it
                    err = proc.stderr.read().decode(errors="replace")[-400:] if proc.stderr else ""
                    why = "hang" if hung else f"exit status {proc.returncode}"
                    totals.add({"index": nxt, "seed": seed, "status": "crash", "reason": why, "detail": err})
                    if nxt + 1 < b:
                        queue.insert(0, (nxt + 1, b))
                elif proc.stderr:
                    proc.stderr.read()
                if progress:
                    print(f"  ... {totals.cases} cases", file=sys.stderr, flush=True)
            running = still
    totals.seconds = time.monotonic() - t0
    return totals


def _read(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    recs = []
    for line in path.read_text().splitlines():
        try:
            recs.append(json.loads(line))
        except json.JSONDecodeError:  # a line cut short by a crash
            break
    return recs
