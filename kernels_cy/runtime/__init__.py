"""The runtime: the compiler from IR to plan (:mod:`.compile`), the compiled run loop
(``plan``), sessions (:mod:`.session`), states and state files (:mod:`.state`,
:mod:`.statefile`), the per-run context (:mod:`.runctx`), threads (:mod:`.threads`,
the worker pool ``_pool``) and decoder functions (:mod:`.decoder_fn`)."""
