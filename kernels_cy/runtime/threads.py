"""Thread control of the CPU backend: the one place that sets BLAS's pool size.

The backend's own kernels run their parallel loops on one worker pool
(``runtime/_pool.h``, no OpenMP), bounded per call by the session's ``threads``;
its workers sleep as soon as no run is active. Small work never goes to the pool
at all (see ``NodeSpec.threads_for``). BLAS (numpy's) keeps its own threads,
sized here.

BLAS: a decode step's products are tiny ([1, 128] x [128, 512]); a threaded
OpenBLAS call then costs more in wake-ups than it saves, and with a loaded
machine a descheduled worker stalls the caller. :data:`BLAS` sets the pool size
through OpenBLAS's own setter, only when it changes: one thread below
:data:`BLAS_PARALLEL_WORK` multiply-adds over a weight smaller than
:data:`BLAS_PARALLEL_BYTES`, the session's bound otherwise (a one-row product over
a large weight is bandwidth-bound, and two cores stream it faster than one). A session
run calls :meth:`BlasThreads.begin` / :meth:`BlasThreads.end` so the caller's
setting is restored when the last active run returns (threads=N bounds BLAS for the
run). BLAS's thread count is process-wide: while more than one run is active in the
process no run changes it (each keeps the count it finds), so concurrent runs never
race on it.

    token = BLAS.begin(bound)      # BLAS uses at most ``bound`` threads (when alone)
    BLAS.want(1)                   # a small product: one thread (no call if unchanged)
    BLAS.end(token)                # the caller's setting again once no run is active
"""
from __future__ import annotations

import os
import threading
from typing import Any

__all__ = ["BLAS", "BLAS_PARALLEL_BYTES", "BLAS_PARALLEL_WORK", "BlasThreads"]

BLAS_PARALLEL_WORK = 1 << 21  # multiply-adds: below this a BLAS product runs on one thread...
BLAS_PARALLEL_BYTES = 3 << 19  # ...unless its weight is this large (a one-row product streams it;
# measured on 2 cores: [1, 512] x [512, 1536] 1.3x faster on 2 threads, [512, 512] not)


class BlasThreads:
    """The BLAS libraries numpy loaded, with a cached pool size (``None``: unknown) and the
    number of runs active in the process."""

    def __init__(self) -> None:
        self._libs: list[Any] | None = None
        self.current: int | None = None
        self.bound = os.cpu_count() or 1
        self.active = 0  # runs between begin and end
        self._saved: int | None = None  # the caller's setting before the first active run
        self._lock = threading.Lock()

    def _controllers(self) -> list[Any]:
        if self._libs is None:
            try:
                from threadpoolctl import ThreadpoolController

                self._libs = [c for c in ThreadpoolController().lib_controllers if c.user_api == "blas"]
            except ImportError:  # threadpoolctl is optional: BLAS keeps its own setting
                self._libs = []
        return self._libs

    def _set(self, n: int) -> None:
        for lib in self._controllers():
            lib.set_num_threads(n)
        self.current = n

    def begin(self, bound: int) -> int | None:
        """Start a run bounded to ``bound`` threads; returns the token :meth:`end` takes."""
        libs = self._controllers()
        with self._lock:
            self.active += 1
            if not libs:
                return None
            if self.active == 1:
                saved = int(libs[0].get_num_threads())
                self._saved = saved
                self.current = saved
                self.bound = bound
                if saved > bound:
                    self._set(bound)
            return self._saved

    def want(self, n: int) -> None:
        """Use ``min(n, bound)`` threads for the next products (a no-op when unchanged, and
        while another run is active)."""
        n = n if n < self.bound else self.bound
        if n != self.current and self.active == 1:
            with self._lock:
                if self.active == 1 and n != self.current:
                    self._set(n)

    def for_work(self, work: int, weight_bytes: int = 0) -> None:
        """Pool size for a product of ``work`` multiply-adds over a ``weight_bytes`` operand."""
        self.want(1 if work < BLAS_PARALLEL_WORK and weight_bytes < BLAS_PARALLEL_BYTES else self.bound)

    def end(self, token: int | None) -> None:
        """A run ended: the last active run restores the caller's setting."""
        with self._lock:
            self.active -= 1
            if self.active == 0 and token is not None and self._saved is not None:
                if self._saved != self.current:
                    self._set(self._saved)
                self._saved = None


BLAS = BlasThreads()
