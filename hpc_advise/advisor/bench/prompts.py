"""Prompts of a given token length, with the trace's shared prefixes.

With the served model's tokenizer (``transformers`` or ``tokenizers``, local files only) a prompt is a
list of token ids sent as the completions ``prompt``: exactly ``input_len`` tokens. Without one it is
text made of words that most BPE vocabularies keep as one token each (`` the``, `` of``, ...), so the
length is approximate; the server's ``usage.prompt_tokens`` then says what was sent, and the run says
``prompt_lengths: approximate``.

Prefix sharing: block ``b`` of a request's ``hash_ids`` is the same ``block_size`` tokens in every
request that carries hash id ``b`` (drawn from a generator seeded by the hash id and the run seed), so
the server's prefix cache sees the reuse the trace recorded; tokens past the listed blocks are unique
to the request. Prompts are built when sent and not kept.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path

import numpy as np

# Common English words that BPE vocabularies (GPT-2, Llama, Qwen, Mistral) keep as one token with
# the leading space.
WORDS = (
    "the of and to in is that for it as was with be by on not he this are or his from at which but "
    "have an they you were her she there been one all we their has would when if so no out more up "
    "said what its about into than them can only other new some could time these two may then do "
    "first any my now such like our over man me even most made after also did many before must "
    "through back years where much your way well down should because each just those people how too "
    "little state good very make world still own see men work long get here between both life being "
    "under never day same another know while last might us great old year off come since against go "
    "came right used take three"
).split()


def _in_hf_cache(name: str) -> bool:
    """Whether hub id ``name`` has a snapshot in the local Hugging Face cache (nothing is downloaded)."""
    if name.count("/") != 1:
        return False
    hub = os.environ.get("HF_HUB_CACHE") or os.path.join(
        os.environ.get("HF_HOME") or os.path.expanduser("~/.cache/huggingface"), "hub"
    )
    return os.path.isdir(os.path.join(hub, "models--" + name.replace("/", "--"), "snapshots"))


class TokenizerUnavailable(RuntimeError):
    """No tokenizer could be loaded from local files; the message says what was tried."""


def load_tokenizer(name: str):
    """The token ids of tokenizer ``name`` usable in prompts, and a description of where they came from.

    Ordinary tokens only: special and added tokens are left out so a prompt never holds an
    end-of-sequence or chat-template marker.
    """
    errors = []
    file = Path(name) / "tokenizer.json" if Path(name).is_dir() else Path(name)
    if file.is_file():
        try:
            from tokenizers import Tokenizer

            tok = Tokenizer.from_file(str(file))
            special = set(tok.get_added_tokens_decoder())
            ids = np.array([i for i in range(tok.get_vocab_size()) if i not in special], dtype=np.int64)
            return ids, f"tokenizers:{file}"
        except ImportError:
            errors.append("tokenizers not installed")
        except Exception as exc:
            errors.append(f"tokenizers: {type(exc).__name__}: {exc}")
    if Path(name).is_dir() or _in_hf_cache(name):
        # transformers only for what it can load offline (its import alone takes seconds)
        try:
            from transformers import AutoTokenizer

            tok = AutoTokenizer.from_pretrained(name, local_files_only=True)
            special = set(tok.all_special_ids) | set(getattr(tok, "added_tokens_decoder", {}) or {})
            ids = np.array([i for i in range(len(tok)) if i not in special], dtype=np.int64)
            return ids, f"transformers:{name}"
        except ImportError:
            errors.append("transformers not installed")
        except Exception as exc:
            errors.append(
                f"transformers: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            )
    else:
        errors.append("not a local path and not in the Hugging Face cache")
    raise TokenizerUnavailable(f"no tokenizer for {name!r} in local files ({'; '.join(errors)})")


class PromptBuilder:
    """Builds request prompts; ``exact`` says whether lengths are exact token counts."""

    def __init__(self, vocab_ids: np.ndarray | None = None, seed: int = 0, description: str = "") -> None:
        self.vocab = vocab_ids
        self.exact = vocab_ids is not None
        self.seed = int(seed)
        self.description = description or ("approximate: one common English word per token")
        self._words = np.array(WORDS)

    def _tokens(self, key: int, n: int) -> np.ndarray:
        """``n`` indices drawn by a generator seeded with (seed, key)."""
        rng = np.random.default_rng([self.seed, key & 0xFFFFFFFFFFFF, n])
        high = len(self.vocab) if self.exact else len(self._words)
        return rng.integers(0, high, n)

    @lru_cache(maxsize=4096)  # noqa: B019 -- blocks are reused across requests; bounded cache
    def _block(self, hash_id: int, size: int) -> np.ndarray:
        return self._tokens((hash_id << 1) | 1, size)

    def indices(
        self, index: int, input_len: int, hash_ids: Sequence[int] | None, block_size: int | None
    ) -> np.ndarray:
        parts, have = [], 0
        if hash_ids is not None and block_size:
            for h in hash_ids:
                if have >= input_len:
                    break
                take = min(block_size, input_len - have)
                parts.append(self._block(int(h), int(block_size))[:take])
                have += take
        if have < input_len:
            parts.append(self._tokens(index << 1, input_len - have))
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)

    def prompt(self, index: int, input_len: int, hash_ids=None, block_size=None) -> list[int] | str:
        """Token ids (exact) or text (approximate) of ``input_len`` tokens for request ``index``."""
        idx = self.indices(index, max(1, input_len), hash_ids, block_size)
        if self.exact:
            return self.vocab[idx].tolist()
        return " " + " ".join(self._words[idx].tolist())
