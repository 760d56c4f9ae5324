"""Turning text into token counts for formats that carry text, not lengths (ShareGPT).

Default estimator: ``ceil(utf8_bytes / 4)``, the usual "about four characters per token" rule for
English BPE vocabularies; it is an estimate (code, CJK text and other languages tokenize
differently), which is why ``--tokenizer NAME`` exists: it loads a real tokenizer through
``transformers`` (``AutoTokenizer``, local files only: a model directory or a hub id already in the
Hugging Face cache -- nothing is downloaded), else ``tokenizers`` (a ``tokenizer.json`` file or a
directory holding one), else ``tiktoken`` (an encoding name such as ``cl100k_base``), whichever is
installed. None of them is a dependency of hpc-advise.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path

from hpc_advise.advisor.traces.source import TraceError


def estimate_tokens(text: str) -> int:
    """``ceil(len(text.encode('utf-8')) / 4)``."""
    return (len(text.encode("utf-8")) + 3) // 4


estimate_tokens.description = "estimate: ceil(utf8_bytes / 4)"  # type: ignore[attr-defined]


def _installed(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


def load_tokenizer(name: str) -> Callable[[str], int]:
    """A function counting the tokens of a text with the tokenizer ``name``; ``TraceError`` with the
    way out when no tokenizer library is installed or the name cannot be loaded."""
    errors: list[str] = []
    if _installed("transformers") and not Path(name).is_file():
        try:
            from transformers import AutoTokenizer

            # Local files only (a path, or a hub id already in the Hugging Face cache): no download.
            tok = AutoTokenizer.from_pretrained(name, local_files_only=True)
            count = lambda text: len(tok.encode(text, add_special_tokens=False))
            count.description = f"transformers:{name}"
            return count
        except Exception as exc:
            errors.append(
                f"transformers: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            )
    file = Path(name) / "tokenizer.json" if Path(name).is_dir() else Path(name)
    if _installed("tokenizers") and file.is_file():
        try:
            from tokenizers import Tokenizer

            tok = Tokenizer.from_file(str(file))
            count = lambda text: len(tok.encode(text, add_special_tokens=False).ids)
            count.description = f"tokenizers:{file}"
            return count
        except Exception as exc:
            errors.append(f"tokenizers: {exc}")
    if _installed("tiktoken"):
        try:
            import tiktoken

            enc = tiktoken.get_encoding(name)
            count = lambda text: len(enc.encode(text, disallowed_special=()))
            count.description = f"tiktoken:{name}"
            return count
        except Exception as exc:
            errors.append(f"tiktoken: {exc}")
    if not any(_installed(m) for m in ("transformers", "tokenizers", "tiktoken")):
        raise TraceError(
            f"--tokenizer {name}: none of transformers, tokenizers, tiktoken is installed "
            "(pip install transformers), or leave --tokenizer out to use the bytes/4 estimate"
        )
    raise TraceError(
        f"--tokenizer {name}: cannot load it from local files ({'; '.join(errors) or 'not a tokenizer.json'}); "
        f"download it first (huggingface-cli download {name}) or give a local path"
    )
