VENV ?= .venv
PY := $(VENV)/bin/python
export HF_HUB_OFFLINE := 1

.PHONY: setup serve serve-nospec test test-unit test-integration bench-baseline clean-venv

setup:
	bash scripts/setup.sh

serve:
	$(PY) -m sglang_dspark.launch_server $(ARGS)

serve-nospec:
	$(PY) -m sglang_dspark.launch_server --no-dspark $(ARGS)

test:
	$(PY) -m pytest -q -p no:cacheprovider tests $(PYTEST_ARGS)

test-unit:
	$(PY) -m pytest -q -p no:cacheprovider tests/unit $(PYTEST_ARGS)

test-integration:
	$(PY) -m pytest -q -p no:cacheprovider tests/integration $(PYTEST_ARGS)

bench-baseline:
	$(PY) -m sglang_dspark.bench baseline $(ARGS)

clean-venv:
	rm -rf $(VENV)
