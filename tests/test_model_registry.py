"""Any Llama-family GGUF by path: tiny files of each architecture and tensor type, written at
test time, run against the float64 reference forward (models.reference); every hyper-parameter,
the tokenizer, the chat template and the stop tokens come from the file; bad files are refused
with a clear error and nothing half-written."""

from __future__ import annotations

import os

import numpy as np
import pytest

from models import catalog, gguf_file, gguf_weights
from models.generate import GenerationError, generator
from models.llama import Llama
from models.reference import reference_logits
from models.tokenizer_bpe import ChatError
from tests.gguf_support import write_tiny

IDS = [5, 100, 200, 7, 258, 3, 9, 44, 101, 32]


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    """A fresh model cache per test: what a file's first open writes is part of what is tested."""
    path = tmp_path / "cache"
    monkeypatch.setenv(gguf_file.CACHE_ENV, str(path))
    return path


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("qtype", ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1",
                                   "Q4_K", "Q5_K", "Q6_K"])
def test_the_forward_matches_the_float64_reference(tmp_path, arch, qtype):
    """Every matrix kept in the file's block format and multiplied by models.quant's kernels
    (no float32 copy): within float32 rounding of the float64 reference, all at once and
    one token at a time."""
    size = {"d": 256, "ff": 512} if qtype.endswith("_K") else {}  # 256-weight blocks
    path = write_tiny(tmp_path / "m.gguf", arch, qtype, seed=len(arch) + len(qtype), **size)
    weights = gguf_weights.load(path)
    assert {m.qtype.name for m in weights.matrices.values()} == {qtype}
    model = Llama(weights)
    ref = reference_logits(path, IDS)
    got = model.forward(IDS, model.new_cache(), all_logits=True)
    assert np.abs(got - ref).max() <= 1e-5 * np.abs(ref).max()
    # one token at a time through the KV cache: the same logits
    cache = model.new_cache(4)
    steps = np.stack([model.forward([t], cache) for t in IDS])
    assert np.abs(steps - ref).max() <= 1e-5 * np.abs(ref).max()
    assert ref.argmax(1).tolist() == got.argmax(1).tolist()


def test_each_architectures_conventions_matter(tmp_path):
    """Read as the other architecture (RoPE pairs, biases), the same weights give other
    logits: the reference would catch a registry that ran qwen2 as llama."""
    path = write_tiny(tmp_path / "q.gguf", "qwen2", "F32")
    w = gguf_weights.load(path)
    as_llama = gguf_weights.LlamaWeights(
        w.address, gguf_weights.LlamaConfig(**{**w.config.__dict__, "rope_style": "norm"}),
        w.matrices, w.vectors, w.vocab)
    ref = reference_logits(path, IDS)
    wrong = Llama(as_llama).forward(IDS, Llama(as_llama).new_cache(), all_logits=True)
    assert np.abs(wrong - ref).max() > 1e-2 * np.abs(ref).max()


def test_every_hyper_parameter_comes_from_the_metadata(tmp_path):
    path = write_tiny(tmp_path / "m.gguf", "qwen2", "F16", layers=3, d=96, ff=160, heads=6,
                      kv_heads=3, context=48, name="Tiny Qwen")
    w = gguf_weights.load(path)
    c = w.config
    assert (c.n_layers, c.d_model, c.d_ff, c.n_heads, c.n_kv_heads, c.head_dim) == \
        (3, 96, 160, 6, 3, 16)
    assert (c.rope_base, c.context_length, c.vocab_size) == (1e6, 48, 264)
    assert c.norm_eps == pytest.approx(1e-6)  # stored as float32
    assert (c.rope_style, c.qkv_bias, c.tied_output) == ("neox", True, False)
    assert w.head == "output.weight" and w.name == "Tiny Qwen"
    assert w.matrices["blk.2.ffn_down.weight"].shape == (96, 160)
    assert w.bias(1, "attn_k").shape == (48,)
    tied = gguf_weights.load(write_tiny(tmp_path / "t.gguf", "llama", "F32", tied=True))
    assert tied.config.tied_output and tied.head == "token_embd.weight"
    assert not tied.config.qkv_bias and tied.config.rope_style == "norm"


def test_tokenizer_template_and_stops_come_from_the_file(tmp_path):
    gen = generator(write_tiny(tmp_path / "m.gguf", "qwen2", "F32"))
    tok = gen.tokenizer
    assert tok.render_chat([{"role": "user", "content": "hi"}]) == \
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    ids = gen.chat_prompt([{"role": "user", "content": "hi"}])
    assert ids[0] == tok.token_id("<|im_start|>") and tok.token_id("<|im_end|>") in ids
    assert gen.stop_ids == {tok.token_id("<|im_end|>"), tok.token_id("<|endoftext|>")}
    assert tok.decode(tok.encode("the cat 12")) == "the cat 12"
    assert tok.token_id("Ġthe") in tok.encode("a the")  # the file's merges


@pytest.mark.parametrize(("pre", "digits"), [("qwen2", ["1", "2", "3", "4"]),
                                             ("llama-bpe", ["123", "4"]),
                                             ("smollm", ["1", "2", "3", "4"]),
                                             ("gpt2", ["1234"])])
def test_pre_tokenizers_split_digits_as_llama_cpp(tmp_path, pre, digits):
    gen = generator(write_tiny(tmp_path / "m.gguf", "llama", "F32", pre=pre))
    split = gen.tokenizer._tok.pre_tokenizer.pre_tokenize_str("1234")
    assert [s for s, _ in split] == digits


def test_an_unknown_pre_tokenizer_is_refused_by_name(tmp_path):
    path = write_tiny(tmp_path / "m.gguf", "llama", "F32", pre="falcon")
    with pytest.raises(gguf_file.WeightsError, match="'falcon'.*smollm, gpt2, qwen2, llama-bpe"):
        generator(path)
    with pytest.raises(gguf_file.WeightsError, match="falcon"):
        catalog.describe(str(path))


@pytest.mark.parametrize("template", [
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ messages.append(1) }}{{ messages }}",
    "{{ cycler.__init__.__globals__.os.system('true') }}",
    "{% for m in messages %}{{ raise_exception('no system role') }}{% endfor %}",
    "{{ messages[0]['content'] | nosuchfilter }}",
])
def test_a_template_that_leaves_its_sandbox_is_a_chat_error(tmp_path, template):
    gen = generator(write_tiny(tmp_path / "m.gguf", "llama", "F32", template=template))
    with pytest.raises(ChatError, match="chat template"):
        gen.chat_prompt([{"role": "user", "content": "hi"}])


def test_an_unsupported_architecture_names_the_supported_ones(tmp_path, cache):
    path = tmp_path / "gemma.gguf"
    from gguf import GGUFWriter

    w = GGUFWriter(str(path), "gemma")
    w.add_block_count(1)
    w.add_token_list(["a"])
    w.add_token_types([1])
    w.add_eos_token_id(0)
    w.add_tensor("token_embd.weight", np.zeros((1, 32), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(gguf_file.WeightsError, match="'gemma'; supported: llama, qwen2"):
        gguf_weights.load(path)


def test_not_a_gguf_and_a_truncated_file_are_refused_and_nothing_half_written(tmp_path,
                                                                            cache):
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(os.urandom(4096))
    with pytest.raises(gguf_file.WeightsError, match="not a GGUF file"):
        gguf_weights.load(junk)
    good = write_tiny(tmp_path / "m.gguf", "qwen2", "Q8_0")
    data = good.read_bytes()
    for cut in (len(data) - 100, len(data) // 2, 2000, 30):
        short = tmp_path / f"short{cut}.gguf"
        short.write_bytes(data[:cut])
        with pytest.raises(gguf_file.WeightsError, match="truncated|damaged"):
            gguf_weights.load(short)
    # what a failed open leaves: the digests of the files it read, no parsed header, no partial
    left = sorted(p.name for p in cache.rglob("*") if p.is_file())
    assert not any(n.startswith(".partial") or n.endswith(".json") and ".h" in n
                   for n in left if "addresses" not in n), left
    assert not list(cache.glob("*.h*.json"))


def test_a_truncated_file_with_a_cached_header_is_still_refused(tmp_path):
    """The header cache says where the tensors lie; a file cut short after its first open is
    refused by that table, not mapped past its end."""
    path = write_tiny(tmp_path / "m.gguf", "llama", "F32")
    gguf_weights.load(path)
    gguf_weights._memo.clear()
    data = path.read_bytes()
    path.write_bytes(data[:len(data) - 64])
    with pytest.raises(gguf_file.WeightsError, match="truncated"):
        gguf_weights.load(path)


def test_a_file_is_hashed_once_until_it_changes(tmp_path, monkeypatch):
    path = write_tiny(tmp_path / "m.gguf", "llama", "F32")
    hashed = []
    real = gguf_file.hash_file
    monkeypatch.setattr(gguf_file, "hash_file", lambda p: hashed.append(p) or real(p))
    a = gguf_file.open_file(path).address
    assert gguf_file.open_file(path).address == a and len(hashed) == 1
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    assert gguf_file.open_file(path).address == a and len(hashed) == 2
    assert a == real(path)


def test_dead_cache_versions_are_removed_and_live_entries_kept(tmp_path, cache):
    """What older versions left (a float32 weight copy ``<address>.v2``, a header of another
    format), digests of files gone or changed, and a write cut short a day ago are removed at
    the first open; the current header, a live digest and files that are not the cache's own
    (an assembled model) stay."""
    path = write_tiny(tmp_path / "m.gguf", "llama", "F32")
    gone_file = write_tiny(tmp_path / "gone.gguf", "llama", "F32", seed=7)
    live = gguf_file.open_file(path)
    old_address = gguf_file.open_file(gone_file).address
    gone_file.unlink()
    gguf_file._pruned.clear()  # a new process
    a = "ab" * 32
    (cache / f"{a}.v2").mkdir()
    (cache / f"{a}.v2" / "blk.0.attn_q.weight.npy").write_bytes(b"\0" * 4096)
    (cache / f"{a}.h2.json").write_text("{}")
    (cache / "Qwen2.5-Coder-0.5B-Instruct-Q4_K_M.gguf").write_bytes(b"GGUF")
    (cache / "notes.v2").write_text("not ours")
    partial = cache / ".partial-abc"
    partial.write_text("{")
    old = partial.stat().st_mtime - 2 * gguf_file.PARTIAL_AGE_S
    os.utime(partial, (old, old))
    (cache / ".partial-now").write_text("{")  # another process's write in progress
    addresses = sorted((cache / "addresses").iterdir())
    assert len(addresses) == 2
    gguf_file.open_file(path)
    left = sorted(p.name for p in cache.iterdir())
    assert left == sorted([".partial-now", "Qwen2.5-Coder-0.5B-Instruct-Q4_K_M.gguf", "addresses",
                           "notes.v2", f"{live.address}.h3.json",
                           f"{old_address}.h3.json"]), left
    (kept,) = (cache / "addresses").iterdir()
    assert gguf_file._stale_address(kept) is False
    assert gguf_file.open_file(path).address == live.address


def test_a_prompt_over_the_context_is_refused(tmp_path):
    gen = generator(write_tiny(tmp_path / "m.gguf", "llama", "F32", context=32))
    with pytest.raises(GenerationError, match="context is 32 tokens"):
        gen.stream("x" * 40, max_tokens=1)


def test_known_names_and_paths_resolve(tmp_path):
    assert catalog.resolve(None)[1] == "SmolLM2-135M-Instruct"
    assert catalog.resolve("SmolLM2")[0] == gguf_weights.default_path()
    path = write_tiny(tmp_path / "m.gguf", "llama", "F32")
    assert catalog.resolve(str(path)) == (path, None)
    with pytest.raises(gguf_file.WeightsError, match="smollm2, qwen2.5-0.5b"):
        catalog.resolve("gpt5")
    with pytest.raises(gguf_file.WeightsError, match="no such model file"):
        catalog.resolve(str(tmp_path / "absent.gguf"))
    with pytest.raises(gguf_file.ModelMissing, match="make qwen-model"):
        catalog.resolve("qwen2.5-0.5b")
    ref = catalog.describe(str(path))
    assert ref.name == "Tiny Test Model" and ref.address == gguf_file.hash_file(path)


def test_an_unsupported_tensor_type_names_the_supported_ones(tmp_path):
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFWriter

    path = tmp_path / "ternary.gguf"
    w = GGUFWriter(str(path), "llama")
    w.add_token_list(["a"])
    w.add_token_types([1])
    w.add_eos_token_id(0)
    t = GGMLQuantizationType.TQ1_0
    w.add_tensor("token_embd.weight", np.zeros((2, GGML_QUANT_SIZES[t][1]), np.uint8),
                 raw_dtype=t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(gguf_file.WeightsError, match="TQ1_0; supported types: F32, F16.*Q6_K"):
        gguf_weights.load(path)
