"""The in-memory IR, protobuf-free: Model, Graph, Function, Node, Value and Attr with
def-use kept by their mutators (:mod:`.core`), the tensor payloads they hold, read
lazily (:mod:`.tensors`), unique names (:mod:`.names`), the dependency order of a
body and the values it reads from outside (:mod:`.scope_order`), the verification
view built without serializing (:mod:`.view`) and the storage facts read from the
one alias resolution (:mod:`.storage`). Import each name from its module.
"""
