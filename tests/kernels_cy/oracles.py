"""Independent oracles for the kernel tests: one-node onnxruntime models and float64 numpy."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from onnx import TensorProto, helper

_NP_TO_ONNX = {
    np.dtype(np.float32): TensorProto.FLOAT,
    np.dtype(np.int32): TensorProto.INT32,
    np.dtype(np.int64): TensorProto.INT64,
    np.dtype(np.uint8): TensorProto.UINT8,
}


def run_ort_node(op_type: str, inputs: Sequence[tuple[str, np.ndarray | None]], n_outputs: int,
                 domain: str = "com.microsoft", opset: int = 21, **attrs: object) -> list[np.ndarray]:
    """Run one node (default opset ``opset`` + com.microsoft 1) on onnxruntime, optimizations off.

    ``inputs`` pairs a name with an array, or with None for an omitted optional input;
    initializers are not used, so every array is a feed.
    """
    import onnxruntime as ort

    names, vinfos, feeds = [], [], {}
    for name, arr in inputs:
        if arr is None:
            names.append("")
            continue
        names.append(name)
        vinfos.append(helper.make_tensor_value_info(name, _NP_TO_ONNX[arr.dtype], list(arr.shape)))
        feeds[name] = arr
    outs = [f"out{i}" for i in range(n_outputs)]
    node = helper.make_node(op_type, names, outs, domain=domain, **attrs)
    graph = helper.make_graph([node], "one_node", vinfos,
                              [helper.make_empty_tensor_value_info(o) for o in outs])
    opsets = [helper.make_opsetid("", opset), helper.make_opsetid("com.microsoft", 1)]
    model = helper.make_model(graph, opset_imports=opsets, ir_version=10)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.intra_op_num_threads = 1
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)
