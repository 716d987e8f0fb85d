"""sglang_dspark: DSpark speculative decoding served through SGLang."""

__version__ = "0.1.0"
