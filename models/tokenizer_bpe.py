"""A model's byte-level BPE tokenizer, built with `tokenizers` from the GGUF's own tokens and
merges (no tokenizer.json travels with the file), its chat template and its stop tokens.

Pre-tokenization follows llama.cpp's pre-tokenizer type named by ``tokenizer.ggml.pre``
(:data:`PRE_TOKENIZERS`): ``smollm`` splits every digit on its own, then GPT-2's byte-level
split; ``gpt2`` is GPT-2's split alone; ``qwen2`` and ``llama-bpe`` (Llama 3) use their own
regexes (single digits, and runs of up to three, respectively), then the byte-level mapping.
Any other type is refused by name rather than tokenized wrongly. Control and user-defined
tokens (``<|im_start|>``, ``<|im_end|>``, ...) are found whole in the text, as llama.cpp does
when it tokenizes with ``parse_special``. tests/test_tokenizer_bpe.py checks SmolLM2's ids
against llama.cpp's on varied texts (bench/llama_reference.py wrote them).

The chat template is text from the model file, so it is rendered in Jinja's immutable sandbox:
a template that reaches for anything outside it (attributes of Python objects, mutation) fails
with :class:`ChatError`, as does any other template error.
"""

from __future__ import annotations

from collections.abc import Sequence

from models.gguf_file import Vocabulary

CONTROL, USER_DEFINED = 3, 4  # llama.cpp's LLAMA_TOKEN_TYPE_CONTROL / _USER_DEFINED

_LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+"
           r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+"
          r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
PRE_TOKENIZERS = ("smollm", "gpt2", "qwen2", "llama-bpe")
"""llama.cpp's pre-tokenizer types this tokenizer reproduces."""
STOP_TEXTS = ("<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|end|>", "<end_of_turn>",
              "<|endoftext|>")
"""Control tokens that end a turn wherever a vocabulary has them (llama.cpp's end-of-generation
set), besides the file's own eos, eot and eom ids."""


class ChatError(ValueError):
    """A chat request that cannot be rendered (bad roles, missing content, a template that
    fails or leaves its sandbox)."""


class TokenizerError(ValueError):
    """A vocabulary this tokenizer cannot reproduce (the message names what it supports)."""


def _pre_tokenizer(pre: str):
    from tokenizers import Regex, pre_tokenizers

    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre == "smollm":
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                        byte_level])
    if pre == "gpt2":
        return byte_level
    if pre in ("qwen2", "llama-bpe"):
        regex = Regex(_QWEN2 if pre == "qwen2" else _LLAMA3)
        return pre_tokenizers.Sequence([
            pre_tokenizers.Split(regex, behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    raise AssertionError(pre)  # check_vocabulary refused it


def check_vocabulary(vocab: Vocabulary) -> None:
    """TokenizerError unless this tokenizer reproduces ``vocab``'s model and pre-tokenizer."""
    if vocab.model != "gpt2":
        raise TokenizerError(f"tokenizer model {vocab.model!r} is not supported (only "
                             "byte-level BPE, 'gpt2')")
    if vocab.pre not in PRE_TOKENIZERS:
        raise TokenizerError(f"pre-tokenizer {vocab.pre!r} is not one this tokenizer "
                             f"reproduces; supported: {', '.join(PRE_TOKENIZERS)}")


class BPETokenizer:
    def __init__(self, vocab: Vocabulary):
        from tokenizers import AddedToken, Tokenizer, decoders, models

        check_vocabulary(vocab)
        pre = _pre_tokenizer(vocab.pre)
        ids = {tok: i for i, tok in enumerate(vocab.tokens)}
        merges = [tuple(m.split(" ", 1)) for m in vocab.merges]
        tok = Tokenizer(models.BPE(vocab=ids, merges=merges, fuse_unk=False))
        tok.pre_tokenizer = pre
        tok.decoder = decoders.ByteLevel()
        types = vocab.token_types
        self.special = [t for t, k in zip(vocab.tokens, types, strict=True) if k == CONTROL]
        tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                                for t in self.special])
        tok.add_tokens([AddedToken(t, special=False, normalized=False)
                        for t, k in zip(vocab.tokens, types, strict=True) if k == USER_DEFINED])
        self._tok = tok
        self.max_token_bytes = max(len(t) for t in vocab.tokens)
        """Most bytes one token stands for (byte-level tokens: a character a byte): a text
        of ``b`` bytes is at least ``b / max_token_bytes`` tokens, known before tokenising."""
        self.vocab_size = len(vocab.tokens)
        self.bos_id = vocab.bos_id
        self.eos_id = vocab.eos_id
        self.add_bos = vocab.add_bos and 0 <= vocab.bos_id < self.vocab_size
        self.chat_template = vocab.chat_template
        self._template = None
        named = {ids[t] for t in STOP_TEXTS if t in ids and types[ids[t]] == CONTROL}
        self.stop_ids = frozenset({vocab.eos_id} | named |
                                  {i for i in (vocab.eot_id, vocab.eom_id) if i is not None})
        """Token ids that end generation (the file's eos, eot, eom and named turn ends)."""

    def _token(self, i: int) -> str:
        if not 0 <= i < self.vocab_size:
            return ""
        return self._tok.id_to_token(i) or ""

    def encode(self, text: str) -> list[int]:
        # encode_batch lets other threads run meanwhile (encode holds the GIL throughout:
        # a 1 MiB text held a server's event loop for seconds)
        ids = self._tok.encode_batch([text], add_special_tokens=False)[0].ids
        if self.add_bos and (not ids or ids[0] != self.bos_id):
            ids = [self.bos_id, *ids]
        return ids

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
        import jinja2

        try:
            if self._template is None:
                self._template = _environment().from_string(self.chat_template)
            return self._template.render(
                messages=[dict(m) for m in messages], add_generation_prompt=add_generation_prompt,
                bos_token=self._token(self.bos_id), eos_token=self._token(self.eos_id))
        except ChatError:
            raise
        except jinja2.TemplateError as exc:  # SecurityError included: it left the sandbox
            raise ChatError(f"the model's chat template failed: {type(exc).__name__}: "
                            f"{str(exc)[:200]}") from None
        except (TypeError, ValueError, AttributeError, KeyError, IndexError) as exc:
            raise ChatError(f"the model's chat template failed: {type(exc).__name__}: "
                            f"{str(exc)[:200]}") from None


def _environment():
    """Jinja's immutable sandbox with what Hugging Face's chat templates call (``tojson``
    is Jinja's own; ``raise_exception`` and ``strftime_now`` are given here)."""
    import datetime

    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: object) -> None:
        raise ChatError(f"the model's chat template refused the chat: {str(message)[:200]}")

    def strftime_now(fmt: str) -> str:
        return datetime.datetime.now().strftime(str(fmt)[:64])

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals.update(raise_exception=raise_exception, strftime_now=strftime_now)
    return env
