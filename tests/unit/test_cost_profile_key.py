"""The cost-model cache key names the CPU: a model profiled on one CPU type must not price another."""

import torch

from sglang_dspark.sglang_plugin import cost_profile


def test_cpu_key_names_the_cpu_and_its_vector_isa():
    key = cost_profile.cost_key("some/model", "torch.bfloat16", "cpu")
    assert key["cpu"] == cost_profile.cpu_identity()
    assert torch.backends.cpu.get_cpu_capability() in key["cpu"]
    assert "cpu" not in cost_profile.cost_key("some/model", "torch.bfloat16", "cuda")


def test_another_cpu_gets_another_cache_file(monkeypatch):
    here = cost_profile.cache_path(cost_profile.cost_key("some/model", "torch.bfloat16", "cpu"))
    assert here == cost_profile.cache_path(cost_profile.cost_key("some/model", "torch.bfloat16", "cpu"))
    monkeypatch.setattr(cost_profile, "cpu_identity", lambda: "AMD EPYC; AVX2; 2 cpus")
    amd = cost_profile.cache_path(cost_profile.cost_key("some/model", "torch.bfloat16", "cpu"))
    monkeypatch.setattr(cost_profile, "cpu_identity", lambda: "Intel Xeon; AVX512; 2 cpus")
    intel = cost_profile.cache_path(cost_profile.cost_key("some/model", "torch.bfloat16", "cpu"))
    assert amd != intel
