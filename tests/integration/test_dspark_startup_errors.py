"""DSPARK_EXT refuses bad setups at startup: the server exits non-zero and its log says what is wrong.

The three launches run concurrently (each mostly waits on imports and model load) to keep the wall time down.
"""

from __future__ import annotations

import json
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.integration.conftest import BLOCK, Server, dspark_args

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

MISSING_KEY = "layers.0.self_attn.o_proj.weight"


def _mismatched_drafter(models, root: Path) -> Path:
    """A well-formed drafter built for a different target (hidden 32, vocab 1024)."""
    from tests.tiny_dspark import build_tiny_drafter

    other = root / "other_target"
    other.mkdir()
    cfg = json.loads((models.tiny / "config.json").read_text())
    cfg.update(hidden_size=32, intermediate_size=64, vocab_size=1024)
    (other / "config.json").write_text(json.dumps(cfg))
    return build_tiny_drafter(other, root / "mismatched_drafter", block_size=BLOCK)


def _drafter_missing_tensor(models, root: Path, key: str) -> Path:
    from safetensors.torch import load_file, save_file

    out = root / "broken_drafter"
    shutil.copytree(models.tiny_drafter, out)
    state = load_file(out / "model.safetensors")
    assert key in state, sorted(state)
    del state[key]
    save_file(state, out / "model.safetensors", metadata={"format": "pt"})
    return out


@pytest.fixture(scope="module")
def failed_starts(models, log_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("bad_drafters")
    cases = {
        "mismatch": dspark_args(models.tiny, _mismatched_drafter(models, root), "fixed:2"),
        "missing_tensor": dspark_args(models.tiny, _drafter_missing_tensor(models, root, MISSING_KEY), "fixed:2"),
        "bad_controller": dspark_args(models.tiny, models.tiny_drafter, "bogus:3"),
    }
    servers = {name: Server(f"startup_{name}", args, None, log_dir) for name, args in cases.items()}
    with ThreadPoolExecutor(len(servers)) as pool:
        codes = dict(zip(servers, pool.map(lambda s: s.wait_exit(timeout_s=300), servers.values())))
    return {name: (codes[name], servers[name].log_text()) for name in servers}


def _check(failed_starts, name: str, *needles: str) -> None:
    code, log = failed_starts[name]
    tail = "\n".join(log.splitlines()[-30:])
    assert code != -999, f"{name}: server did not exit within the timeout (it should refuse to start)\n{tail}"
    assert code != 0, f"{name}: server exited 0\n{tail}"
    for needle in needles:
        assert needle in log, f"{name}: log does not name {needle!r}\n{tail}"


def test_drafter_shape_mismatch_is_refused(failed_starts):
    _check(failed_starts, "mismatch", "hidden_size 32 != target hidden_size 64",
           "vocab_size 1024 != target vocab_size 2048")


def test_drafter_missing_tensor_is_refused(failed_starts):
    _check(failed_starts, "missing_tensor", f"missing tensor '{MISSING_KEY}'")


def test_bad_controller_spec_is_refused(failed_starts):
    _check(failed_starts, "bad_controller", "policy 'bogus:3'", "expected one of")
