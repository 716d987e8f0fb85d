#!/usr/bin/env python
"""Make sglang 0.5.23 runnable on a CPU-only machine (idempotent).

Steps, all in the environment of the interpreter running this script:
  1. install torchvision==0.28.0 --no-deps if it is missing;
  2. apply patches/*.diff (patch -p1 --forward) inside site-packages; a patch that
     reverse-applies cleanly is already in and is skipped; one that applies neither
     way fails the run, naming the patch;
  3. pip-install patches/sgl_kernel (the torch CPU stand-in), unless a real CUDA
     sgl_kernel is installed and CUDA is available.

Usage: .venv/bin/python scripts/apply_patches.py [--check]
  --check: change nothing; exit 1 if anything is missing or not applied.
See ../docs (and ../shared/docs/sglang-on-cpu.md) for why each patch exists.
"""

from __future__ import annotations

import argparse
import importlib.util
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PATCHES = REPO / "patches"
CONSTRAINTS = REPO / "requirements" / "constraints.txt"
TORCHVISION_PIN = "torchvision==0.28.0"
# Each diff is relative to site-packages; the file it touches decides which package must exist.
DIFFS = {
    "torchvision_meta_guard.diff": "torchvision/__init__.py",
    "sglang_keep_amx_backend.diff": "sglang/srt/arg_groups/overrides.py",
}


class PatchError(RuntimeError):
    pass


def log(msg: str) -> None:
    print(f"[apply_patches] {msg}", flush=True)


def site_packages() -> Path:
    return Path(sysconfig.get_paths()["purelib"])


def pip(*args: str) -> None:
    # -c adds the project's pins (torch==2.13.0, torchvision==0.28.0) to any machine-wide constraints.
    cmd = [sys.executable, "-m", "pip", *args, "-c", str(CONSTRAINTS), "--disable-pip-version-check", "-q"]
    subprocess.run(cmd, check=True)


def find_distribution_file(rel: str) -> bool:
    return (site_packages() / rel).is_file()


def ensure_torchvision(check: bool) -> bool:
    if find_distribution_file("torchvision/__init__.py"):
        log("torchvision present")
        return True
    if check:
        log("torchvision MISSING")
        return False
    log(f"installing {TORCHVISION_PIN} --no-deps")
    pip("install", "--no-deps", TORCHVISION_PIN)
    return True


def _patch(diff: Path, *extra: str) -> subprocess.CompletedProcess:
    cmd = ["patch", "-p1", "--forward", "--batch", "--silent", "-d", str(site_packages()), "-i", str(diff), *extra]
    return subprocess.run(cmd, capture_output=True, text=True)


def apply_diff(name: str, check: bool) -> bool:
    """True when the patch is (now) applied. Raises PatchError when it fits neither way."""
    diff = PATCHES / name
    target = DIFFS[name]
    if not find_distribution_file(target):
        raise PatchError(f"{name}: target {target} not found in {site_packages()}")
    if _patch(diff, "--reverse", "--dry-run").returncode == 0:
        log(f"{name}: already applied")
        return True
    forward = _patch(diff, "--dry-run")
    if forward.returncode != 0:
        raise PatchError(
            f"{name} no longer applies to {target} (neither forward nor reverse); "
            f"the upstream file changed, rewrite the patch.\n{forward.stdout}{forward.stderr}"
        )
    if check:
        log(f"{name}: NOT applied")
        return False
    done = _patch(diff, "--no-backup-if-mismatch")
    if done.returncode != 0:
        raise PatchError(f"{name}: patch failed:\n{done.stdout}{done.stderr}")
    log(f"{name}: applied")
    return True


def real_cuda_sgl_kernel() -> bool:
    """A genuine sgl_kernel (not our stand-in) on a machine with a usable GPU."""
    if importlib.util.find_spec("sgl_kernel") is None:
        return False
    try:
        import sgl_kernel
        import torch
    except Exception:
        return False
    return not getattr(sgl_kernel, "IS_CPU_STANDIN", False) and torch.cuda.is_available()


def standin_up_to_date() -> bool:
    """The installed sgl_kernel is byte-identical to patches/sgl_kernel/sgl_kernel."""
    src_dir = PATCHES / "sgl_kernel" / "sgl_kernel"
    dst_dir = site_packages() / "sgl_kernel"
    sources = sorted(p.name for p in src_dir.glob("*.py"))
    return all(
        (dst_dir / name).is_file() and (dst_dir / name).read_bytes() == (src_dir / name).read_bytes()
        for name in sources
    )


def ensure_sgl_kernel(check: bool) -> bool:
    if real_cuda_sgl_kernel():
        log("real CUDA sgl_kernel present; stand-in not installed")
        return True
    if standin_up_to_date():
        log("sgl_kernel stand-in up to date")
        return True
    if check:
        log("sgl_kernel stand-in MISSING or outdated")
        return False
    # Build from a temporary copy so no build/ or egg-info lands in the repo.
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "sgl_kernel"
        shutil.copytree(PATCHES / "sgl_kernel", src, ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info"))
        log("installing patches/sgl_kernel (CPU stand-in)")
        pip("install", "--no-deps", "--no-build-isolation", "--force-reinstall", str(src))
    return True


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="report only; exit 1 if something is missing")
    args = parser.parse_args()
    if shutil.which("patch") is None:
        log("ERROR: the `patch` program is required (apt-get install patch)")
        return 2
    ok = True
    try:
        ok &= ensure_torchvision(args.check)
        for name in DIFFS:
            ok &= apply_diff(name, args.check)
        ok &= ensure_sgl_kernel(args.check)
    except PatchError as err:
        log(f"ERROR: {err}")
        return 1
    except subprocess.CalledProcessError as err:
        log(f"ERROR: command failed ({err.returncode}): {' '.join(map(str, err.cmd))}")
        return 1
    log("all patches in place" if ok else "something is missing (see above)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
