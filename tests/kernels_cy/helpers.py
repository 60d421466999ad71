"""Small models for the backend tests (built with onnx.helper or GraphBuilder)."""
from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper


def onnx_model(nodes: list[Any], inputs: list[Any], outputs: list[Any], *, opset: int = 23,
               initializers: list[Any] = (), domains: dict[str, int] | None = None) -> onnx.ModelProto:
    """A ModelProto of one graph (default opset 23, plus ``domains``)."""
    opsets = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, v) for d, v in (domains or {}).items()]
    g = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(initializers))
    return helper.make_model(g, opset_imports=opsets, ir_version=10)


def tensor(name: str, elem: int, shape: list[Any] | None) -> Any:
    return helper.make_tensor_value_info(name, elem, shape)


F = TensorProto.FLOAT
I64 = TensorProto.INT64


def reference(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """The outputs of onnx.reference for ``model``."""
    from onnx.reference import ReferenceEvaluator

    return [np.asarray(o) for o in ReferenceEvaluator(model).run(None, feeds)]


def ort_greedy(path: Any, prompt: list[int], new: int, *, kv_heads: int = 2,
               head_dim: int = 32) -> tuple[list[int], list[np.ndarray]]:
    """Greedy decode with onnxruntime on an original past/present decoder (past <- present
    fed back by hand, an all-ones attention mask): the tokens and last-position logits."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    past = {i.name: np.zeros((1, kv_heads, 0, head_dim), np.float32) for i in sess.get_inputs()
            if i.name.startswith("past_key_values")}
    ids, total, tokens, logits = list(prompt), 0, [], []
    for _ in range(new):
        total += len(ids)
        out = dict(zip(names, sess.run(None, {"input_ids": np.array([ids], np.int64),
                                             "attention_mask": np.ones((1, total), np.int64), **past})))
        past = {k: out[k.replace("past_key_values", "present")] for k in past}
        logits.append(out["logits"][0, -1])
        ids = [int(out["logits"][0, -1].argmax())]
        tokens.append(ids[0])
    return tokens, logits
