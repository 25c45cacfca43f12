# The README's two commands: `make demo` (main job on built-in data) and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: demo test clean

PIP := $(PY) -m pip install --disable-pip-version-check --progress-bar on

$(VENV)/.installed: pyproject.toml
	@echo "== install 1/4: a virtual environment in $(VENV)"
	@test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	@echo "== install 2/4: pip"
	@$(PIP) -q --upgrade pip
	@echo "== install 3/4: torch and torchvision (the largest download: a few minutes the first time)"
	@$(PIP) torch==2.14.1 torchvision==0.29.1
	@echo "== install 4/4: visionpe and its test tools (editable)"
	@PYTHONWARNINGS='ignore:Editable installation:UserWarning' $(PIP) -q -e '.[dev]'  # setuptools' box about editable installs
	@touch $@
	@echo "== installed: $(PY)"

demo: $(VENV)/.installed
	$(PY) examples/demo.py

test: $(VENV)/.installed
	$(PY) -m pytest -q -n 2 tests

clean:
	rm -rf $(VENV) runs
