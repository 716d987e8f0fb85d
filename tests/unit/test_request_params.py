"""Per-request DSpark parameters (custom_params): validation and the SLA floors a batch hands the controller."""

import math
from types import SimpleNamespace

import pytest

from sglang_dspark.sglang_plugin.request_params import SLA_KEY, request_floors, validate


def _req(custom=None):
    return SimpleNamespace(sampling_params=SimpleNamespace(custom_params=custom))


@pytest.mark.parametrize("bad", [-1, "fast", float("nan"), float("inf"), True, [3]])
def test_bad_floor_is_rejected_with_the_key_named(bad):
    with pytest.raises(ValueError, match=SLA_KEY):
        validate({SLA_KEY: bad})


@pytest.mark.parametrize("good", [None, {}, {"other": 1}, {SLA_KEY: 0}, {SLA_KEY: 12.5}, {SLA_KEY: 3}])
def test_good_floor_passes(good):
    validate(good)


def test_request_floor_overrides_server_floor_and_zero_means_none():
    floors = request_floors([_req(), _req({SLA_KEY: 20}), _req({SLA_KEY: 0})], server_floor=5.0)
    assert floors[0] == 5.0 and floors[1] == 20.0 and math.isnan(floors[2])
    assert request_floors([_req(), _req({"x": 1})], server_floor=None) is None
    only = request_floors([_req(), _req({SLA_KEY: 8})], server_floor=None)
    assert math.isnan(only[0]) and only[1] == 8.0


@pytest.mark.parametrize("bad", [-0.5, "hot", float("nan"), float("inf"), True, [0]])
def test_bad_draft_temperature_is_rejected_with_the_key_named(bad):
    from sglang_dspark.sglang_plugin.request_params import DRAFT_TEMPERATURE_KEY, validate_draft_temperature

    with pytest.raises(ValueError, match=DRAFT_TEMPERATURE_KEY):
        validate_draft_temperature({DRAFT_TEMPERATURE_KEY: bad})


def test_draft_temperature_caps_request_overrides_server_default():
    from sglang_dspark.sglang_plugin.request_params import DRAFT_TEMPERATURE_KEY, draft_temperature_caps

    key = DRAFT_TEMPERATURE_KEY
    reqs = [_req(), _req({key: 0.5}), _req({key: "request"}), _req({key: 0})]
    assert draft_temperature_caps(reqs, 0.0).tolist() == [0.0, 0.5, math.inf, 0.0]
    assert draft_temperature_caps(reqs, None).tolist() == [math.inf, 0.5, math.inf, 0.0]


@pytest.mark.parametrize("bad", [-1, 1.5, "two", True, float("nan"), None.__class__])
def test_bad_max_verify_is_rejected_with_the_key_named(bad):
    from sglang_dspark.sglang_plugin.request_params import MAX_VERIFY_KEY, validate_max_verify

    with pytest.raises(ValueError, match=MAX_VERIFY_KEY):
        validate_max_verify({MAX_VERIFY_KEY: bad})


def test_verify_caps_per_request():
    from sglang_dspark.sglang_plugin.request_params import MAX_VERIFY_KEY, validate_max_verify, verify_caps

    validate_max_verify({MAX_VERIFY_KEY: 0})
    assert verify_caps([_req(), _req({"x": 1})]) is None
    assert verify_caps([_req(), _req({MAX_VERIFY_KEY: 0}), _req({MAX_VERIFY_KEY: 3})]).tolist() == [-1, 0, 3]
