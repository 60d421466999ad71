"""In-place writes stay sound through every pass (rule L13; DESIGN.md, *Semantics of
in-place writes*).

A generated program is a random L13-valid stateful graph: one or two READ_WRITE
caches, chains of ``CacheUpdate`` (plain, inside a local function, or inside an
``If`` whose branches both write), snapshots of a version (``Identity``,
``Reshape``, same-type ``Cast``, ``Mul`` by one, ``Add`` of zero, single-input
``Concat``), reads of a version placed before its writer, reads of snapshots
placed after it, persistent bindings of the final versions and outputs that mix
pre- and post-write reads. Nodes are emitted in an order where every reader of a
version precedes its writer, so the program is valid by construction.

For the whole default pipeline (debug on and off) and for each of its passes
alone:

* the result verifies and its functional execution (``onnx.reference`` with a
  copying ``CacheUpdate``: the graph's meaning) equals the original's;
* an in-place execution of the result in its node order (``CacheUpdate`` writes
  into the cache, ``Identity``/``Reshape`` are views) equals its functional
  execution, and leaves the same final cache buffers as the original: a pass
  that forwards a snapshot onto the written storage, or moves a reader after the
  writer, breaks this.

Programs with *late reads* (a read of an old version emitted after its writer,
depending on nothing the writer computes: valid, since it is schedulable before
the writer) run in place only after a scheduler has put every reader before its
writer: ``topological_sort`` alone and the pipeline must do that.

The counterexamples of the rule are plain tests below the properties.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np
import onnx.printer
import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st
from onnx import TensorProto
from onnxforge.graphbuilder.builder.graph_builder import READ_WRITE, GraphBuilder, tensor_type
from onnxforge.graphbuilder.ir.core import Alias, Model, Value
from onnxforge.graphbuilder.serde import to_onnx
from onnxforge.passes import DEFAULT_PIPELINE, get_pass
from onnxforge.passes.framework.pipeline import optimize

import onnxforge as of
from tests.passes.functional import functional_run, inplace_run

FLOAT, INT64, BOOL = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL
SNAPSHOTS = ("Identity", "ReshapeSame", "ReshapeOther", "Cast", "MulOne", "AddZero", "Concat")
READS = ("ReduceSum", "Relu", "Add")
WRITES = ("plain", "plain", "function", "function_read", "if_const", "if_input")
POSITIONS = ("initializer", "constant", "input")


def graph_text(model: Model) -> str:
    return onnx.printer.to_text(to_onnx(model).graph)


# -- programs ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Step:
    """One event of a program, in emission order. ``kind`` is ``snap`` (a snapshot of
    cache ``cache``'s current version), ``read`` (of that version), ``readpool`` (of
    an earlier computed value), ``combine`` (two computed values), ``write`` (the next
    version of the cache, ``op`` saying how) or ``late`` (a read of an old version,
    emitted after its writer). Integer fields pick values modulo what exists when
    the step is emitted."""

    kind: str
    cache: int = 0
    op: str = ""
    k: int = 0
    j: int = 0
    n: int = 1
    position: int = 0
    position_kind: str = "initializer"
    cond: bool = True
    mix_values: bool = False

    def start(self, capacity: int) -> int:
        """The write offset: ``position`` brought into ``[0, capacity - n]``."""
        return self.position % (capacity - self.n + 1)


@dataclass(frozen=True)
class Program:
    """A recipe for a stateful model; :meth:`build` makes a fresh IR model each call."""

    n_caches: int
    capacity: int
    steps: tuple[Step, ...]
    bound: tuple[bool, ...]
    outputs: tuple[int, ...]

    @property
    def shape(self) -> tuple[int, ...]:
        return (1, 2, self.capacity, 4)

    def build(self) -> Model:
        return _Emitter(self).emit()

    def feeds(self, seed: int) -> dict[str, np.ndarray]:
        """Random caches and new values; positions and conditions as the steps chose."""
        rng = np.random.default_rng(seed)
        fixed = self._fixed_feeds()
        out: dict[str, np.ndarray] = {}
        for v in self.build().graph.inputs:
            if v.name in fixed:
                out[v.name] = fixed[v.name]
            else:
                shape = [int(d) for d in v.type.shape]
                out[v.name] = rng.standard_normal(shape).astype(np.float32)
        return out

    def _fixed_feeds(self) -> dict[str, np.ndarray]:
        fixed: dict[str, np.ndarray] = {}
        writes = [s for s in self.steps if s.kind == "write"]
        for w, s in enumerate(writes):
            if s.position_kind == "input":
                fixed[f"pos{w}"] = np.array(s.start(self.capacity), np.int64)
            if s.op == "if_input":
                fixed[f"cond{w}"] = np.array(s.cond)
        return fixed


@dataclass
class _Emitter:
    """Turns a :class:`Program` into GraphBuilder calls, keeping L13 by construction:
    a version is read only while it is current (before its writer is emitted), so no
    reader of a version can depend on the write that consumes it."""

    program: Program
    g: GraphBuilder = field(init=False)
    versions: list[Value] = field(init=False)
    history: list[list[Value]] = field(init=False)  # per cache, the versions already written
    pool: list[tuple[Value, tuple[int, ...]]] = field(init=False, default_factory=list)
    writes: int = field(init=False, default=0)
    names: int = field(init=False, default=0)

    def emit(self) -> Model:
        p = self.program
        self.g = GraphBuilder(opset=21)
        self.versions = [self.g.input(f"cache{c}", FLOAT, list(p.shape), access=READ_WRITE)
                         for c in range(p.n_caches)]
        self.history = [[] for _ in self.versions]
        for step in p.steps:
            getattr(self, f"_{step.kind}")(step)
        for c, bound in enumerate(p.bound):
            if bound:
                self.g.output(self.versions[c], f"cache{c}_out")
                self.g.bind(f"cache{c}", f"cache{c}_out")
        if not self.pool:
            self._read(Step("read", 0, "ReduceSum"))
        for i, k in enumerate(p.outputs):
            self.g.output(self.pool[k % len(self.pool)][0], f"out{i}")
        return self.g.to_model()

    # -- helpers ---------------------------------------------------------------------------
    def _fresh(self, base: str) -> str:
        self.names += 1
        return f"{base}{self.names}"

    def _add(self, v: Value, shape: tuple[int, ...]) -> Value:
        self.pool.append((v, shape))
        return v

    def _partner(self, shape: tuple[int, ...], k: int) -> Value | None:
        """A computed value that broadcasts with ``shape`` (a scalar or the same shape)."""
        fits = [v for v, s in self.pool if s == () or s == shape]
        return fits[k % len(fits)] if fits else None

    def _scalar(self, value: float) -> Value:
        return self.g.initializer(self._fresh("k"), np.array(value, np.float32))

    def _unary(self, op: str, x: Value, shape: tuple[int, ...], k: int) -> None:
        g = self.g
        if op == "ReduceSum":
            self._add(g.op.ReduceSum(x, keepdims=0), ())
        elif op == "Relu":
            self._add(g.op.Relu(x), shape)
        else:  # Add with another value of the pool (or with itself)
            other = self._partner(shape, k)
            self._add(g.op.Add(x, x if other is None else other), shape)

    # -- steps -----------------------------------------------------------------------------
    def _snap(self, s: Step) -> None:
        g, shape = self.g, self.program.shape
        x = self.versions[s.cache % len(self.versions)]
        if s.op == "Identity":
            self._add(g.op.Identity(x), shape)
        elif s.op == "ReshapeSame":
            dims = g.initializer(self._fresh("same"), np.array(shape, np.int64))
            self._add(g.op.Reshape(x, dims), shape)
        elif s.op == "ReshapeOther":
            other = (2, self.program.capacity * 4)
            dims = g.initializer(self._fresh("flat"), np.array(other, np.int64))
            self._add(g.op.Reshape(x, dims), other)
        elif s.op == "Cast":
            self._add(g.op.Cast(x, to=FLOAT), shape)
        elif s.op == "MulOne":
            one = self._scalar(1.0) if s.k % 2 else g.constant(np.array(1.0, np.float32))
            self._add(g.op.Mul(x, one), shape)
        elif s.op == "AddZero":
            zero = self._scalar(0.0) if s.k % 2 else g.constant(np.array(0.0, np.float32))
            self._add(g.op.Add(x, zero), shape)
        else:
            self._add(g.op.Concat(x, axis=0), shape)

    def _read(self, s: Step) -> None:
        self._unary(s.op, self.versions[s.cache % len(self.versions)], self.program.shape, s.k)

    def _late(self, s: Step) -> None:
        """A read of an *old* version, emitted after its writer: it depends on nothing the
        writer computes, so the graph is valid (L13: schedulable before the writer), but
        only a scheduler that puts readers before writers makes it run in place."""
        old = self.history[s.cache % len(self.history)]
        if old:
            x = old[s.j % len(old)]
            if s.op == "Identity":
                self._add(self.g.op.Identity(x), self.program.shape)
            else:
                self._unary(s.op, x, self.program.shape, s.k)

    def _readpool(self, s: Step) -> None:
        if self.pool:
            v, shape = self.pool[s.j % len(self.pool)]
            self._unary(s.op, v, shape, s.k)

    def _combine(self, s: Step) -> None:
        if self.pool:
            a, sa = self.pool[s.j % len(self.pool)]
            b = self._partner(sa, s.k)
            if b is not None:
                self._add(self.g.op.Add(a, b), sa)

    def _write(self, s: Step) -> None:
        g, p = self.g, self.program
        c = s.cache % len(self.versions)
        w, self.writes = self.writes, self.writes + 1
        n = s.n
        values: Value = g.input(f"vals{w}", FLOAT, [1, 2, n, 4])
        if s.mix_values:
            scalars = [v for v, sh in self.pool if sh == ()]
            if scalars:
                values = g.op.Add(values, scalars[s.k % len(scalars)])
        start = s.start(p.capacity)
        if s.position_kind == "input":
            pos = g.input(f"pos{w}", INT64, [])
        elif s.position_kind == "constant":
            pos = g.constant(np.array(start, np.int64), name=f"pos{w}")
        else:
            pos = g.initializer(f"pos{w}", np.array(start, np.int64))
        old = self.versions[c]
        if s.op == "plain":
            new = g.op.CacheUpdate(old, values, pos)
        elif s.op in ("function", "function_read"):
            new = self._call(s.op == "function_read", old, values, pos)
        else:
            new = self._if(s, w, old, values, pos)
        self.history[c].append(old)
        self.versions[c] = new

    def _call(self, with_read: bool, cache: Value, values: Value, pos: Value) -> Value:
        """``local.append(c, v, p) -> o`` (``o`` aliases ``c``); the ``_read`` variant also
        returns ``ReduceSum(c)``, computed in the body before the write."""
        g = self.g
        name = "append_read" if with_read else "append"
        if g.model.function("local", name) is None:
            fb = g.function("local", name, ["c", "v", "p"])
            c, v, p = fb.graph.inputs
            c.access = READ_WRITE
            c.type, v.type, p.type = cache.type, None, None
            total = fb.op.ReduceSum(c, keepdims=0) if with_read else None
            upd = fb.op.CacheUpdate(c, v, p)
            upd.alias_of = c
            fb.graph.outputs.append(upd)
            if total is not None:
                fb.graph.outputs.append(total)
        call = g.make_node(name, [cache, values, pos], 2 if with_read else 1, domain="local",
                           output_alias=[Alias(0, 0)])
        new = call.outputs[0]
        new.type = cache.type
        if with_read:
            total = call.outputs[1]
            total.type = tensor_type(FLOAT, [])
            self._add(total, ())
        return new

    def _if(self, s: Step, w: int, cache: Value, values: Value, pos: Value) -> Value:
        """``If`` whose branches both write ``cache`` (then: values, else: -values)."""
        g = self.g
        if s.op == "if_input":
            cond = g.input(f"cond{w}", BOOL, [])
        elif s.k % 2:
            cond = g.constant(np.array(s.cond), name=f"cond{w}")
        else:
            cond = g.initializer(f"cond{w}", np.array(s.cond))
        then_b, else_b = g.subgraph("then"), g.subgraph("else")
        then_b.output(then_b.op.CacheUpdate(cache, values, pos), self._fresh("then_cache"))
        else_b.output(else_b.op.CacheUpdate(cache, else_b.op.Neg(values), pos),
                      self._fresh("else_cache"))
        new = g.op.If(cond, then_branch=then_b, else_branch=else_b)
        new.type = cache.type
        new.alias_of = cache
        return new


OTHER_STEPS = st.one_of(
    st.builds(Step, kind=st.just("snap"), cache=st.integers(0, 1), op=st.sampled_from(SNAPSHOTS),
              k=st.integers(0, 7)),
    st.builds(Step, kind=st.just("read"), cache=st.integers(0, 1), op=st.sampled_from(READS),
              k=st.integers(0, 7)),
    st.builds(Step, kind=st.just("readpool"), op=st.sampled_from(READS), k=st.integers(0, 7),
              j=st.integers(0, 15)),
    st.builds(Step, kind=st.just("combine"), k=st.integers(0, 7), j=st.integers(0, 15)),
)
WRITE_STEPS = st.builds(Step, kind=st.just("write"), cache=st.integers(0, 1),
                   op=st.sampled_from(WRITES), k=st.integers(0, 7), n=st.integers(1, 2),
                   position=st.integers(0, 15), position_kind=st.sampled_from(POSITIONS),
                   cond=st.booleans(), mix_values=st.booleans())

LATE_STEPS = st.builds(Step, kind=st.just("late"), cache=st.integers(0, 1),
                  op=st.sampled_from(("ReduceSum", "Relu", "Identity")), k=st.integers(0, 7),
                  j=st.integers(0, 3))


@st.composite
def programs(draw: Callable, late_reads: bool = False) -> Program:
    """Random L13-valid stateful programs (see the module docstring); with ``late_reads``
    some reads of old versions come after their writer in node order."""
    n_caches = draw(st.integers(1, 2))
    steps: list[Step] = []
    for c in range(n_caches):  # every cache is written at least once
        steps.append(draw(WRITE_STEPS.map(lambda s, c=c: replace(s, cache=c))))
    for _ in range(draw(st.integers(0, 3))):
        steps.append(draw(WRITE_STEPS))
    for _ in range(draw(st.integers(1, 10))):
        steps.insert(draw(st.integers(0, len(steps))), draw(OTHER_STEPS))
    if late_reads:
        for _ in range(draw(st.integers(1, 3))):
            steps.insert(draw(st.integers(1, len(steps))), draw(LATE_STEPS))
    return Program(
        n_caches=n_caches,
        capacity=draw(st.sampled_from([4, 6])),
        steps=tuple(steps),
        bound=tuple(draw(st.lists(st.booleans(), min_size=n_caches, max_size=n_caches))),
        outputs=tuple(draw(st.lists(st.integers(0, 31), min_size=1, max_size=3))),
    )


# -- transformations under test ---------------------------------------------------------------

CONFIGS = ["pipeline-debug", "pipeline"] + list(dict.fromkeys(DEFAULT_PIPELINE))


def transform(model: Model, config: str) -> Model:
    if config == "pipeline-debug":
        return optimize(model, debug=True)
    if config == "pipeline":
        return optimize(model, debug=False)
    get_pass(config)(model)
    return model


def assert_same(want: dict[str, np.ndarray], got: dict[str, np.ndarray], what: str) -> None:
    assert list(got) == list(want), f"{what}: output names {list(got)} != {list(want)}"
    for name, w in want.items():
        g = got[name]
        assert g.dtype == w.dtype and g.shape == w.shape, (
            f"{what}: output {name!r} is {g.dtype}{list(g.shape)}, expected {w.dtype}{list(w.shape)}")
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6, err_msg=f"{what}: output {name!r}")


PROPERTY = settings(max_examples=8, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


# -- the generator itself -------------------------------------------------------------------


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs(), st.integers(0, 2**32 - 1))
def test_generated_programs_are_valid_and_run_in_place(program: Program, seed: int):
    model = program.build()
    of.verify(model)
    feeds = program.feeds(seed)
    want = functional_run(model, feeds)
    got, buffers = inplace_run(model, feeds)
    assert_same(want, got, "in-place run of the generated program")
    for c, bound in enumerate(program.bound):
        if bound:
            np.testing.assert_array_equal(buffers[f"cache{c}"], want[f"cache{c}_out"])


# -- properties -------------------------------------------------------------------------------


@pytest.mark.parametrize("config", CONFIGS)
@PROPERTY
@given(program=programs(), seed=st.integers(0, 2**32 - 1))
def test_result_verifies_and_keeps_the_meaning(config: str, program: Program, seed: int):
    model = program.build()
    note(f"before:\n{graph_text(model)}")
    feeds = program.feeds(seed)
    want = functional_run(model, feeds)
    transform(model, config)
    note(f"after {config}:\n{graph_text(model)}")
    of.verify(model)
    assert_same(want, functional_run(model, feeds), f"functional run after {config}")


@pytest.mark.parametrize("config", CONFIGS)
@PROPERTY
@given(program=programs(), seed=st.integers(0, 2**32 - 1))
def test_result_runs_in_place_as_it_means(config: str, program: Program, seed: int):
    model = program.build()
    note(f"before:\n{graph_text(model)}")
    feeds = program.feeds(seed)
    _, buffers_before = inplace_run(model, feeds)
    transform(model, config)
    note(f"after {config}:\n{graph_text(model)}")
    got, buffers = inplace_run(model, feeds)
    assert_same(functional_run(model, feeds), got, f"in-place run after {config}")
    assert_same(buffers_before, buffers, f"final cache buffers after {config}")


@pytest.mark.parametrize("config", ["topological_sort", "pipeline-debug", "pipeline"])
@PROPERTY
@given(program=programs(late_reads=True), seed=st.integers(0, 2**32 - 1))
def test_scheduling_puts_every_reader_before_its_writer(config: str, program: Program, seed: int):
    model = program.build()
    note(f"before:\n{graph_text(model)}")
    of.verify(model)  # late readers are schedulable: the program is valid
    feeds = program.feeds(seed)
    want = functional_run(model, feeds)
    transform(model, config)
    note(f"after {config}:\n{graph_text(model)}")
    got, _ = inplace_run(model, feeds)
    assert_same(want, got, f"in-place run after {config}")


# -- the counterexamples of rule L13 ----------------------------------------------------------

CAPACITY_SHAPE = [1, 2, 8, 4]


def _snapshot(g: GraphBuilder, form: str, cache: Value) -> Value:
    """A value holding the contents of ``cache`` that a rewrite may forward to ``cache``."""
    if form == "Identity":
        return g.op.Identity(cache)
    if form == "Mul1":
        return g.op.Mul(cache, g.initializer("one", np.array(1.0, np.float32)))
    if form == "Add0":
        return g.op.Add(cache, g.initializer("zero", np.array(0.0, np.float32)))
    if form == "Concat1":
        return g.op.Concat(cache, axis=2)
    if form == "ReshapeSame":
        return g.op.Reshape(cache, g.initializer("dims", np.array(CAPACITY_SHAPE, np.int64)))
    return g.op.Cast(cache, to=FLOAT)


def snapshot_then_write(form: str) -> Model:
    """``y = form(cache); u = CacheUpdate(cache, v, p); z = Add(y, ReduceSum(u))``; outputs
    ``z`` and ``u`` (bound to ``cache``)."""
    g = GraphBuilder(opset=21)
    cache = g.input("cache", FLOAT, CAPACITY_SHAPE, access=READ_WRITE)
    v = g.input("v", FLOAT, [1, 2, 1, 4])
    p = g.input("p", INT64, [])
    y = _snapshot(g, form, cache)
    u = g.op.CacheUpdate(cache, v, p)
    g.output(g.op.Add(y, g.op.ReduceSum(u, keepdims=0)), "z")
    g.output(u, "cache_out")
    g.bind("cache", "cache_out")
    return g.to_model()


def _feeds(model: Model) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    out: dict[str, np.ndarray] = {}
    for v in model.graph.inputs:
        if v.type.elem_type == INT64:
            out[v.name] = np.array(3, np.int64)
        else:
            out[v.name] = rng.standard_normal([int(d) for d in v.type.shape]).astype(np.float32)
    return out


@pytest.mark.parametrize("debug", [True, False])
@pytest.mark.parametrize("form", ["Identity", "Mul1", "Add0", "Concat1", "ReshapeSame", "Cast"])
def test_a_snapshot_read_after_the_write_is_not_forwarded_onto_the_cache(form: str, debug: bool):
    model = snapshot_then_write(form)
    of.verify(model)
    feeds = _feeds(model)
    want = functional_run(model, feeds)
    assert not np.array_equal(want["cache_out"], feeds["cache"])  # the write is observable
    got, _ = inplace_run(model, feeds)
    assert_same(want, got, "in-place run of the original")
    of.optimize(model, debug=debug)
    text = graph_text(model)
    of.verify(model)
    assert_same(want, functional_run(model, feeds), f"functional run after optimize:\n{text}")
    got, buffers = inplace_run(model, feeds)
    assert_same(want, got, f"in-place run after optimize:\n{text}")
    np.testing.assert_array_equal(buffers["cache"], want["cache_out"])


def _cache_write(g: GraphBuilder) -> tuple[Value, Value]:
    cache = g.input("cache", FLOAT, CAPACITY_SHAPE, access=READ_WRITE)
    v = g.input("v", FLOAT, [1, 2, 1, 4])
    p = g.input("p", INT64, [])
    return cache, g.op.CacheUpdate(cache, v, p)


def test_l13_a_reader_of_the_cache_that_depends_on_the_write_is_rejected():
    g = GraphBuilder(opset=21)
    cache, u = _cache_write(g)
    g.output(g.op.Add(cache, g.op.ReduceSum(u, keepdims=0)), "z")  # reads cache after the write
    g.output(u, "cache_out")
    g.bind("cache", "cache_out")
    with pytest.raises(of.VerificationError) as err:
        of.verify(g.to_model())
    assert "L13" in err.value.rules


def test_l13_the_written_cache_as_a_graph_output_is_rejected():
    g = GraphBuilder(opset=21)
    cache, u = _cache_write(g)
    g.output(cache)  # the old version after the write: in place it holds the new contents
    g.output(u, "cache_out")
    with pytest.raises(of.VerificationError) as err:
        of.verify(g.to_model())
    assert "L13" in err.value.rules
