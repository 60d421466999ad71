"""The tiny exported decoders with their tokenizer folders, for the text tests."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def genai_dir(decoder_models) -> Path:
    """The onnxruntime-genai fp32 export's folder (model, genai_config.json, tokenizer files)."""
    return Path(decoder_models["genai_fp32"]).parent


@pytest.fixture(scope="session")
def generator(genai_dir):
    from onnxforge.text import Generator

    with Generator(genai_dir, max_length=64) as g:
        yield g


@pytest.fixture(scope="session")
def hf_tokenizer(genai_dir):
    """The independent oracle: transformers' fast tokenizer loaded from the same folder."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(genai_dir))


def copy_folder(src: Path, dst: Path, *, without: tuple[str, ...] = ()) -> Path:
    dst.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.is_file() and f.name not in without:
            shutil.copy2(f, dst / f.name)
    return dst
