"""Shape and type inference: the ``ShapesContext`` that holds the refined type of every
value (:mod:`.context`), the merging of two types (:mod:`.type_merge`), speculative
inference (:mod:`.speculation`), recording and replaying per-node results
(:mod:`.replay`), the per-operator rules (:mod:`.infer`) and the symbolic dimension
algebra they compute with (:mod:`.symbolic`, over :mod:`.symexpr`, :mod:`.symterms`
and :mod:`.symparse`; small known tensors in :mod:`.symtensor`). Import each name
from its module.
"""
