"""Each silero VAD variant of the corpus made stateful with its own bound pairs: its LSTM state
stays in ``of.make_state`` across 32 ms chunks of a clip the test makes, with no byte copied,
and every chunk's speech probability equals onnxruntime's loop that feeds the state back."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

import onnxforge as of

# variant -> (bound pairs, samples per chunk (512 at 16 kHz; 576 with the 64-sample context), sr input)
VARIANTS = {
    "silero_vad": ({"state": "stateN"}, 512, True),
    "silero_vad_16k_op15": ({"state": "stateN"}, 512, True),
    "silero_vad_16k_sequence": ({"h": "hn", "c": "cn"}, 576, False),
    "silero_vad_half": ({"state": "stateN"}, 512, False),
    "silero_vad_op18_ifless": ({"state": "stateN"}, 512, True),
    "silero_vad_openvino_16k": ({"state": "stateN"}, 576, False),
}


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_the_lstm_state_lives_in_the_state_across_chunks_and_matches_onnxruntimes_loop(wild_models, name):
    bind, width, has_sr = VARIANTS[name]
    path = str(wild_models[name])
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    inputs = {i.name: i for i in sess.get_inputs()}
    dt = np.float16 if "float16" in inputs["input"].type else np.float32
    half = name == "silero_vad_half"  # float16 inside: 1e-2, as the corpus comparison allows
    t = np.arange(16000) / 16000
    clip = (0.5 * np.sin(2 * np.pi * 220 * t) * (t > 0.3) + 0.05 * np.random.default_rng(0).standard_normal(16000))
    clip = clip.astype(dt)
    initial = {k: np.zeros([d if isinstance(d, int) else 1 for d in inputs[k].shape],
                           np.float16 if "float16" in inputs[k].type else np.float32) for k in bind}
    state = of.make_state(of.make_stateful(path, 1, bindings=bind, batch=1),
                          initial={k: v.copy() for k, v in initial.items()})
    addresses = state.addresses()
    fed = dict(initial)
    outs = [o.name for o in sess.get_outputs()]
    chunks = 0
    for k in range(0, len(clip) - width, width):
        feeds = {"input": clip[k:k + width][None]}
        if has_sr:
            feeds["sr"] = np.array(16000, np.int64)
        want = sess.run(None, {**feeds, **fed})
        fed = {inp: want[outs.index(out)] for inp, out in bind.items()}
        got = state.run(feeds)
        assert state.last_run.copied_bytes == 0
        np.testing.assert_allclose(np.asarray(got[outs[0]], np.float64), np.asarray(want[0], np.float64),
                                   rtol=0, atol=1e-2 if half else 1e-5)
        chunks += 1
    assert chunks >= 27
    for inp in bind:  # the state ends where onnxruntime's loop ends
        np.testing.assert_allclose(np.asarray(state.values[inp], np.float64), np.asarray(fed[inp], np.float64),
                                   rtol=0, atol=1e-2 if half else 1e-5)
    assert set(state.addresses()) == set(addresses)
