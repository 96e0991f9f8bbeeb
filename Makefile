# gpuguard: make test | make test-fast | make lint | make demo | make bench | make bench-full | make install
# The test targets set themselves up: the first run creates .venv (git-ignored)
# with $(PYTHON)'s venv module and installs the pinned tools of
# requirements-dev.txt into it; later runs reuse it (.ci/venv).
PYTHON ?= python3
PREFIX ?= /usr/local
# extra pytest arguments, e.g. make test ARGS='-k leak -x'
ARGS ?=

VENV := $(CURDIR)/.venv
# The venv first on PATH: the tests find its bats, shellcheck and shfmt.
WITH_VENV := PATH="$(VENV)/bin:$$PATH"
SHELL_FILES = $(shell grep -ls '^\#!/usr/bin/env bash' bin/* bench/fakebin/*) lib/*.sh install.sh .ci/run .ci/venv \
	$(wildcard tests/*.sh tests/bats/*.bats tests/bats/*/*.bash bench/*.sh bench/h200/*.sh)
# and the test doubles of nvidia-smi and npu-smi, Python scripts without .py
PYTHON_FILES = python tests bench tests/fakebin/nvidia-smi tests/fakebin/npu/npu-smi

# pytest's exit 5 means it collected no test: say so rather than pass quietly.
define pytest
$(WITH_VENV) "$(VENV)/bin/python" -m pytest -q -rfEsxX $(1) $(ARGS); rc=$$?; \
if [ $$rc -eq 5 ]; then echo "make: pytest collected no test (exit 5)" >&2; fi; exit $$rc
endef

.PHONY: test test-fast test-faults lint venv demo bench bench-full install uninstall clean

test: venv
	@$(call pytest,tests)

# The inner loop: no servers, no sleeps over 1 s (tests/conftest.py's SLOW list).
test-fast: venv
	@$(call pytest,-m 'not slow' tests)

lint: venv
	@rc=0; \
	echo "== shellcheck -x"; $(WITH_VENV) shellcheck -x $(SHELL_FILES) || rc=1; \
	echo "== shfmt -i 2 -ci -d"; $(WITH_VENV) shfmt -i 2 -ci -d $(SHELL_FILES) || rc=1; \
	echo "== ruff check $(PYTHON_FILES)"; $(WITH_VENV) ruff check -q $(PYTHON_FILES) || rc=1; \
	exit $$rc

venv:
	@bash .ci/venv "$(PYTHON)"

demo:
	bash tests/demo.sh

# The default figures in a few minutes, with progress on stderr; bench-full
# adds the long runs (leak detector over every trace, 10,000-cycle RSS).
bench:
	bash bench/run.sh

bench-full:
	bash bench/run.sh --full

install:
	./install.sh --prefix "$(PREFIX)"

uninstall:
	./install.sh --prefix "$(PREFIX)" --uninstall

clean:
	rm -rf .venv .pytest_cache .ruff_cache bench/out

# The long fault-injection run (~770 nvidia-smi fault cycles, 1000 cycles
# with ~390 kills); the table ends the output.
test-faults: venv
	@GG_FAULTS_LONG=1 GG_FAULTS_REPORT=$${GG_FAULTS_REPORT:-/tmp/gpuguard-faults.md} $(call pytest,tests/faults)
