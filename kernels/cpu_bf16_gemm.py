"""Small-M bf16 GEMM for x86 CPUs without bf16 dot products (csrc/bf16_small_m_gemm.c), with a torch fallback.

torch's bf16 CPU GEMM on an AVX2-only CPU costs in proportion to its rows (BENCHMARKS.md, "CPU GEMM kernel"):
the embedded model's lm_head takes 14 ms for one row and 107 ms for eight. One row already streams the weights at
memory speed, so the C kernel reads each weight tile once, upcasts it in registers and uses it for every row:
eight rows then cost 32 ms. Speculative verification lives on such 2-16-row GEMMs.

The kernel is compiled on first use with the system C compiler (gcc / cc, -O3 -mavx2 -mfma -fopenmp; about a
second) into the user cache, keyed by the source's hash, and called through ctypes. Its OpenMP runtime is the one
torch already loaded (same soname), so it shares torch's thread pool rather than racing a second one for the cores.
Where it cannot be built (no AVX2/FMA, no compiler, not x86 Linux) `load()` says why and `small_m_linear` runs
torch's F.linear.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from importlib import resources
from pathlib import Path

import torch
import torch.nn.functional as F

logger = logging.getLogger(__name__)

SOURCE = "bf16_small_m_gemm.c"
CFLAGS = ("-O3", "-mavx2", "-mfma", "-fopenmp", "-shared", "-fPIC")
REQUIRED_CPU_FLAGS = ("avx2", "fma")
DISABLE_ENV = "SGLANG_DSPARK_NO_CPU_KERNELS"  # any non-empty value: never build or load (the torch path runs)
CACHE_DIR = Path(os.environ.get("SGLANG_DSPARK_CACHE", Path.home() / ".cache" / "sglang_dspark")) / "kernels"

_loaded: tuple[object | None, str] | None = None  # (ctypes function or None, reason)
_build_id = ""


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            line = next((ln for ln in f if ln.startswith("flags")), "")
    except OSError:
        return set()
    return set(line.split(":", 1)[1].split()) if ":" in line else set()


def _source_text() -> str:
    return resources.files("kernels").joinpath("csrc", SOURCE).read_text()


def _compile(src: str, out: Path) -> None:
    cc = os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        raise RuntimeError("no C compiler (gcc or cc) on PATH")
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        c_path = Path(tmp) / SOURCE
        c_path.write_text(src)
        so_tmp = Path(tmp) / out.name
        proc = subprocess.run([cc, *CFLAGS, "-o", str(so_tmp), str(c_path)], capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"{cc} failed: {proc.stderr.strip()[-500:]}")
        os.replace(so_tmp, out)  # atomic: concurrent builders (tests, TP ranks) never load a half-written file


def load() -> tuple[object | None, str]:
    """(the kernel's ctypes function, "") or (None, why not). Built and loaded once per process."""
    global _loaded, _build_id
    if _loaded is not None:
        return _loaded
    fn, reason = None, ""
    if os.environ.get(DISABLE_ENV):
        reason = f"disabled by {DISABLE_ENV}"
    elif platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        reason = f"x86-64 Linux only (this is {platform.system()} {platform.machine()})"
    elif missing := [f for f in REQUIRED_CPU_FLAGS if f not in _cpu_flags()]:
        reason = f"the CPU lacks {', '.join(missing)}"
    else:
        try:
            src = _source_text()
            digest = hashlib.sha256((src + " ".join(CFLAGS)).encode()).hexdigest()[:16]
            so_path = CACHE_DIR / f"bf16_small_m_gemm-{digest}.so"
            _build_id = digest
            if not so_path.exists():
                _compile(src, so_path)
            lib = ctypes.CDLL(str(so_path))
            fn = lib.bf16_small_m_gemm
            fn.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_long] * 4 + [ctypes.c_int]
            fn.restype = None
        except (OSError, RuntimeError) as exc:
            fn, reason = None, f"could not build the C kernel ({exc})"
    _loaded = (fn, reason)
    if fn is None:
        logger.info("bf16 small-M CPU kernel unavailable: %s", reason)
    return _loaded


def available() -> bool:
    return load()[0] is not None


def build_id() -> str:
    """The loaded build's source-and-flags hash ("" when not loaded): timings measured with one build are not
    reused for another."""
    return _build_id if available() else ""


def small_m_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear(x, weight, bias) for a bf16 CPU weight [N, K], with fp32 accumulation; output in x.dtype.

    Falls back to F.linear where the kernel is unavailable or the arguments are outside what it handles."""
    fn = load()[0]
    if (fn is None or weight.dtype != torch.bfloat16 or weight.device.type != "cpu" or weight.dim() != 2
            or not weight.is_contiguous() or x.shape[-1] != weight.shape[1] or x.device.type != "cpu"):
        return F.linear(x, weight, bias)
    lead = x.shape[:-1]
    xf = x.reshape(-1, x.shape[-1]).to(torch.float32).contiguous()
    m, k = xf.shape
    n = weight.shape[0]
    y = torch.empty(m, n, dtype=torch.float32)
    if m > 0:
        bf = None if bias is None else bias.to(torch.float32).contiguous()
        fn(xf.data_ptr(), weight.data_ptr(), None if bf is None else bf.data_ptr(), y.data_ptr(), m, k, n, k,
           torch.get_num_threads())
    return y.to(x.dtype).reshape(*lead, n)
