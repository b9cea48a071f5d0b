"""Qwen2 / Qwen2.5: Q, K and V carry biases, RoPE rotates (i, i + d/2) pairs (the converter
leaves Q and K rows as Hugging Face stores them); the output head may be untied."""

from models.decoder import Architecture

ARCH = Architecture("qwen2", rope_style="neox", qkv_bias=True)
