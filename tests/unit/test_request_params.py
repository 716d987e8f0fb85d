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
