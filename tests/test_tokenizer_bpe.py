"""The `tokenizers` BPE built from the GGUF equals llama.cpp's tokenization (the fixture that
bench/llama_reference.py wrote), and the chat template renders ChatML."""

from __future__ import annotations

import json

import pytest

from models import gguf_weights
from models.tokenizer_bpe import BPETokenizer, ChatError
from tests.conftest import ROOT

REFERENCE = json.loads((ROOT / "bench" / "llama_reference.json").read_text())


@pytest.fixture(scope="module")
def tok() -> BPETokenizer:
    return BPETokenizer(gguf_weights.load().vocab)


@pytest.mark.parametrize("case", REFERENCE["tokenizer"], ids=lambda c: repr(c["text"][:24]))
def test_ids_equal_llama_cpp(tok, case):
    assert tok.encode(case["text"]) == case["ids"]


def test_documents_equal_llama_cpp(tok):
    for doc in REFERENCE["documents"]:
        assert tok.encode(doc["text"]) == doc["ids"]


def test_decode_round_trips(tok):
    for case in REFERENCE["tokenizer"]:
        assert tok.decode(case["ids"]) == case["text"]


def test_control_tokens_are_whole(tok):
    ids = tok.encode("<|im_start|>user\nhi<|im_end|>")
    assert ids[0] == tok.token_id("<|im_start|>") == 1
    assert ids[-1] == tok.token_id("<|im_end|>") == tok.eos_id == 2
    assert tok.decode(ids, skip_special=True) == "user\nhi"


def test_chat_template_is_chatml_with_default_system(tok):
    text = tok.render_chat([{"role": "user", "content": "What is the capital of France?"}])
    assert text == ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by "
                    "Hugging Face<|im_end|>\n<|im_start|>user\nWhat is the capital of France?"
                    "<|im_end|>\n<|im_start|>assistant\n")
    own = tok.render_chat([{"role": "system", "content": "Be brief."},
                           {"role": "user", "content": "Hi"}], add_generation_prompt=False)
    assert own == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"


@pytest.mark.parametrize("messages, needle", [
    ([], "at least one message"),
    ([{"role": "user"}], "string 'content'"),
    ([{"role": "user", "content": 3}], "string 'content'"),
    ([{"role": "wizard", "content": "x"}], "not system, user or assistant"),
    (["hello"], "message 0"),
])
def test_bad_chat_is_refused(tok, messages, needle):
    with pytest.raises(ChatError, match=needle):
        tok.render_chat(messages)
