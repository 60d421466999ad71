"""A pass and a rewrite rule, written against onnxforge's pass API.

This file is the example of the guide "Writing a pass and a rewrite rule"
(docs/passes.rst includes it); tests/test_docs.py runs it, so it stays correct.
Run it by hand with ``python docs/examples/write_a_pass.py``.
"""
from __future__ import annotations

import numpy as np
from onnx import TensorProto
from onnx.reference import ReferenceEvaluator

from onnxforge import GraphBuilder
from onnxforge.graphbuilder.ir.core import Model, Node
from onnxforge.graphbuilder.serde import to_onnx
from onnxforge.passes import (
    ALL,
    DEFAULT_RULES,
    Pass,
    PassManager,
    PassResult,
    Pattern,
    RewritePass,
    Rule,
    RuleTable,
    register_pass,
    replace_value,
)
from onnxforge.passes.framework.domains import is_default_domain
from onnxforge.passes.framework.invariants import containers, is_nondeterministic
from onnxforge.passes.rewrites.rename import erase_node

# -- a rewrite rule: a pattern and the function that builds its replacement ------------

# Abs(Neg(x)) -> Abs(x)   (|-x| and |x| are equal bit for bit, NaN and -0.0 included)
abs_of_neg = Rule(Pattern("Abs", Pattern("Neg", "x")),
                  lambda m: m.op.Abs(m["x"]),
                  "abs_of_neg")

# the default algebraic rules plus ours; the rewrite pass drives them to a fixed point
RULES = DEFAULT_RULES + RuleTable([abs_of_neg])


# -- a pass: a registered class whose call() rewrites the model in place -------------------

def _inference_dropout(node: Node) -> bool:
    """A Dropout that is the identity: inference mode and its mask output unused."""
    if node.op_type != "Dropout" or not is_default_domain(node.domain):
        return False
    if not node.inputs or node.inputs[0] is None or is_nondeterministic(node):
        return False
    mask = node.outputs[1:]
    return all(v.num_uses() == 0 and not v.is_graph_output() for v in mask)


@register_pass
class DropoutEliminationPass(Pass):
    """Remove Dropout nodes that are the identity (inference mode, mask unused).

    Before / after::

        d = Dropout(x)              y = Abs(x)
        y = Abs(d)

    ``replace_value`` refuses a merge that would lose something (a graph output
    that cannot take the input's place) or break rule L13; the node then stays.
    """

    name = "example_dropout_elimination"
    # what a change breaks, and what stays valid: removing nodes changes every analysis
    invalidates = ALL
    preserves = ()
    declares_storage = False  # it never adds an alias, a READ_WRITE input or a binding
    runs_after = ("inline",)  # inlined function bodies may hold Dropout nodes too

    def call(self, model: Model) -> PassResult:
        removed = 0
        for body in list(containers(model)):  # the main graph, subgraphs, function bodies
            for node in list(body):
                if not _inference_dropout(node):
                    continue
                if replace_value(node.outputs[0], node.inputs[0]):
                    erase_node(node)
                    removed += 1
        return PassResult(model, modified=removed > 0)


# -- using them ------------------------------------------------------------------------

def build() -> Model:
    """``y = Abs(Neg(Dropout(x)))``: both the pass and the rule have work to do."""
    g = GraphBuilder(opset=21)
    x = g.input("x", TensorProto.FLOAT, [2, 3])
    d = g.op.Dropout(x)
    g.output(g.op.Abs(g.op.Neg(d)), "y")
    return g.to_model()


def main() -> Model:
    model = build()
    before = to_onnx(model)  # a snapshot, to compare the outputs with afterwards

    # names of registered passes and Pass instances mix freely; debug=True checks the
    # model's invariants (static rules, SSA, def-use, order) after every pass
    pm = PassManager(["topological_sort", "example_dropout_elimination", RewritePass(RULES), "dce"],
                     debug=True)
    result = pm(model)
    print(pm.report())

    assert result.modified
    assert [n.op_type for n in model.graph] == ["Abs"]
    assert [v.name for v in model.graph.outputs] == ["y"]  # the interface is unchanged

    # the rewritten model computes what the original did (onnx.reference as the oracle)
    x = np.array([[-1.5, 0.0, 2.0], [-0.0, np.inf, -3.25]], np.float32)
    (want,) = ReferenceEvaluator(before).run(None, {"x": x})
    (got,) = ReferenceEvaluator(to_onnx(model)).run(None, {"x": x})
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got, np.abs(x))
    return model


if __name__ == "__main__":
    main()
