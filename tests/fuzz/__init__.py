"""Differential fuzzing of the CPU backend against onnx.reference, onnxruntime and
float64 numpy, one random one-node model per case (``python -m tests.fuzz --cases N``).

Generators are tables per operator family (``gen_*.py``); ``runner.py`` judges one case;
``harness.py`` runs batches in worker processes so that crashes are counted;
``known.py`` holds the closed lists of out-of-spec inputs and oracle disagreements."""
