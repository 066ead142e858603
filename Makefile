# kata-topo: the two commands are `make demo` and `make test` (see README.md).
SHELL := /bin/bash
.DEFAULT_GOAL := help

CARGO ?= cargo
# What building and testing need on Debian bookworm. hwlocality links the system hwloc 2.9
# through `pkg-config --static`, which also wants libudev.
APT_PACKAGES := libhwloc-dev libudev-dev pkg-config hwloc bzip2

.PHONY: help deps build test lint unit bench demo clean

help:
	@echo "make demo   - build and show kata-topo on the bundled scenario"
	@echo "make test   - install what is missing, then lint and run every test"
	@echo "make bench  - criterion benchmarks (not tests)"

# Installs only what is missing, after one apt-get update.
deps:
	@missing=""; for p in $(APT_PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  if [ "$$(id -u)" != 0 ]; then echo "need root to install:$$missing" >&2; exit 1; fi; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; \
	fi

build: deps
	$(CARGO) build --workspace --locked

lint: deps
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets --locked -- -D warnings

unit: deps
	$(CARGO) test --workspace --locked

test: lint unit

bench: deps
	$(CARGO) bench -p kata-topo-core --locked --bench check

demo: build
	@bash scenario/demo.sh

clean:
	$(CARGO) clean
