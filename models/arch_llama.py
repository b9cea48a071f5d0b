"""Llama (SmolLM2, Llama 2/3, Mistral-style files): llama.cpp's converter permutes Q and K rows
so that RoPE rotates adjacent pairs; biases on Q/K/V are read when the file has them."""

from models.decoder import Architecture

ARCH = Architecture("llama", rope_style="norm")
