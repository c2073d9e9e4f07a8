# Two commands on a fresh machine: `make run` and `make test`. Both create .venv on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test bench check fuzz clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/python -m examples.run_demo

test: $(STAMP)
	$(BIN)/python -m pytest -q

bench: $(STAMP)
	$(BIN)/python -m bench

# A longer hypothesis campaign over every parser of hostile input (not part of `make test`):
# reports inputs tried, crashes and hangs; FUZZ_SECONDS sets its length.
FUZZ_SECONDS ?= 600
fuzz: $(STAMP)
	$(BIN)/python -m tests.fuzz --seconds $(FUZZ_SECONDS)

check: $(STAMP)
	$(BIN)/dharma check policies rules
	$(BIN)/dharma test rules

clean:
	rm -rf $(VENV) build *.egg-info
