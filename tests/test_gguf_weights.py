"""SmolLM2-135M's GGUF read through the registry: the shape facts from its metadata, matrices
kept as the file stores them, loaded once per content address."""

from __future__ import annotations

import numpy as np

from models import gguf_file, gguf_weights


def test_config_is_smollm2_135m():
    c = gguf_weights.load().config
    assert (c.n_layers, c.d_model, c.d_ff, c.n_heads, c.n_kv_heads) == (30, 576, 1536, 9, 3)
    assert (c.vocab_size, c.head_dim, c.rope_base) == (49152, 64, 1e5)
    assert abs(c.norm_eps - 1e-5) < 1e-9
    assert (c.rope_style, c.qkv_bias, c.tied_output) == ("norm", False, True)


def test_loaded_once_by_content_address():
    a, b = gguf_weights.load(), gguf_weights.load()
    assert a is b
    assert a.address == gguf_file.hash_file(gguf_weights.default_path())
    # the file's general.name, or the catalog's name when a test before this one (same
    # process, under xdist) loaded it as the known model first: the cache keeps the first
    assert len(a.address) == 64 and a.name in ("Smollm2 135M 8k Lc100K Mix1 Ep2",
                                               "SmolLM2-135M-Instruct")


def test_matrices_are_as_the_file_stores_them():
    w = gguf_weights.load()
    assert w.matrices["blk.0.attn_k.weight"].shape == (192, 576)  # [out, in]
    assert w.matrices["blk.0.attn_k.weight"].qtype.name == "Q4_1"
    assert w.matrices["blk.0.attn_k.weight"].data.base is not None  # a view of the file's map
    assert w.layer(0, "attn_k").shape == (576, 192)  # dequantized, [in, out]
    assert w.layer(29, "ffn_down").shape == (1536, 576)
    assert w.head == "token_embd.weight"  # tied
    assert w.weight(w.head).shape == (576, 49152)
    for name in ("blk.0.attn_norm.weight", "output_norm.weight"):
        assert w.vectors[name].dtype == np.float32 and np.isfinite(w.vectors[name]).all()
        assert not w.vectors[name].flags.writeable


def test_hf_order_inverts_the_converters_permute():
    """convert_hf_to_gguf.py's permute, applied to rows [out, in]; hf_order takes [in, out]."""
    rng = np.random.default_rng(0)
    n_heads, d = 3, 8 * 3
    hf = rng.standard_normal((d, 5)).astype(np.float32)  # [out, in], Hugging Face's order
    permuted = hf.reshape(n_heads, 2, d // n_heads // 2, 5).swapaxes(1, 2).reshape(d, 5)
    assert np.array_equal(gguf_weights.hf_order(permuted.T, n_heads).T, hf)


_MEMORY = """
import json
def anon():  # private memory (kB): a float32 copy would be here, the file's pages are not
    return int(next(l for l in open("/proc/self/status") if l.startswith("RssAnon")).split()[1])
from models import gguf_weights
from models.llama import Llama
before = anon()
w = gguf_weights.load()
m = Llama(w)
cache = m.new_cache(16)
m.forward([1, 504, 3458, 282], cache)
m.forward([314], cache)
print(json.dumps({"grew": (anon() - before) * 1024,
                  "matrices": sum(t.nbytes for t in w.matrices.values()),
                  "weights": sum(t.shape[0] * t.shape[1] for t in w.matrices.values())}))
"""


def test_the_forward_keeps_no_float32_copy_of_the_matrices():
    """The matrices stay the file's mapped blocks through a forward: private memory grows by
    far less than their float32 size (540 MB for SmolLM2's 135M weights; the Q4_1 file holds
    92 MB), which the float32 stand-in had added at load (the test failed before)."""
    import json
    import subprocess
    import sys

    from tests.conftest import subprocess_env

    out = subprocess.run([sys.executable, "-c", _MEMORY], capture_output=True, text=True,
                         timeout=300, env=subprocess_env(), check=True).stdout
    got = json.loads(out.strip().splitlines()[-1])
    assert got["matrices"] < got["weights"]  # under a byte per weight as stored
    assert got["grew"] < 0.25 * 4 * got["weights"], got
