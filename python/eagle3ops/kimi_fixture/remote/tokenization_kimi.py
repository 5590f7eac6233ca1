"""Remote-code tokenizer of the eagle3ops Kimi-K2.5-format fixture (written into the model folder; loaded by
``AutoTokenizer.from_pretrained(folder, trust_remote_code=True)`` through tokenizer_config.json's ``auto_map``).

Byte-level BPE run by the ``tiktoken`` package over the folder's ``tiktoken.model``, with Kimi's
pre-tokenisation (a contraction suffix stays with its word), then 256 reserved special ids after the BPE
ranks, named from ``added_tokens_decoder`` (``<|reserved_token_{id}|>`` otherwise). Special tokens in the text
are split out by transformers before BPE runs. Only ``tiktoken`` and ``transformers`` are imported.
"""

from __future__ import annotations

import os
import shutil
from typing import Any, ClassVar

import tiktoken
from tiktoken.load import load_tiktoken_bpe
from transformers import PreTrainedTokenizer
from transformers.convert_slow_tokenizer import bytes_to_unicode

VOCAB_FILES_NAMES = {"vocab_file": "tiktoken.model"}
NUM_RESERVED_SPECIAL_TOKENS = 256

_LETTERS_NOT_HAN = r"\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]"
_LOWER_NOT_HAN = r"\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]"
_CONTRACTION = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
PATTERN = "|".join(
    [
        r"[\p{Han}]+",
        rf"[^\r\n\p{{L}}\p{{N}}]?[{_LETTERS_NOT_HAN}]*[{_LOWER_NOT_HAN}]+{_CONTRACTION}",
        rf"[^\r\n\p{{L}}\p{{N}}]?[{_LETTERS_NOT_HAN}]+[{_LOWER_NOT_HAN}]*{_CONTRACTION}",
        r"\p{N}{1,3}",
        r" ?[^\s\p{L}\p{N}]+[\r\n]*",
        r"\s*[\r\n]+",
        r"\s+(?!\S)",
        r"\s+",
    ]
)


def _sorted_deep(obj: Any) -> Any:
    """Dicts with their keys sorted, at every depth (tool schemas render the same whatever their key order)."""
    if isinstance(obj, dict):
        return {k: _sorted_deep(obj[k]) for k in sorted(obj)}
    if isinstance(obj, list):
        return [_sorted_deep(x) for x in obj]
    return obj


class TikTokenTokenizer(PreTrainedTokenizer):
    vocab_files_names = VOCAB_FILES_NAMES
    model_input_names: ClassVar[list[str]] = ["input_ids", "attention_mask"]

    def __init__(
        self,
        vocab_file: str,
        bos_token: str = "[BOS]",
        eos_token: str = "[EOS]",
        unk_token: str = "[UNK]",
        pad_token: str = "[PAD]",
        added_tokens_decoder: dict | None = None,
        **kwargs,
    ):
        if not os.path.isfile(vocab_file):
            raise FileNotFoundError(f"{vocab_file}: the tiktoken BPE file is missing")
        self.vocab_file = vocab_file
        ranks = load_tiktoken_bpe(vocab_file)
        first_special = len(ranks)
        named = {int(i): getattr(t, "content", str(t)) for i, t in (added_tokens_decoder or {}).items()}
        self.special_ids = {
            named.get(i, f"<|reserved_token_{i}|>"): i
            for i in range(first_special, first_special + NUM_RESERVED_SPECIAL_TOKENS)
        }
        self.model = tiktoken.Encoding(
            name=os.path.basename(vocab_file),
            pat_str=PATTERN,
            mergeable_ranks=ranks,
            special_tokens=self.special_ids,
        )
        to_char = bytes_to_unicode()
        self._from_char = {c: b for b, c in to_char.items()}
        self._id_to_piece = {i: "".join(to_char[b] for b in piece) for piece, i in ranks.items()}
        self._id_to_piece.update({i: s for s, i in self.special_ids.items()})
        self._piece_to_id = {p: i for i, p in self._id_to_piece.items()}
        super().__init__(
            bos_token=bos_token,
            eos_token=eos_token,
            unk_token=unk_token,
            pad_token=pad_token,
            added_tokens_decoder=added_tokens_decoder or {},
            **kwargs,
        )

    @property
    def vocab_size(self) -> int:
        return self.model.n_vocab

    def get_vocab(self) -> dict[str, int]:
        return dict(self._piece_to_id)

    def _tokenize(self, text: str, **kwargs) -> list[str]:
        # special tokens were split out before this is called: their text here is plain text
        return [self._id_to_piece[i] for i in self.model.encode(text, disallowed_special=())]

    def _convert_token_to_id(self, token: str) -> int:
        return self._piece_to_id.get(token, self.special_ids[str(self.unk_token)])

    def _convert_id_to_token(self, index: int) -> str:
        return self._id_to_piece[int(index)]

    def convert_tokens_to_string(self, tokens: list[str]) -> str:
        out, raw = [], bytearray()
        for tok in tokens:
            if tok in self.special_ids:
                out.append(raw.decode("utf-8", errors="replace") + tok)
                raw = bytearray()
            else:
                raw.extend(self._from_char[c] for c in tok)
        return "".join(out) + raw.decode("utf-8", errors="replace")

    def save_vocabulary(self, save_directory: str, filename_prefix: str | None = None) -> tuple[str]:
        name = (filename_prefix + "-" if filename_prefix else "") + VOCAB_FILES_NAMES["vocab_file"]
        target = os.path.join(save_directory, name)
        if os.path.abspath(target) != os.path.abspath(self.vocab_file):
            shutil.copyfile(self.vocab_file, target)
        return (target,)

    def apply_chat_template(self, conversation, tools=None, **kwargs):
        return super().apply_chat_template(conversation, tools=_sorted_deep(tools), **kwargs)
