"""models.quant: GGUF weights kept in their block format, decoded and multiplied by the
compiled kernels, against gguf.quants (the reference decoder) and float64 products."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader, GGUFWriter, quants

from compute.verify import check_product, draw_vectors
from models import quant
from models.quant import SUPPORTED, QTensor

Q = GGMLQuantizationType
U = 2.0**-24


def _raw_blocks(qtype, out: int, n_in: int, rng) -> np.ndarray:
    """Random valid blocks (finite f16 scales) for types gguf.quants cannot quantize."""
    per_block, block_bytes = GGML_QUANT_SIZES[qtype]
    blocks = rng.integers(0, 256, (out, n_in // per_block, block_bytes), dtype=np.uint8)
    scales = (rng.standard_normal((out, n_in // per_block, 2)) * 0.01).astype(np.float16)
    scales = scales.view(np.uint8)
    if qtype == Q.Q6_K:
        blocks[..., 208:210] = scales[..., 0:2]
    else:
        blocks[..., 0:4] = scales  # d (and dmin for Q4_K/Q5_K)
    return blocks.reshape(out, -1)


def _weights(qtype, out: int = 40, n_in: int = 512, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(raw bytes [out, row bytes], gguf.quants' dequantized float32 [out, in])."""
    rng = np.random.default_rng(seed)
    try:
        raw = quants.quantize(rng.standard_normal((out, n_in)).astype(np.float32), qtype)
    except NotImplementedError:
        raw = _raw_blocks(qtype, out, n_in, rng)
    raw = np.ascontiguousarray(raw)
    typed = {Q.F32: np.float32, Q.F16: np.float16}.get(qtype)
    ref = quants.dequantize(raw if typed is None else raw.view(typed), qtype)
    return raw.view(np.uint8).reshape(out, -1), np.asarray(ref, np.float32).reshape(out, n_in)


def _bound(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Worst-case float32 rounding of any summation order over ``in`` terms (the BLAS path's;
    the kernels' order sums in/32 + 5 terms per lane): u (in + 5) sum |x| |w|."""
    return U * (x.shape[1] + 5) * (np.abs(x).astype(np.float64) @ np.abs(w.T).astype(np.float64))


@pytest.mark.parametrize("qtype", SUPPORTED, ids=lambda t: t.name)
def test_dequantize_equals_gguf_quants_exactly(qtype):
    raw, ref = _weights(qtype)
    w = QTensor(qtype, ref.shape, raw)
    assert np.array_equal(w.dequantize(), ref)
    assert np.array_equal(w.dequantize(slice(3, 11)), ref[3:11])
    assert w.nbytes == raw.nbytes


@pytest.mark.parametrize("qtype", SUPPORTED, ids=lambda t: t.name)
@pytest.mark.parametrize("n", [1, 3, quant.FEW + 12])
def test_matmul_is_within_float32_rounding_of_the_float64_product(qtype, n):
    raw, ref = _weights(qtype)
    x = np.random.default_rng(1).standard_normal((n, ref.shape[1])).astype(np.float32)
    y = QTensor(qtype, ref.shape, raw).matmul(x)
    assert y.shape == (n, ref.shape[0]) and y.dtype == np.float32
    exact = x.astype(np.float64) @ ref.T.astype(np.float64)
    assert (np.abs(y - exact) <= _bound(x, ref)).all()


@pytest.mark.parametrize("qtype", [Q.Q4_1, Q.Q8_0, Q.Q6_K], ids=lambda t: t.name)
def test_a_rows_result_has_the_same_bits_on_every_decoding_path(qtype, monkeypatch):
    """One row of x alone, among a few, and split over threads or not: same bits."""
    raw, ref = _weights(qtype, out=300)
    w = QTensor(qtype, ref.shape, raw)
    x = np.random.default_rng(2).standard_normal((quant.FEW, ref.shape[1])).astype(np.float32)
    monkeypatch.setattr(quant, "SPLIT_BYTES", 1 << 40)
    alone = np.stack([w.matmul(x[t]) for t in range(len(x))])
    batch = w.matmul(x)
    monkeypatch.setattr(quant, "SPLIT_BYTES", 0)
    monkeypatch.setattr(quant, "THREADS", 2)
    split = w.matmul(x)
    split_one = w.matmul(x[0])
    assert np.array_equal(alone, batch) and np.array_equal(batch, split)
    assert np.array_equal(split_one, alone[0])


def test_products_handed_out_together_give_each_ones_own_bits(monkeypatch):
    """quant.matmuls (a layer's Q, K and V in one hand-off to the helper threads) gives what
    each product gives alone, on every path (one row, a few, prefill tiles); a product that
    cannot run is refused before any does."""
    rng = np.random.default_rng(3)
    ws = [QTensor(t, ref.shape, raw) for t, (raw, ref) in
          ((t, _weights(t, out=o, seed=i)) for i, (t, o) in
           enumerate(((Q.Q4_K, 300), (Q.Q8_0, 64), (Q.Q6_K, 130))))]
    xs = [rng.standard_normal((n, 512)).astype(np.float32) for n in (1, 3, quant.FEW + 4)]
    monkeypatch.setattr(quant, "THREADS", 1)
    alone = [[w.matmul(x) for w in ws] for x in xs]
    monkeypatch.setattr(quant, "THREADS", 2)
    monkeypatch.setattr(quant, "SPLIT_BYTES", 0)
    for x, want in zip(xs, alone, strict=True):
        got = quant.matmuls([(w, x) for w in ws])
        assert all(np.array_equal(g, a) for g, a in zip(got, want, strict=True))
    mixed = quant.matmuls([(ws[0], xs[0][0]), (ws[1], xs[2]), (ws[2], xs[1])])
    assert np.array_equal(mixed[0], alone[0][0][0]) and np.array_equal(mixed[1], alone[2][1])
    with pytest.raises(ValueError, match=r"x is float32 \[n, 512\]"):
        quant.matmuls([(ws[0], xs[0]), (ws[1], xs[0][:, :256])])


def test_slice_rows_is_a_view_and_rows_gathers_embeddings():
    raw, ref = _weights(Q.Q4_K, out=64)
    w = QTensor(Q.Q4_K, ref.shape, raw)
    part = w.slice_rows(10, 30)
    assert part.shape == (20, ref.shape[1]) and np.shares_memory(part.data, w.data)
    assert np.array_equal(part.dequantize(), ref[10:30])
    index = np.array([5, 0, 63, 5])
    assert np.array_equal(w.rows(index), ref[index])
    assert w.rows(np.zeros(0, np.int64)).shape == (0, ref.shape[1])
    with pytest.raises(ValueError, match="out of range"):
        w.rows(np.array([64]))
    with pytest.raises(ValueError, match="within"):
        w.slice_rows(30, 65)


def test_fingerprint_and_check_vectors_come_from_the_dequantized_rows(monkeypatch):
    monkeypatch.setattr(quant, "TILE_BYTES", 4 * 512 * 7)  # many tiles of 7 rows
    raw, ref = _weights(Q.Q5_0, out=100)
    w = QTensor(Q.Q5_0, ref.shape, raw)
    ref64 = ref.astype(np.float64)
    r_in = draw_vectors(ref.shape[1], 4, np.random.default_rng(3))
    fp = w.fingerprint(r_in)
    assert fp.shape == (100, 4)
    assert (np.abs(fp - ref64 @ r_in) <= _bound(r_in.T, ref).T).all()
    r_out = draw_vectors(ref.shape[0], 4, np.random.default_rng(4))
    br, norms2 = w.check_vectors(r_out)
    assert br.shape == (ref.shape[1], 4) and norms2.shape == (ref.shape[1],)
    assert np.allclose(br, ref64.T @ r_out, rtol=1e-4, atol=1e-4 * np.abs(br).max())
    assert np.allclose(norms2, (ref64 ** 2).sum(axis=0), rtol=1e-12)
    # what a requester does with them: check a worker's y = x @ W.T
    x = np.random.default_rng(5).standard_normal((6, ref.shape[1])).astype(np.float32)
    y = w.matmul(x)
    assert check_product(x, ref.T, y, r_out, norms2, br=br)
    y[2, 7] += 0.05 * np.sqrt(np.mean(y ** 2))
    assert not check_product(x, ref.T, y, r_out, norms2, br=br)


def _write_gguf(path, tensors: dict[str, tuple[GGMLQuantizationType, np.ndarray]]) -> None:
    writer = GGUFWriter(path, "llama")
    for name, (qtype, raw) in tensors.items():
        if qtype in (Q.F32, Q.F16):
            writer.add_tensor(name, raw.view(np.float32 if qtype == Q.F32 else np.float16))
        else:
            writer.add_tensor(name, raw, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_from_reader_maps_the_files_bytes_without_a_copy(tmp_path):
    types = [Q.F32, Q.F16, Q.Q4_0, Q.Q8_0, Q.Q4_K, Q.Q6_K]
    made = {f"w.{t.name}": (t, *_weights(t, out=24, n_in=256, seed=i))
            for i, t in enumerate(types)}
    _write_gguf(tmp_path / "tiny.gguf", {k: (t, raw) for k, (t, raw, _) in made.items()})
    reader = GGUFReader(tmp_path / "tiny.gguf")
    for tensor in reader.tensors:
        qtype, raw, ref = made[tensor.name]
        w = QTensor.from_reader(tensor)
        assert (w.qtype, w.shape) == (qtype, (24, 256))
        assert np.shares_memory(w.data, tensor.data)
        assert np.array_equal(w.dequantize(), ref)
        x = np.ones((1, 256), np.float32)
        assert np.allclose(w.matmul(x)[0], ref.astype(np.float64).sum(axis=1),
                           atol=1e-4 * np.abs(ref).sum(axis=1).max())


def test_gguf_tensors_maps_matrices_and_reads_vectors(tmp_path):
    raw, ref = _weights(Q.Q8_0, out=8, n_in=64)
    norm = np.arange(64, dtype=np.float32)
    _write_gguf(tmp_path / "m.gguf", {"w": (Q.Q8_0, raw), "norm": (Q.F32, norm.view(np.uint8))})
    tensors = quant.gguf_tensors(GGUFReader(tmp_path / "m.gguf"))
    assert isinstance(tensors["w"], QTensor) and np.array_equal(tensors["w"].dequantize(), ref)
    assert tensors["norm"].dtype == np.float32 and np.array_equal(tensors["norm"], norm)
    _write_gguf(tmp_path / "cube.gguf", {"c": (Q.F32, np.ones((2, 2, 32), np.float32))})
    with pytest.raises(ValueError, match="'c' has 3 dimensions"):
        quant.gguf_tensors(GGUFReader(tmp_path / "cube.gguf"))


def test_bad_input_gets_a_clear_error():
    raw, ref = _weights(Q.Q8_0)
    with pytest.raises(ValueError, match="is 21760 bytes, got 21759"):
        QTensor.from_bytes(Q.Q8_0, ref.shape, raw.tobytes()[:-1])
    assert np.array_equal(QTensor.from_bytes("Q8_0", ref.shape, raw.tobytes()).dequantize(), ref)
    empty = QTensor.from_bytes(Q.Q8_0, (0, 512), b"")
    assert empty.matmul(np.ones((2, 512), np.float32)).shape == (2, 0)
    with pytest.raises(ValueError, match=r"Q2_K is not supported; supported: F32, F16, .*Q6_K"):
        QTensor.from_bytes(Q.Q2_K, (4, 256), bytes(4 * 84))
    with pytest.raises(ValueError, match="unknown GGML type"):
        QTensor(999, (4, 32), np.zeros((4, 34), np.uint8))
    with pytest.raises(ValueError, match="multiple of 32"):
        QTensor.from_bytes(Q.Q4_0, (2, 48), bytes(72))
    with pytest.raises(ValueError, match=r"uint8 \[40, 544\]"):
        QTensor(Q.Q8_0, ref.shape, raw[:, :-1])
    w = QTensor(Q.Q8_0, ref.shape, raw)
    with pytest.raises(ValueError, match=r"float32 \[n, 512\]"):
        w.matmul(np.ones((2, 511), np.float32))
    with pytest.raises(ValueError, match=r"float32 \[n, 512\]"):
        w.matmul(np.ones((2, 512), np.float64))
    with pytest.raises(ValueError, match=r"\[512, k\]"):
        w.fingerprint(np.ones((40, 4), np.float32))


@pytest.fixture(scope="module")
def smollm2():
    from models.gguf_weights import default_path

    return GGUFReader(default_path())


def test_smollm2_matmul_equals_dequantize_then_matmul(smollm2):
    """The real file: its Q4_1 layers and its Q8_0 tied head (49152 x 576)."""
    wanted = {"blk.0.attn_q.weight", "blk.7.ffn_down.weight", "blk.29.attn_k.weight",
              "token_embd.weight"}
    rng = np.random.default_rng(6)
    seen = set()
    for tensor in smollm2.tensors:
        if tensor.name not in wanted:
            continue
        seen.add(tensor.name)
        w = QTensor.from_reader(tensor)
        ref = np.asarray(quants.dequantize(tensor.data, tensor.tensor_type), np.float32)
        assert np.array_equal(w.dequantize(), ref)
        for n in (1, 2, 17):
            x = rng.standard_normal((n, w.shape[1])).astype(np.float32)
            exact = x.astype(np.float64) @ ref.T.astype(np.float64)
            assert (np.abs(w.matmul(x) - exact) <= _bound(x, ref)).all()
    assert seen == wanted
