"""The command line's commands that run models, one module per job.

* :mod:`onnxforge.commands.run`: ``onnxforge run``, a model on the CPU backend;
* :mod:`onnxforge.commands.generate`: ``onnxforge generate``, greedy decoding
  through the persistent state;
* :mod:`onnxforge.commands.cache`: the cache layout options (``--cache``,
  ``--page-size``, ``--formats``) shared by ``stateful`` and ``generate``.

Each module gives its parser (``add_run_parser``, ``add_generate_parser``,
``add_cache_options``) and the function the parsed arguments go to;
:mod:`onnxforge.cli` assembles them with the other commands. Importing this
package loads none of them.
"""
from __future__ import annotations

__all__: list[str] = []
