# Chores. Every target but `lint`, `format` and `clean` installs what is missing first.
PYTHON ?= python3
# The torch installed when none is importable: this machine's local CPU build. A torch
# the user already has (any >= 2.1) is kept as it is.
TORCH_PIN ?= torch==2.13.0

.PHONY: install install-torch install-package demo docs native test test-slow test-all test-gpu test-cuda-wheel gpu-check bench lint format clean

# Looks packages up without importing them (importing torch alone takes seconds).
# install-torch: torch, when none is importable. install-package: the package from this
# folder (editable) with its own requirements. install: that, plus the test extras.
install-torch:
	@$(PYTHON) -c "import importlib.util as u; assert u.find_spec('torch')" 2>/dev/null \
		|| $(PYTHON) -m pip install "$(TORCH_PIN)"

install-package: install-torch
	@(cd / && $(PYTHON) -c "import importlib.util as u; \
		assert all(u.find_spec(m) for m in ('pandas', 'tabulate')); \
		assert u.find_spec('gpu_mem_track').origin.startswith('$(CURDIR)/')") 2>/dev/null \
		|| $(PYTHON) -m pip install -e .

install: install-package
	@(cd / && $(PYTHON) -c "import importlib.util as u; \
		assert all(u.find_spec(m) for m in ('pytest', 'ruff', 'matplotlib', \
		'IPython', 'ipykernel', 'nbclient', 'nbformat', 'transformers', 'accelerate', 'lightning'))") \
		2>/dev/null || $(PYTHON) -m pip install -e ".[dev]"

# The demo needs torch and the package only: no test tools, no trainers.
demo: install-package
	$(PYTHON) scripts/tools/vgg_demo.py

# The documentation site (mkdocs.yml, docs/) into site/, strict: a broken link or a marker
# naming no command fails. Installs DOCS_REQUIREMENT (the setup.cfg `docs` extra) when mkdocs
# or its theme is missing; needs no torch (the option tables come from the CLI's parser).
DOCS_REQUIREMENT ?= mkdocs-material>=9.5

docs:
	@$(PYTHON) -c "import mkdocs, material" 2>/dev/null || $(PYTHON) -m pip install "$(DOCS_REQUIREMENT)"
	NO_MKDOCS_2_WARNING=1 $(PYTHON) -m mkdocs build --strict

# The native modules (gpu_mem_track/native), built for the torch installed into the cache
# folder: the census's reader (a census otherwise builds it in the background once it meets
# 20,000 tensors), the runner's line sink (a run otherwise builds it in the background
# and traces through Python; the runs after it use it) and, for a CUDA build of torch, the
# CUDA statistics reader (a run on a GPU otherwise builds it in the background and reads
# torch's dict until it is there).
native: install-package
	$(PYTHON) -m gpu_mem_track.native.build

# The quick suite: tests marked slow (subprocesses that import torch, the VGG demo) are
# left to `make test-all`, which runs everything.
test: install
	$(PYTHON) -m pytest -q -m "not slow"

# Only the slow ones (CI runs `make test` then this: everything, once).
test-slow: install
	$(PYTHON) -m pytest -q -m slow

test-all: install
	$(PYTHON) -m pytest -q

test-gpu: install
	$(PYTHON) -m pytest -q -m cuda -rs

# The check of a machine with a GPU, the fidelity report, within one 10-minute command
# (scripts/gpu/gpu_check.py, default budget 560 s): every workload of its registry simulated and
# run plainly (one table: simulated against real max allocated / reserved, with the error),
# fit's edge claims on the GPU, the runner's cost in rounds (min/median/max of its ratio), the
# quick and the cuda-marked tests; each part in its slot of the budget, the report rewritten
# after every step, in reports/gpu_check/<gpu>/. Installs nothing (that machine may have no
# network): its subprocesses import this checkout. Without a GPU it runs the simulated parts.
# GPU_CHECK_ARGS passes options (--out DIR, --fixtures DIR, --budget S, --rounds N, --dry,
# --only NAMES, --skip NAMES, --archive PATH.tar.gz, --list).
gpu-check:
	$(PYTHON) scripts/gpu/gpu_check.py $(GPU_CHECK_ARGS)

# The quick suite again on the CUDA build of torch (no GPU needed): a Python 3.12 venv with
# CUDA_WHEEL_TORCH, built once in the cache folder (GPU_MEM_TRACK_CACHE, else
# XDG_CACHE_HOME/gpu_mem_track, else ~/.cache/gpu_mem_track; CUDA_WHEEL_VENV names another)
# and reused after (scripts/tools/cuda_wheel_venv.py). The tests import the package from here.
CUDA_WHEEL_TORCH ?= torch==2.13.0

test-cuda-wheel:
	@venv_python="$$($(PYTHON) scripts/tools/cuda_wheel_venv.py --torch '$(CUDA_WHEEL_TORCH)')" \
		&& echo "test-cuda-wheel: $$venv_python" \
		&& PYTHONPATH="$(CURDIR)" "$$venv_python" -m pytest -q -m "not slow"

# The runner benchmark compares with memory_profiler, installed here if missing.
bench: install
	@$(PYTHON) -c "import memory_profiler" 2>/dev/null || $(PYTHON) -m pip install memory_profiler
	$(PYTHON) scripts/bench/bench_census.py
	$(PYTHON) scripts/bench/bench_census.py --tensor-counts 1000,10000,100000,1000000 --repeats 5 \
		--out reports/bench_census_tensors.md
	$(PYTHON) scripts/bench/bench_census_mixes.py
	$(PYTHON) scripts/bench/bench_runner.py
	$(PYTHON) scripts/bench/bench_line.py
	$(PYTHON) scripts/bench/bench_ranks.py
	$(PYTHON) scripts/bench/bench_simulate.py

lint:
	$(PYTHON) -m ruff check setup.py gpu_mem_track tests scripts docs/hooks.py
	$(PYTHON) -m ruff format --check setup.py gpu_mem_track tests scripts docs/hooks.py

format:
	$(PYTHON) -m ruff format setup.py gpu_mem_track tests scripts docs/hooks.py

clean:
	rm -rf build site *.egg-info .pytest_cache
