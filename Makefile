VENV ?= .venv
PY := $(VENV)/bin/python
export HF_HUB_OFFLINE := 1

.PHONY: setup test-deps serve serve-nospec test test-unit test-integration bench-baseline clean-venv

setup:
	bash scripts/setup.sh

serve:
	$(PY) -m sglang_dspark.launch_server $(ARGS)

serve-nospec:
	$(PY) -m sglang_dspark.launch_server --no-dspark $(ARGS)

# Test-only system dependency: a real Prometheus server for the metrics integration test (Debian package).
test-deps:
	bash scripts/install_prometheus.sh

test: test-deps
	$(PY) -m pytest -q -p no:cacheprovider tests $(PYTEST_ARGS)

test-unit:
	$(PY) -m pytest -q -p no:cacheprovider tests/unit $(PYTEST_ARGS)

test-integration: test-deps
	$(PY) -m pytest -q -p no:cacheprovider tests/integration $(PYTEST_ARGS)

bench-baseline:
	$(PY) -m sglang_dspark.bench baseline $(ARGS)

clean-venv:
	rm -rf $(VENV)
