"""Memory and time of the wire scanner (``onnxforge.proto_ext.wirescan``).

1. A model with one 200 MB float32 initializer (written by ``onnx.save`` in a child
   process): ``strip_payloads`` on a read-only ``mmap`` of the file -- time, Python
   allocation peak (tracemalloc), peak RSS growth (VmHWM, reset through
   /proc/self/clear_refs where allowed), pages of the mapping touched -- then
   ``write_model`` back to disk, compared with protobuf's own parse.
2. ``strip_payloads`` / ``write_model`` on the synthetic 20,000-node chain model.

    python benchmarks/wirescan_memory.py [--chain-model /work/shared/bench/chain_model.py]
"""
from __future__ import annotations

import argparse
import filecmp
import importlib.util
import io
import mmap
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

from onnxforge.proto_ext.wirescan import payload_views, strip_payloads, write_model

__all__ = ["main"]

_MAKE_BIG = """
import sys, numpy as np, onnx
from onnx import helper, numpy_helper, TensorProto
w = numpy_helper.from_array(np.zeros(50_000_000, np.float32), "w")
g = helper.make_graph([helper.make_node("Identity", ["w"], ["y"])], "big", [],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [50_000_000])], [w])
onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)]), sys.argv[1])
"""

_MB = 1 << 20


def _status() -> dict[str, int]:
    out: dict[str, int] = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("VmHWM", "VmRSS")):
                key, value = line.split(":")
                out[key] = int(value.split()[0]) * 1024
    return out


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return True


def _mapping_rss(path: Path) -> int:
    total, inside = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            first = line.split(" ", 1)[0]
            if "-" in first and ":" not in first:
                inside = line.rstrip().endswith(str(path))
            elif inside and line.startswith("Rss:"):
                total += int(line.split()[1]) * 1024
    return total


def big_model(tmp: Path) -> None:
    """Measure the 200 MB single-initializer case."""
    path = tmp / "big.onnx"
    subprocess.run([sys.executable, "-c", _MAKE_BIG, str(path)], check=True)
    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        reset = _reset_peak()
        before = _status()
        t0 = time.perf_counter()
        stripped = strip_payloads(mm)
        elapsed = time.perf_counter() - t0
        after = _status()
        touched = _mapping_rss(path)
        tracemalloc.start()
        strip_payloads(mm)
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        refs = [(r.kind, r.index, r.length) for r in stripped.payloads]
        print(f"200 MB model: strip_payloads {elapsed * 1e3:.2f} ms, skeleton "
              f"{len(stripped.skeleton)} B, payloads {refs}")
        print(f"  peak RSS growth {(after['VmHWM'] - before['VmRSS']) / _MB:.2f} MB "
              f"(peak reset: {reset}), mapping pages touched {touched / _MB:.2f} MB, "
              f"tracemalloc peak {peak / 1024:.1f} KiB")
        views = payload_views(mm, stripped)
        out_path = tmp / "copy.onnx"
        tracemalloc.start()
        t0 = time.perf_counter()
        with open(out_path, "wb") as out:
            written = write_model(out, stripped.skeleton, views)
        elapsed = time.perf_counter() - t0
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        for v in views.values():
            v.release()
        views.clear()
        same = filecmp.cmp(path, out_path, shallow=False)
        print(f"  write_model {written / _MB:.0f} MB in {elapsed * 1e3:.0f} ms, tracemalloc peak "
              f"{peak / 1024:.1f} KiB, identical: {same}")

    import onnx  # for comparison: protobuf's own parse of the same file

    _reset_peak()
    before = _status()
    data = path.read_bytes()
    model = onnx.ModelProto()
    model.ParseFromString(data)
    after = _status()
    print(f"  for comparison, read + ParseFromString: peak RSS growth "
          f"{(after['VmHWM'] - before['VmRSS']) / _MB:.0f} MB")
    del model, data


def chain(chain_model: Path) -> None:
    """Time the 20,000-node chain model."""
    spec = importlib.util.spec_from_file_location("chain_model", chain_model)
    if spec is None or spec.loader is None:
        raise FileNotFoundError(chain_model)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    data = module.build(20000).SerializeToString()
    print(f"chain 20,000 nodes ({len(data) / _MB:.2f} MB):")
    for min_size in (1024, 0):
        times = []
        for _ in range(7):
            t0 = time.perf_counter()
            stripped = strip_payloads(data, min_size=min_size)
            times.append(time.perf_counter() - t0)
        views = payload_views(data, stripped)
        buf = io.BytesIO()
        t0 = time.perf_counter()
        write_model(buf, stripped.skeleton, views)
        wtime = time.perf_counter() - t0
        print(f"  min_size={min_size}: strip_payloads best {min(times) * 1e3:.1f} ms / median "
              f"{sorted(times)[3] * 1e3:.1f} ms ({len(stripped.payloads)} payloads); write_model "
              f"{wtime * 1e3:.1f} ms; identical: {buf.getvalue() == data}")


def main() -> None:
    """Run both measurements."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chain-model", type=Path,
                        default=Path("/work/shared/bench/chain_model.py"),
                        help="path of the chain model builder (a build(n) function)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        big_model(Path(tmp))
    if args.chain_model.exists():
        chain(args.chain_model)
    else:
        print(f"chain model builder not found at {args.chain_model}; skipped")


if __name__ == "__main__":
    main()
