"""The built-in stateful decoder and the ``onnxforge demo`` job.

``build_decoder()`` authors, with :class:`GraphBuilder`, a small transformer
decoder that uses everything onnxforge makes first-class:

* encoded initializers: MLP weights as blocked INT4 affine values and the
  output projection as ``Int4Block`` struct records (a catalogue declaration);
* capacity-sized KV caches bound ``READ_WRITE`` and updated in place by
  ``ai.onnxforge::CacheUpdate`` (output_alias + alias_of);
* persistent bindings: each updated cache feeds its cache input on the next call.

Inputs: ``input_ids`` int64 [1, seq], ``position`` int64 [] (tokens already in
the cache), ``cache.{l}.key`` / ``cache.{l}.value`` float32
[1, kv_heads, capacity, head_dim]. Outputs: ``logits`` [1, seq, vocab] and the
updated caches.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Any

import numpy as np
from onnx import TensorProto

from onnxforge.errors import OnnxforgeError

__all__ = ["DecoderConfig", "build_builtin", "build_decoder", "builtin_model", "run_demo", "BUILTINS"]

FLOAT, INT64, INT4 = TensorProto.FLOAT, TensorProto.INT64, TensorProto.INT4


@dataclass(frozen=True)
class DecoderConfig:
    vocab: int = 64
    hidden: int = 32
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 8
    ffn: int = 64
    layers: int = 2
    capacity: int = 64
    seed: int = 0


def _int4_block_records(w: np.ndarray) -> tuple[bytes, np.ndarray]:
    """Encode ``w`` (row-major, size % 32 == 0) as Int4Block records; returns the payload
    and the exactly representable weights it decodes to."""
    from onnxforge.proto_ext.codecs.bits import pack_codes

    flat = w.reshape(-1, 32).astype(np.float64)
    scale = np.maximum(np.abs(flat).max(axis=1) / 7.0, 1e-8).astype(np.float32)
    codes = np.clip(np.rint(flat / scale[:, None]), -8, 7).astype(np.int8)
    # a record: 32 INT4 codes (16 bytes, packed like raw_data), then the scale as little-endian float
    packed = np.frombuffer(pack_codes(codes, 4), np.uint8).reshape(len(scale), 16)
    payload = np.concatenate([packed, scale.astype("<f4").view(np.uint8).reshape(-1, 4)], axis=1).tobytes()
    decoded = (codes.astype(np.float32) * scale[:, None]).reshape(w.shape)
    return payload, decoded


def build_decoder(cfg: DecoderConfig = DecoderConfig()):
    """The built-in stateful decoder as an IR ``Model``."""
    from onnxforge.graphbuilder.builder.graph_builder import READ_WRITE, GraphBuilder, tensor_type

    rng = np.random.default_rng(cfg.seed)

    def weight(*shape: int, scale: float = 0.2) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    g = GraphBuilder(opset=23, name="onnxforge_decoder")
    g.model.producer_name = "onnxforge"
    g.model.doc_string = "onnxforge built-in stateful decoder"
    op = g.op
    ids = g.input("input_ids", INT64, [1, "seq"])
    position = g.input("position", INT64, [])
    caches = []
    for layer in range(cfg.layers):
        for kind in ("key", "value"):
            caches.append(g.input(f"cache.{layer}.{kind}", FLOAT,
                                  [1, cfg.kv_heads, cfg.capacity, cfg.head_dim], access=READ_WRITE))

    block = g.declare_struct_type("Int4Block", [
        ("codes", _int4_array_type(32)),
        ("scale", tensor_type(FLOAT, [])),
    ], doc_string="32 signed INT4 codes and one FLOAT scale; value = code * scale",
       decoder=_int4_block_decoder())

    embed = g.initializer("embed", weight(cfg.vocab, cfg.hidden, scale=1.0))
    x = op.Gather(embed, ids, axis=0)                                  # [1, seq, hidden]

    one = g.initializer("one", np.array([1], np.int64))
    shape_ids = op.Shape(ids)
    seq = op.Gather(shape_ids, one, axis=0)                            # [1]
    seq_scalar = op.Squeeze(seq)
    end = op.Add(position, seq_scalar)
    q_pos = op.Range(position, end, g.initializer("step", np.array(1, np.int64)))          # [seq]
    k_pos = op.Range(g.initializer("zero", np.array(0, np.int64)),
                     g.initializer("capacity", np.array(cfg.capacity, np.int64)),
                     g.initializer("step1", np.array(1, np.int64)))                        # [capacity]
    mask = op.LessOrEqual(op.Unsqueeze(k_pos, g.initializer("ax0", np.array([0], np.int64))),
                          op.Unsqueeze(q_pos, g.initializer("ax1", np.array([1], np.int64))))

    q_shape = g.initializer("q_shape", np.array([1, -1, cfg.heads, cfg.head_dim], np.int64))
    kv_shape = g.initializer("kv_shape", np.array([1, -1, cfg.kv_heads, cfg.head_dim], np.int64))
    h_shape = g.initializer("h_shape", np.array([1, -1, cfg.heads * cfg.head_dim], np.int64))
    outputs = []
    for layer in range(cfg.layers):
        p = f"layer{layer}"
        gamma = g.initializer(f"{p}.norm1", np.ones(cfg.hidden, np.float32))
        h = op.RMSNormalization(x, gamma, axis=-1, epsilon=1e-6)
        q = op.Transpose(op.Reshape(op.MatMul(h, g.initializer(f"{p}.wq", weight(cfg.hidden, cfg.heads * cfg.head_dim))), q_shape), perm=[0, 2, 1, 3])
        k = op.Transpose(op.Reshape(op.MatMul(h, g.initializer(f"{p}.wk", weight(cfg.hidden, cfg.kv_heads * cfg.head_dim))), kv_shape), perm=[0, 2, 1, 3])
        v = op.Transpose(op.Reshape(op.MatMul(h, g.initializer(f"{p}.wv", weight(cfg.hidden, cfg.kv_heads * cfg.head_dim))), kv_shape), perm=[0, 2, 1, 3])
        k_cache = op.CacheUpdate(caches[2 * layer], k, position, axis=-2)
        v_cache = op.CacheUpdate(caches[2 * layer + 1], v, position, axis=-2)
        attn = op.Attention(q, k_cache, v_cache, mask)
        attn = op.Reshape(op.Transpose(attn, perm=[0, 2, 1, 3]), h_shape)
        x = op.Add(x, op.MatMul(attn, g.initializer(f"{p}.wo", weight(cfg.heads * cfg.head_dim, cfg.hidden))))
        gamma2 = g.initializer(f"{p}.norm2", np.ones(cfg.hidden, np.float32))
        h2 = op.RMSNormalization(x, gamma2, axis=-1, epsilon=1e-6)
        w1 = g.encoded_initializer(f"{p}.w1", weight(cfg.hidden, cfg.ffn), storage_type=INT4,
                                   axis=0, block_size=16)
        w2 = g.encoded_initializer(f"{p}.w2", weight(cfg.ffn, cfg.hidden), storage_type=INT4,
                                   axis=0, block_size=16)
        x = op.Add(x, op.MatMul(op.Relu(op.MatMul(h2, w1)), w2))
        outputs.append((k_cache, f"present.{layer}.key", caches[2 * layer]))
        outputs.append((v_cache, f"present.{layer}.value", caches[2 * layer + 1]))

    final = op.RMSNormalization(x, g.initializer("norm_f", np.ones(cfg.hidden, np.float32)),
                                axis=-1, epsilon=1e-6)
    payload, _ = _int4_block_records(weight(cfg.hidden, cfg.vocab))
    w_out = g.encoded_initializer("lm_head", struct_type=block, codes=payload,
                                  logical_type=tensor_type(FLOAT, [cfg.hidden, cfg.vocab]))
    g.output(op.MatMul(final, w_out), "logits", type=tensor_type(FLOAT, [1, "seq", cfg.vocab]))
    for value, name, cache in outputs:
        g.output(value, name, type=cache.type)
        g.bind(cache, name)
    return g.to_model()


def _int4_block_decoder():
    """The Int4Block decoder as a FunctionProto: ``value[r, i] = float(codes[r, i]) * scale[r]``
    (``codes`` int8 [R, 32], ``scale`` float [R], output float [R, 32])."""
    from onnx import helper

    nodes = [
        helper.make_node("Cast", ["codes"], ["codes_f"], to=FLOAT),
        helper.make_node("Constant", [], ["axis1"], value=helper.make_tensor("axis1", INT64, [1], [1])),
        helper.make_node("Unsqueeze", ["scale", "axis1"], ["scale_col"]),
        helper.make_node("Mul", ["codes_f", "scale_col"], ["value"]),
    ]
    return helper.make_function("onnxforge.decoders", "Int4Block_decode", ["codes", "scale"],
                                ["value"], nodes, [helper.make_opsetid("", 23)])


def _int4_array_type(n: int):
    from onnxforge.proto_ext.types import ArrayKind, StructType, TensorType

    return StructType(kind="array", array=ArrayKind(TensorType(INT4, ()), n))


def build_rnn(hidden: int = 8, features: int = 4, seed: int = 0):
    """A stateless recurrent cell as an IR ``Model``: ``stateN = Tanh(x Wx + state Wh)``,
    ``y = stateN Wy``; the caller feeds ``stateN`` back as ``state`` (no bindings declared)."""
    from onnxforge.graphbuilder.builder.graph_builder import GraphBuilder

    rng = np.random.default_rng(seed)
    g = GraphBuilder(opset=23, name="onnxforge_rnn")
    op = g.op
    x = g.input("x", FLOAT, [1, features])
    state = g.input("state", FLOAT, [1, hidden])
    wx, wh, wy = ((rng.standard_normal(s) * 0.5).astype(np.float32)
                  for s in ((features, hidden), (hidden, hidden), (hidden, 2)))
    new = op.Tanh(op.Add(op.MatMul(x, g.initializer("wx", wx)), op.MatMul(state, g.initializer("wh", wh))))
    g.output(op.MatMul(new, g.initializer("wy", wy)), "y")
    g.output(new, "stateN")
    return g.to_model()


BUILTINS: dict[str, Any] = {"decoder": build_decoder, "rnn": build_rnn}


def build_builtin(name: str):
    """The built-in model ``name`` as an IR ``Model``."""
    try:
        factory = BUILTINS[name]
    except KeyError:
        raise OnnxforgeError(f"no built-in model {name!r}; known: {sorted(BUILTINS)}") from None
    return factory()


def builtin_model(name: str):
    """A built-in model as a stock ``onnx.ModelProto`` (extensions as unknown fields)."""
    from onnxforge.graphbuilder.serde import to_onnx

    return to_onnx(build_builtin(name))


def _backend_decode(model: Any, prompt: list[int], steps: int, out: Any) -> tuple[list[int], list[np.ndarray]]:
    """Greedy decode on onnxforge's backend through the in-place state; prints one line per
    step and returns the tokens and the last-position logits of every step."""
    import time

    from onnxforge.kernels_cy.runtime.state import make_state

    tokens: list[int] = []
    logits: list[np.ndarray] = []
    first: dict[str, int] | None = None
    moved = False
    with make_state(model) as state:
        ids, position = list(prompt), 0
        print(f"   {'step':>4} {'token':>5} {'ms':>8} {'cache B':>9} {'allocated B':>12} {'copied B':>9}",
              file=out)
        for step in range(steps):
            t0 = time.perf_counter()
            got = state.run({"input_ids": np.array([ids], np.int64), "position": np.array(position, np.int64)})
            ms = (time.perf_counter() - t0) * 1e3
            position += len(ids)
            row = np.asarray(got["logits"])[0, -1].copy()
            token = int(row.argmax())
            tokens.append(token)
            logits.append(row)
            addresses = state.addresses()
            first = addresses if first is None else first
            moved = moved or addresses != first
            c = state.last_run
            print(f"   {step:>4} {token:>5} {ms:>8.3f} {c.cache_bytes:>9,} {c.allocated_bytes:>12,} "
                  f"{c.copied_bytes:>9,}", file=out)
            ids = [token]
    print(f"   cache buffers kept their addresses across every step: {'no' if moved else 'yes'}", file=out)
    return tokens, logits


def run_demo(output_dir: str, out=sys.stdout, steps: int = 24) -> int:
    """Build the built-in decoder, verify, save, reload, inspect, optimize it, decode a few
    dozen tokens on onnxforge's backend with the caches updated in place, then export it to
    standard ONNX and check that onnxruntime decodes the same tokens and logits."""
    import json

    import onnxforge as of
    from onnxforge.graphbuilder import serde
    from onnxforge.graphbuilder.ir.view import model_view
    from onnxforge.report import render_text, summarize

    os.makedirs(output_dir, exist_ok=True)
    model = build_decoder()
    print("1. built the stateful decoder with GraphBuilder", file=out)
    of.verify(model)
    print("2. verified: every static rule holds", file=out)
    path = os.path.join(output_dir, "decoder.onnx")
    serde.save(model, path)
    print(f"3. saved {path} ({os.path.getsize(path):,} bytes)", file=out)
    again = serde.load(path)
    of.verify(again)
    of.infer_shapes(again)
    print("4. reloaded, verified and shape-inferred:", file=out)
    sizes = {v.name: v.const.nbytes for g in again.all_graphs() for v in g.all_initializers()}
    print("   " + render_text(summarize(model_view(again), sizes)).replace("\n", "\n   "), file=out)
    nodes = len(again.graph)
    optimized = of.optimize(again)
    of.verify(optimized)
    print(f"5. optimized: {nodes} -> {len(optimized.graph)} nodes, still verified", file=out)
    prompt = [1, 2, 3]
    cfg = DecoderConfig()
    steps = min(steps, cfg.capacity - len(prompt) + 1)
    print(f"6. decoding {steps} tokens after the prompt {prompt} on onnxforge's CPU backend, "
          "caches updated in place:", file=out)
    tokens, logits = _backend_decode(optimized, prompt, steps, out)
    std = of.to_standard_onnx(optimized)
    std_path = os.path.join(output_dir, "decoder.standard.onnx")
    with open(std_path, "wb") as fh:
        fh.write(std.SerializeToString())
    feedback = json.loads({p.key: p.value for p in std.metadata_props}["onnxforge.feedback"])
    ops = sorted({n.op_type for n in std.graph.node})
    print(f"7. exported to standard ONNX opset {std.opset_import[0].version}: {std_path}", file=out)
    print(f"   operators: {', '.join(ops)}", file=out)
    print(f"   feedback (input <- output): {feedback}", file=out)
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    sess = ort.InferenceSession(std.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    state = {i.name: np.zeros([d if isinstance(d, int) else 1 for d in i.shape], np.float32)
             for i in sess.get_inputs() if i.name in feedback}
    feed_ids, position, worst, same = np.array([prompt], np.int64), 0, 0.0, True
    from tqdm import tqdm

    for k in tqdm(range(steps), desc="onnxruntime check", unit="tok", file=sys.stderr, leave=False,
                  disable=out is not sys.stdout):
        outs = sess.run(None, {"input_ids": feed_ids, "position": np.array(position, np.int64), **state})
        named = dict(zip([o.name for o in sess.get_outputs()], outs))
        position += feed_ids.shape[1]
        state = {inp: named[outp] for inp, outp in feedback.items()}
        row = named["logits"][0, -1]
        worst = max(worst, float(np.abs(row - logits[k]).max()))
        same = same and int(row.argmax()) == tokens[k]
        feed_ids = np.array([[tokens[k]]], np.int64)
    cache_bytes = sum(a.nbytes for a in state.values())
    print(f"8. onnxruntime on the standard export: {'the same' if same else 'DIFFERENT'} {steps} tokens, "
          f"logits within {worst:.2e} of onnxforge's; it hands {cache_bytes:,} bytes of cache back "
          "and forth each step, where onnxforge wrote only the new rows", file=out)
    return 0 if same and worst < 1e-4 else 1
