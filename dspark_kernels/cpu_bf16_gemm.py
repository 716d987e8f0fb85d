"""Small-M bf16 GEMMs for x86 CPUs, with a torch fallback: csrc/bf16_small_m_gemm.c for CPUs without bf16 dot
products, csrc/bf16_small_m_gemm_dp.c for CPUs with AVX512-BF16 (bf16 inputs, vdpbf16ps).

torch's bf16 CPU GEMM on an AVX2-only CPU costs in proportion to its rows (BENCHMARKS.md, "CPU GEMM kernel"):
the embedded model's lm_head takes 14 ms for one row and 107 ms for eight. One row already streams the weights at
memory speed, so the C kernel reads each weight tile once, upcasts it in registers and uses it for every row:
eight rows then cost 32 ms. Speculative verification lives on such 2-16-row GEMMs.

The kernel is compiled on first use with the system C compiler (gcc / cc, -O3 -mavx2 -mfma -fopenmp; about a
second) into the user cache, keyed by the source's hash, and called through ctypes. Its OpenMP runtime is the one
torch already loaded (same soname), so it shares torch's thread pool rather than racing a second one for the cores.
Where it cannot be built (no AVX2/FMA, no compiler, not x86 Linux) `load()` says why and `small_m_linear` runs
torch's F.linear.

On CPUs with AVX512-BF16 torch's bf16 GEMM (oneDNN) is native but still not flat in the row count: on a 2-core
EPYC Zen 4 the embedded model's linear layers took 82-91 ms for one row and 99-112 ms for eight, weights streamed
from memory. The dp kernel reads each weight tile once for up to 4 rows of bf16 input and multiplies with
vdpbf16ps: 63-65 ms for one row, 82 ms for eight (benchmarks/cpu_gemm_dp.py). `small_m_linear` takes it for bf16
inputs where `load_dp()` builds it.
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

DP_SOURCE = "bf16_small_m_gemm_dp.c"
DP_CFLAGS = ("-O3", "-mavx512f", "-mavx512bw", "-mavx512bf16", "-fopenmp", "-shared", "-fPIC")
DP_REQUIRED_CPU_FLAGS = ("avx512f", "avx512bw", "avx512_bf16")
AMX_SOURCE = "bf16_small_m_gemm_amx.c"
AMX_CFLAGS = ("-O3", "-mamx-tile", "-mamx-bf16", "-fopenmp", "-shared", "-fPIC")
AMX_REQUIRED_CPU_FLAGS = ("amx_tile", "amx_bf16")
AMX_BLOCK = (16, 32)  # the AMX kernel's N and K granularity; other shapes take the dp kernel

_loaded: tuple[object | None, str] | None = None  # (ctypes function or None, reason)
_build_id = ""
_loaded_dp: tuple[object | None, str] | None = None
_dp_build_id = ""
_loaded_amx: tuple[object | None, str] | None = None
_amx_build_id = ""


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            line = next((ln for ln in f if ln.startswith("flags")), "")
    except OSError:
        return set()
    return set(line.split(":", 1)[1].split()) if ":" in line else set()


def _source_text(name: str = SOURCE) -> str:
    return resources.files("dspark_kernels").joinpath("csrc", name).read_text()


def _compile(src: str, out: Path, name: str = SOURCE, cflags: tuple[str, ...] = CFLAGS) -> None:
    cc = os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        raise RuntimeError("no C compiler (gcc or cc) on PATH")
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        c_path = Path(tmp) / name
        c_path.write_text(src)
        so_tmp = Path(tmp) / out.name
        proc = subprocess.run([cc, *cflags, "-o", str(so_tmp), str(c_path)], capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"{cc} failed: {proc.stderr.strip()[-500:]}")
        os.replace(so_tmp, out)  # atomic: concurrent builders (tests, TP ranks) never load a half-written file


def _build(name: str, cflags: tuple[str, ...], required: tuple[str, ...], symbol: str, argtypes: list,
           init_symbol: str | None = None):
    """(ctypes function, digest, "") or (None, "", why not): compiled into the cache once per source and flags.
    init_symbol: a function of the library run once after loading; nonzero means the kernel cannot run here."""
    if os.environ.get(DISABLE_ENV):
        return None, "", f"disabled by {DISABLE_ENV}"
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        return None, "", f"x86-64 Linux only (this is {platform.system()} {platform.machine()})"
    if missing := [f for f in required if f not in _cpu_flags()]:
        return None, "", f"the CPU lacks {', '.join(missing)}"
    try:
        src = _source_text(name)
        digest = hashlib.sha256((src + " ".join(cflags)).encode()).hexdigest()[:16]
        so_path = CACHE_DIR / f"{Path(name).stem}-{digest}.so"
        if not so_path.exists():
            _compile(src, so_path, name, cflags)
        lib = ctypes.CDLL(str(so_path))
        if init_symbol is not None and (rc := getattr(lib, init_symbol)()) != 0:
            return None, "", f"{init_symbol}() returned {rc}"
        fn = getattr(lib, symbol)
        fn.argtypes = argtypes
        fn.restype = None
        return fn, digest, ""
    except (OSError, RuntimeError, AttributeError) as exc:
        return None, "", f"could not build the C kernel ({exc})"


build_kernel = _build  # for the other C kernels of this folder (dspark_kernels/cpu_rotary.py)

_ARGTYPES = [ctypes.c_void_p] * 4 + [ctypes.c_long] * 4 + [ctypes.c_int]


def load() -> tuple[object | None, str]:
    """(the AVX2 kernel's ctypes function, "") or (None, why not). Built and loaded once per process."""
    global _loaded, _build_id
    if _loaded is not None:
        return _loaded
    fn, _build_id, reason = _build(SOURCE, CFLAGS, REQUIRED_CPU_FLAGS, "bf16_small_m_gemm", _ARGTYPES)
    _loaded = (fn, reason)
    if fn is None:
        logger.info("bf16 small-M CPU kernel unavailable: %s", reason)
    return _loaded


def load_dp() -> tuple[object | None, str]:
    """(the AVX512-BF16 kernel's ctypes function, "") or (None, why not)."""
    global _loaded_dp, _dp_build_id
    if _loaded_dp is not None:
        return _loaded_dp
    fn, _dp_build_id, reason = _build(DP_SOURCE, DP_CFLAGS, DP_REQUIRED_CPU_FLAGS, "bf16_small_m_gemm_dp",
                                      _ARGTYPES)
    _loaded_dp = (fn, reason)
    if fn is None:
        logger.info("AVX512-BF16 small-M CPU kernel unavailable: %s", reason)
    return _loaded_dp


def load_amx() -> tuple[object | None, str]:
    """(the AMX-BF16 kernel's ctypes function, "") or (None, why not); it also needs Linux to grant tile state."""
    global _loaded_amx, _amx_build_id
    if _loaded_amx is not None:
        return _loaded_amx
    fn, _amx_build_id, reason = _build(AMX_SOURCE, AMX_CFLAGS, AMX_REQUIRED_CPU_FLAGS, "bf16_small_m_gemm_amx",
                                       _ARGTYPES, init_symbol="bf16_amx_init")
    _loaded_amx = (fn, reason)
    if fn is None:
        logger.info("AMX-BF16 small-M CPU kernel unavailable: %s", reason)
    return _loaded_amx


def available() -> bool:
    return load()[0] is not None or load_dp()[0] is not None


def build_id() -> str:
    """The loaded builds' source-and-flags hashes ("" when none loaded): timings measured with one build are not
    reused for another."""
    ids = [d for d, ok in ((_build_id, load()[0]), (_dp_build_id, load_dp()[0]), (_amx_build_id, load_amx()[0]))
           if ok is not None]
    return "+".join(ids)


def small_m_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear(x, weight, bias) for a bf16 CPU weight [N, K], with fp32 accumulation; output in x.dtype.

    bf16 inputs take the AMX kernel where it builds and the shape fits its tiles, else the AVX512-BF16 kernel
    where it builds (their values are its inputs as they are); others the AVX2 kernel on their fp32 upcast. Falls back to F.linear where neither is available or the arguments are
    outside what they handle."""
    dp = load_dp()[0] if x.dtype == torch.bfloat16 else None
    if dp is not None and weight.dim() == 2 and weight.shape[0] % AMX_BLOCK[0] == 0 \
            and weight.shape[1] % AMX_BLOCK[1] == 0:
        dp = load_amx()[0] or dp
    fn = dp if dp is not None else load()[0]
    if (fn is None or weight.dtype != torch.bfloat16 or weight.device.type != "cpu" or weight.dim() != 2
            or not weight.is_contiguous() or x.shape[-1] != weight.shape[1] or x.device.type != "cpu"):
        return F.linear(x, weight, bias)
    lead = x.shape[:-1]
    xf = x.reshape(-1, x.shape[-1]).to(torch.float32 if dp is None else torch.bfloat16).contiguous()
    m, k = xf.shape
    n = weight.shape[0]
    y = torch.empty(m, n, dtype=torch.float32)
    if m > 0:
        bf = None if bias is None else bias.to(torch.float32).contiguous()
        fn(xf.data_ptr(), weight.data_ptr(), None if bf is None else bf.data_ptr(), y.data_ptr(), m, k, n, k,
           torch.get_num_threads())
    return y.to(x.dtype).reshape(*lead, n)
