"""The installed package imports the same from any working directory: the CPU kernels load outside the repository,
and SGLang's own dependency `kernels` (Hugging Face's kernel hub) is not shadowed by ours from inside it."""

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

PROBE = """
import importlib.util, json
from dspark_kernels import cpu_bf16_gemm, cpu_rotary
spec = importlib.util.find_spec("kernels")
print(json.dumps({"ours": cpu_rotary.__file__, "rotary": cpu_rotary.load()[1], "gemm": cpu_bf16_gemm.load()[1],
                  "hub": spec.origin if spec else None}))
"""


@pytest.mark.parametrize("where", ["outside", "repo"])
def test_kernels_import_from_any_working_directory(tmp_path, where):
    import json

    cwd = tmp_path if where == "outside" else REPO
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=cwd, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert Path(got["ours"]).resolve().is_relative_to(REPO / "dspark_kernels")
    # a reason is only ever "could not build" on machines without a compiler or the CPU flags, never a missing file
    assert "No such file" not in got["rotary"] and "No such file" not in got["gemm"], got
    if got["hub"] is not None:  # installed with SGLang: ours must not stand in for it
        assert "site-packages" in Path(got["hub"]).parts, got["hub"]
