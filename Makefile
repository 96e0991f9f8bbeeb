# gpuguard: make test | make demo | make bench | make lint | make install
PYTHON ?= python3
PREFIX ?= /usr/local

.PHONY: test lint demo bench install uninstall

test:
	$(PYTHON) -m pytest -q tests

lint:
	shellcheck -x bin/* lib/*.sh install.sh .ci/run tests/*.sh tests/bats/*.bats bench/*.sh bench/h200/*.sh

demo:
	bash tests/demo.sh

bench:
	bash bench/run.sh

install:
	./install.sh --prefix "$(PREFIX)"

uninstall:
	./install.sh --prefix "$(PREFIX)" --uninstall

# faults: the long fault-injection run (~770 nvidia-smi fault cycles, 1000 cycles with ~390 kills); the table ends the output
test-faults:
	GG_FAULTS_LONG=1 GG_FAULTS_REPORT=$${GG_FAULTS_REPORT:-/tmp/gpuguard-faults.md} $(PYTHON) -m pytest -q tests/faults
