"""The closed lists the fuzz harness judges by.

``OUT_OF_SPEC``: inputs outside an operator's specification, where the backend raises a
typed error although an oracle computes something (a generator tags such a case with
the key). Any other typed rejection of an input an oracle accepts is a mismatch.

``ORACLE_DISAGREEMENTS``: places where onnx.reference and onnxruntime give different
answers on the same model; the harness then follows the oracle named here (cases are
counted as oracle-disagreements, with this reason, when the backend agrees with it).
A disagreement on an operator missing from this table is reported as ``unlisted``.
"""
from __future__ import annotations

__all__ = ["ORACLE_DISAGREEMENTS", "OUT_OF_SPEC"]

OUT_OF_SPEC: dict[str, str] = {
    "integer-division-by-zero":
        "integer Div/Mod by zero is undefined (numpy gives 0 with a warning, onnxruntime traps or "
        "gives garbage); the backend computes numpy's value or raises",
    "integer-pow-zero-negative":
        "0 to a negative integer power has no integer value; onnxruntime returns INT_MIN through an "
        "undefined double->int cast, onnx.reference raises; the backend raises a KernelError",
    "split-num-outputs-leaves-empty":
        "num_outputs with ceil(n / k) * (k - 1) >= n leaves no element for the last part(s); onnx.reference "
        "then gives the last output a negative size (numpy slicing), onnxruntime refuses",
    "pad-reflect-beyond-edge":
        "reflect/wrap padding wider than the axis (or of an empty axis) is not defined by the "
        "specification; numpy repeats the reflection, onnxruntime refuses",
    "pad-edge-of-empty":
        "edge padding of an empty axis has no edge value",
    "argmax-of-empty":
        "ArgMax/ArgMin over an empty axis has no index",
}

# op -> (the oracle followed, reason)
ORACLE_DISAGREEMENTS: dict[str, tuple[str, str]] = {
    "Slice": ("spec",
              "negative steps: onnx.reference slices with numpy rules, so a start below -n gives nothing "
              "(the specification clamps it to 0, as onnxruntime does); onnxruntime reads an end of "
              "INT32_MAX or INT64_MAX as 'through element 0' (the specification clamps it to n - 1, as "
              "onnx.reference does). The backend follows the specification."),
    "GatherElements": ("ort",
                       "onnx.reference accepts out-of-range indices (it indexes the flattened data) and refuses "
                       "indices smaller than the data off the axis; onnxruntime does the opposite, as the "
                       "specification says"),
    "Pow": ("ort", "integer base and negative integer exponent: onnx.reference raises (numpy), onnxruntime "
                   "truncates the double power toward zero"),
    "Split": ("ort", "onnx.reference accepts split sizes that do not add up to the axis (numpy slicing); "
                     "onnxruntime refuses them"),
    "RotaryEmbedding": ("ort", "onnx.reference wraps negative position ids (numpy indexing); onnxruntime "
                               "refuses positions outside the cache"),
    "ReduceMax": ("ort", "onnx.reference raises on an empty reduction; onnxruntime gives the identity "
                         "(-inf / the type's minimum), as the specification says"),
    "ReduceMin": ("ort", "as ReduceMax (+inf / the type's maximum)"),
    "MatMul": ("ort", "bfloat16: onnx.reference multiplies in bfloat16 steps; onnxruntime accumulates in float32"),
    "Gemm": ("ort", "bfloat16, as MatMul"),
    "Cast": ("ort", "bfloat16 and bool conversions: onnx.reference goes through its own tables"),
    "Hardmax": ("ort", "opset < 13 with a negative axis: onnx.reference coerces to 2-D at the wrong axis"),
    "Loop": ("ort", "zero iterations with a scan output: onnx.reference fails to stack nothing"),
    "Scan": ("ort", "onnx.reference implements neither reversed scan directions nor zero-length scans"),
    "Pad": ("ort", "negative pads (cropping): onnx.reference refuses them, the specification allows them"),
    "LogSoftmax": ("ort", "float16: onnx.reference takes log(exp(x - max) / sum) in float16, which underflows "
                          "to -inf; onnxruntime (and the backend) compute x - max - log(sum)"),
    "QuantizeLinear": ("ort", "16-bit outputs: onnx.reference wraps values past the type's range instead of "
                              "saturating"),
    "ReduceLogSumExp": ("ort", "onnx.reference fails on a scalar input, and gives NaN for a row of -inf "
                               "(log of 0 is -inf, as onnxruntime gives)"),
    "ReduceSumSquare": ("ort", "int32 input: onnx.reference returns int64"),
    "Softmax": ("ort", "opset < 13: onnx.reference applies the new per-axis softmax instead of coercing the "
                       "input to 2-D at the axis"),
    "LayerNormalization": ("ort", "float16 input: onnx.reference returns Mean and InvStdDev in float16 (the "
                                  "specification types them by stash_type, float32 by default); normalized "
                                  "dimensions holding no element: onnx.reference computes, onnxruntime refuses"),
    "Flatten": ("ort", "an empty input: onnx.reference reshapes with -1, which numpy cannot infer from 0 elements"),
    "Mean": ("numpy", "broadcasting inputs: onnx.reference adds into the first input's buffer and fails "
                      "when it is not the broadcast shape; the harness then uses numpy"),
    "Sum": ("numpy", "as Mean"),
    "Shape": ("ort", "an end below -rank: onnx.reference slices with numpy (end -5 of rank 3 wraps), the "
                     "specification clamps it to 0"),
}
