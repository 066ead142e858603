# kata-topo: the two commands are `make demo` and `make test` (see README.md).
SHELL := /bin/bash
.DEFAULT_GOAL := help

CARGO ?= cargo
# What building and testing need on Debian bookworm. hwlocality links the system hwloc 2.9
# through `pkg-config --static`, which also wants libudev; the integration tests and the demo
# run Debian's containerd 1.6 and runc, build images from busybox-static, build the CRI
# client with protoc, start a real QEMU for the VM view and a real node-exporter for the
# metrics, and check the deployment files (shellcheck, ruby -c, vagrant validate). xz-utils
# unpacks containerd 2.3.4's archive and, with binutils, takes the guest kernel
# cloud-hypervisor boots out of Debian's kernel package; make vm-test boots Debian's kernel in
# QEMU on this host's /usr and /etc, builds its initramfs from busybox-static and writes its
# report with jq. make crio-test runs CRI-O under Debian's conmon.
APT_PACKAGES := libhwloc-dev libudev-dev pkg-config hwloc bzip2 \
	containerd runc busybox-static protobuf-compiler qemu-system-x86 \
	prometheus-node-exporter shellcheck ruby vagrant xz-utils binutils jq openssl iproute2 conmon

# The cloud-hypervisor the VM-view tests run (v51.0, the version Kata 4.1 pins; Debian does not
# package it): a path, or `none` to run the integration tests without those tests, which are
# then reported as not run. Default: shared/vmm/cloud-hypervisor-v51.0 beside the repository
# (beside the main checkout, for a git worktree), when it is there.
GIT_COMMON_DIR := $(shell git rev-parse --path-format=absolute --git-common-dir 2>/dev/null)
KT_CLOUD_HYPERVISOR ?= $(firstword $(wildcard \
	$(CURDIR)/../shared/vmm/cloud-hypervisor-v51.0 \
	$(GIT_COMMON_DIR)/../../shared/vmm/cloud-hypervisor-v51.0))
# The ELF guest kernel cloud-hypervisor boots, extracted from Debian's linux-image-6.1 once.
VMLINUX := target/kata-topo-vmm/vmlinux

# The integration tests run twice: against Debian's containerd 1.6 (on PATH), and against
# upstream containerd 2.3.4 + runc 1.5.1 from this archive (beside the checkout), unpacked
# under target/. CONTAINERD_BIN=DIR runs them (or the demo) against any containerd instead:
# DIR holds containerd, ctr, containerd-shim-runc-v2 (and runc >= 1.2 for containerd 2.x).
CONTAINERD2_ARCHIVE ?= ../shared/containerd/containerd-2.3.4-linux-amd64.tar.xz
CONTAINERD2_BIN := target/containerd-2.3.4/bin
CONTAINERD_BIN ?=
# The VM-view tests take the cloud-hypervisor and the guest kernel from the environment. The
# CRI-O tests (integration/tests/crio.rs, every test named crio_*) are make crio-test's.
ifeq ($(KT_CLOUD_HYPERVISOR),none)
INTEGRATION_TEST = $(CARGO) test -p kata-topo-integration --locked -- --test-threads=1 \
	--skip crio_ --skip cloud_hypervisor
else
INTEGRATION_TEST = KT_CLOUD_HYPERVISOR=$(abspath $(KT_CLOUD_HYPERVISOR)) KT_VMLINUX=$(CURDIR)/$(VMLINUX) \
	$(CARGO) test -p kata-topo-integration --locked -- --test-threads=1 --skip crio_
endif

# make install: PREFIX, DESTDIR as usual; PROFILE=debug installs the debug build.
PREFIX ?= /usr/local
DESTDIR ?=
PROFILE ?= release
KATA_CONFIG_DIR ?= /opt/kata/share/defaults/kata-containers
BINARIES := containerd-shim-kata-topo-v2 kata-topo kata-topo-hook kata-topo-device-plugin kata-topo-nri
SHARE_DIR := $(PREFIX)/share/kata-topo

.PHONY: help deps check build build-all build-release test lint alerts-test unit integration vm-test k8s k8s-test k8s-record k8s-up k8s-down k8s-run \
	crio crio-test \
	kata kata-test \
	installer-image \
	promtool bench soak fuzz \
	demo demo-cli demo-containerd2 containerd2 bootstrap-fixtures install uninstall vagrant-test \
	clean vmlinux

# Prerequisites run in the order written: `deps` first, where a target names it.
.NOTPARALLEL:

# When this make started (make test's last line counts from it).
MAKE_START := $(shell date +%s)
# `$(TIMED) timed LABEL 'COMMAND'` runs COMMAND (a shell string), then prints
# "== LABEL took N s" and returns COMMAND's status.
TIMED := timed() { local label=$$1 start rc; start=$$(date +%s); eval "$$2"; rc=$$?; \
	echo "== $$label took $$(( $$(date +%s) - start )) s"; return $$rc; };

help:
	@echo "make demo   - build and show kata-topo on the bundled scenario"
	@echo "make test   - install what is missing, then lint and run every test"
	@echo "make check  - the fast loop: fmt, clippy, the unit tests (no KVM, no apt, no containerd)"
	@echo "              (integration: containerd 1.6, then 2.3.4 from $(CONTAINERD2_ARCHIVE))"
	@echo "make integration CONTAINERD_BIN=DIR - the integration tests against another containerd"
	@echo "make demo CONTAINERD_BIN=DIR / make demo-containerd2 - the demo on another containerd"
	@echo "make bench  - benchmarks (not tests)"
	@echo "make soak   - 10,000 updates through the wrapper: RSS, threads and fds before and after"
	@echo "make fuzz   - the property tests with FUZZ_CASES (default 100000) cases each"
	@echo "make install [PREFIX=/usr/local] [DESTDIR=] / make uninstall"
	@echo "make installer-image - the DaemonSet installer's image (deploy/installer/), to import on each node"
	@echo "make vm-test - the scenario in a QEMU guest with two NUMA nodes and a VFIO NIC (in make test)"
	@echo "make k8s    - kubelet, kube-apiserver, kubectl and etcd from the Go module proxy (cached)"
	@echo "make crio   - CRI-O 1.34 (crio, copyimg, pinns) from the Go module proxy (cached); its directory last"
	@echo "make crio-test - kata-topo-nri on a real CRI-O 1.34 with NRI on (not in make test)"
	@echo "make promtool - Prometheus's promtool out of Debian's prometheus package (cached)"
	@echo "make alerts-test - the alert rules (promtool) and the dashboard against the metrics (in make test)"
	@echo "make k8s-test [STEPS=story,...] - a real two-node cluster: every update from the kubelet (in make test)"
	@echo "make k8s-up / make k8s-down - the k8s-test cluster kept up for kubectl (the kubeconfig's path printed)"
	@echo "make k8s-run STEPS=story,... - k8s-test's stories run on the cluster of make k8s-up"
	@echo "make k8s-record - the real kubelet's PodResources answers under every Topology Manager policy and scope, kept as test fixtures"
	@echo "make kata-test - real Kata (shim and agent) behind the wrapper, through Kata's remote hypervisor, in the vm-test guest (in make test)"
	@echo "make vagrant-test - the end-to-end scenario on real Kata in a Vagrant VM"

# Installs only what is missing, after one apt-get update; the only target that installs
# packages. The entry points (test, demo, bench, soak, fuzz, demo-cli, install, integration,
# vm-test, k8s-test, alerts-test, crio-test) run it first, the targets they are made of do
# not, and `make check` never does.
deps:
	@missing=""; for p in $(APT_PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  if [ "$$(id -u)" != 0 ]; then echo "need root to install:$$missing" >&2; exit 1; fi; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; \
	fi

build:
	$(CARGO) build --workspace --locked

lint:
	@$(TIMED) timed "lint" '$(CARGO) fmt --all -- --check && $(CARGO) clippy --workspace --all-targets --locked -- -D warnings'

build-all:
	@$(TIMED) timed "build" '$(CARGO) build --workspace --locked --bins'

# Property tests (proptest) run TEST_CASES cases each here, FUZZ_CASES in `make fuzz`.
TEST_CASES ?= 256
FUZZ_CASES ?= 100000
# The unit tests build directory trees (a sysfs tree per case of the sysfs property test,
# hwloc's snapshots unpacked by the topology cache's tests): a tmpfs keeps that fast — on a
# busy disk unpacking one snapshot takes seconds, on a tmpfs a fifth of one.
TEST_TMPDIR ?= $(if $(wildcard /dev/shm/.),/dev/shm,/tmp)
FUZZ_TMPDIR ?= $(TEST_TMPDIR)

unit:
	@$(TIMED) timed "unit" 'PROPTEST_CASES=$(TEST_CASES) TMPDIR=$(TEST_TMPDIR) $(CARGO) test --workspace --locked \
	  --exclude kata-topo-integration'

# The fast loop while changing the code: formatting, clippy and the unit tests. Needs no KVM,
# no containerd and no package installed beyond what building needs; never runs apt.
check:
	@$(TIMED) timed "make check" '$(MAKE) --no-print-directory lint unit'

# The unit tests again, release-built, with many more cases for every property test.
fuzz: deps
	PROPTEST_CASES=$(FUZZ_CASES) TMPDIR=$(FUZZ_TMPDIR) $(CARGO) test --workspace --locked \
	  --exclude kata-topo-integration --release --lib --bins

# Root, a real containerd per test; one test at a time so leak checks see only their own.
# Each leg prints how long it took. Without a cloud-hypervisor binary this stops and says how
# to give one; with KT_CLOUD_HYPERVISOR=none it runs everything else and names the test it did
# not run.
integration: deps build-all $(if $(filter-out none,$(KT_CLOUD_HYPERVISOR)),vmlinux)
ifeq ($(KT_CLOUD_HYPERVISOR),)
	@echo "no cloud-hypervisor for the VM-view tests: set KT_CLOUD_HYPERVISOR=/path/to/cloud-hypervisor" \
	  "(v51.0), or KT_CLOUD_HYPERVISOR=none to run the integration tests without them" >&2; exit 1
endif
ifeq ($(strip $(CONTAINERD_BIN)),)
	@echo "== integration leg 1: Debian's $$(containerd --version | cut -d' ' -f2-3)"
	@# The NRI plugin's tests (integration/tests/nri.rs) need containerd 2.x in both legs.
	@if [ -f "$(CONTAINERD2_ARCHIVE)" ]; then $(MAKE) --no-print-directory containerd2; fi
	@$(TIMED) timed "integration leg 1 (containerd 1.6)" 'env -u KT_CONTAINERD_BIN $(INTEGRATION_TEST)'
	@$(TIMED) if [ -f "$(CONTAINERD2_ARCHIVE)" ]; then \
	  $(MAKE) --no-print-directory containerd2 && \
	  echo "== integration leg 2: $$($(CONTAINERD2_BIN)/containerd --version | cut -d' ' -f2-3), $$($(CONTAINERD2_BIN)/runc --version | head -n 1)" && \
	  timed "integration leg 2 (containerd 2.3.4)" 'KT_CONTAINERD_BIN=$(CURDIR)/$(CONTAINERD2_BIN) $(INTEGRATION_TEST)'; \
	else \
	  echo "**********************************************************************************"; \
	  echo "** SKIPPED: integration leg 2 (containerd 2.3.4 + runc 1.5.1): no archive at"; \
	  echo "**   $(CONTAINERD2_ARCHIVE)"; \
	  echo "** Only containerd 1.6 was tested. Set CONTAINERD2_ARCHIVE=FILE to run it."; \
	  echo "**********************************************************************************"; \
	fi
else
	@echo "== integration against $(CONTAINERD_BIN): $$($(CONTAINERD_BIN)/containerd --version | cut -d' ' -f2-3)"
	@$(TIMED) timed "integration against $(CONTAINERD_BIN)" 'KT_CONTAINERD_BIN=$(abspath $(CONTAINERD_BIN)) $(INTEGRATION_TEST)'
endif
ifeq ($(KT_CLOUD_HYPERVISOR),none)
	@echo "NOT RUN: vm::cloud_hypervisor (KT_CLOUD_HYPERVISOR=none: no cloud-hypervisor binary given)"
endif
	@echo "NOT RUN: the CRI-O tests (integration/tests/crio.rs: make crio-test runs them)"

# containerd 2.3.4 + runc 1.5.1, unpacked from the archive under target/.
containerd2: $(CONTAINERD2_BIN)/containerd

$(CONTAINERD2_BIN)/containerd: $(CONTAINERD2_ARCHIVE)
	@mkdir -p target
	tar -xJf "$(CONTAINERD2_ARCHIVE)" -C target/
	@touch "$@"

# Records what each containerd writes to a shim's `start` and reads back, into the fixtures
# the start handshake's unit tests decode (proto/tests/fixtures/bootstrap/).
bootstrap-fixtures: build-all containerd2
	KT_WRITE_FIXTURES=$(CURDIR)/proto/tests/fixtures/bootstrap env -u KT_CONTAINERD_BIN \
	  $(CARGO) test -p kata-topo-integration --locked --test bootstrap start_input -- --test-threads=1
	KT_WRITE_FIXTURES=$(CURDIR)/proto/tests/fixtures/bootstrap KT_CONTAINERD_BIN=$(CURDIR)/$(CONTAINERD2_BIN) \
	  $(CARGO) test -p kata-topo-integration --locked --test bootstrap start_input -- --test-threads=1

# Downloads Debian's linux-image-6.1 package (apt) once and keeps its ELF vmlinux in target/.
vmlinux: $(VMLINUX)
$(VMLINUX): integration/guest-kernel.sh
	bash integration/guest-kernel.sh $@

# A QEMU guest with two NUMA nodes, a vIOMMU and a NIC bound to vfio-pci: containerd, the
# wrapper on the live topology, the Vagrant scenario. Report: target/vm-test/report.json.
vm-test: deps build-all
	@$(TIMED) timed "vm-test" 'bash integration/vm-test/run.sh'

# Kubernetes from source (k8s/): kubelet, kube-apiserver, kube-scheduler,
# kube-controller-manager and kubectl at the version k8s/go.mod pins, the CNI plugins bridge,
# host-local, loopback and portmap at the version k8s/cni/go.mod pins, and a one-member etcd,
# built with the local Go toolchain into a cache outside the tree (KT_K8S_CACHE, default
# ~/.cache/kata-topo/k8s); a second run builds nothing.
k8s:
	@$(TIMED) timed "make k8s" 'bash k8s/build.sh > /dev/null'

# CRI-O (crio/): crio, its image copier copyimg and pinns at the github.com/cri-o/cri-o
# version crio/go.mod pins, built like make k8s from the Go module proxy with the local Go
# toolchain into a cache outside the tree (KT_CRIO_CACHE, default ~/.cache/kata-topo/crio).
# Prints the binaries' directory on its last line.
crio:
	@bash crio/build.sh

# kata-topo-nri on CRI-O 1.34 with NRI on (integration/tests/crio.rs): a private CRI-O, its
# runc handler on runc 1.5.1 (containerd 2.3.4's archive) under Debian's conmon, the NRI
# story of tests/nri.rs. Not in make test (docs/nri.md: why).
crio-test: deps build-all containerd2
	@$(TIMED) out=$$(bash crio/build.sh) && bins=$$(tail -n 1 <<< "$$out") && \
	  echo "== crio-test: $$($$bins/crio --version | head -n 1), $$($(CONTAINERD2_BIN)/runc --version | head -n 1), $$(conmon --version | head -n 1)" && \
	  timed "crio-test" "KT_CRIO_BIN=$$bins KT_CRIO_RUNC=$(CURDIR)/$(CONTAINERD2_BIN)/runc \
	    $(CARGO) test -p kata-topo-integration --locked --test crio -- --test-threads=1 --nocapture"

# promtool out of Debian's prometheus package (tools/promtool.sh: why not built from source),
# cached in target/promtool/.
promtool:
	@$(TIMED) timed "make promtool" 'bash tools/promtool.sh > /dev/null'

# The alerts and the dashboard (deploy/prometheus/, deploy/grafana/): promtool check rules on
# every rules file, promtool test rules, the PrometheusRule against the plain file, and every
# queried metric against what the metrics code writes. Fails when there is no promtool.
alerts-test: deps
	@$(TIMED) out=$$(bash tools/promtool.sh) && \
	  timed "alerts-test" 'KT_PROMTOOL=$$(tail -n 1 <<< "$$out") $(CARGO) test -p kata-topo-integration --locked --test alerts'

# The vm-test guest made a Kubernetes node: the kubelet of make k8s, the device plugin,
# containerd with the wrapper and the CNI bridge; etcd, kube-apiserver, kube-scheduler and
# kube-controller-manager on this host. Two legs: Debian's
# containerd 1.6 (report target/k8s-test/report.json), then containerd 2.3.4 with runc 1.5.1
# from its archive (target/k8s-test-containerd2/report.json); the last line counts both.
# Which stories each leg runs (docs/kubernetes.md: why): core and the node-affinity stories
# on the 1.6 leg; the installer, the seed and NRI on the 2.3.4 leg, whose node B runs
# containerd 1.6 (both configuration formats in one run). STEPS=... runs the stories named (or
# those holding the steps named) on both legs: STEPS=core runs core on 2.3.4 too.
K8S_TEST_STORIES_1 ?= core affinity
K8S_TEST_STORIES_2 ?= installer seed nri
k8s-test: deps build-all k8s $(if $(wildcard $(CONTAINERD2_ARCHIVE)),containerd2)
	@$(TIMED) start=$$(date +%s); bins=$$(bash k8s/build.sh 2> /dev/null | tail -n 1); rc=0; passed=0; total=0; \
	legs="k8s-test:"; [ -x $(CONTAINERD2_BIN)/containerd ] && legs="$$legs k8s-test-containerd2:$(CONTAINERD2_BIN)"; \
	for leg in $$legs; do \
	  name=$${leg%%:*}; cbin=$${leg#*:}; \
	  steps='$(or $(STEPS),$(K8S_TEST_STORIES_1))'; [ -z "$$cbin" ] || steps='$(or $(STEPS),$(K8S_TEST_STORIES_2))'; \
	  timed "$$name" "KT_K8S_BIN=$$bins KT_K8S_CONTAINERD_BIN=$$cbin KT_VM_OUT=$$name KT_VM_TIMEOUT=$${KT_VM_TIMEOUT:-2400} \
	    KT_K8S_STEPS='$$steps' bash integration/vm-test/run.sh k8s-test" || rc=1; \
	  passed=$$(( passed + $$(jq -r '.passed // 0' target/$$name/report.json 2> /dev/null || echo 0) )); \
	  total=$$(( total + $$(jq -r '.total // 0' target/$$name/report.json 2> /dev/null || echo 0) )); \
	done; \
	[ -x $(CONTAINERD2_BIN)/containerd ] || echo "NOT RUN: k8s-test with containerd 2.3.4 (no archive at $(CONTAINERD2_ARCHIVE))"; \
	echo "== make k8s-test took $$(( $$(date +%s) - start )) s"; \
	echo "k8s-test: $$passed/$$total steps pass"; [ $$rc = 0 ] && [ $$passed = $$total ] && [ $$total -gt 0 ]

# The k8s-test cluster kept up for a person with kubectl (the story `hold`): both nodes, the
# control plane on this host, until make k8s-down or K8S_UP_SECONDS (default 4 hours). Debian's
# containerd 1.6 on node A unless K8S_UP_CONTAINERD=2 (containerd 2.3.4).
K8S_UP := target/k8s-up
k8s-up: deps build-all k8s $(if $(filter 2,$(K8S_UP_CONTAINERD)),containerd2)
	@bins=$$(bash k8s/build.sh 2> /dev/null | tail -n 1); \
	if [ -f $(K8S_UP).pid ] && kill -0 "$$(cat $(K8S_UP).pid)" 2> /dev/null; then echo "k8s-up: already up (make k8s-down first)" >&2; exit 1; fi; \
	rm -rf $(K8S_UP); mkdir -p $(K8S_UP); \
	KT_K8S_BIN=$$bins KT_K8S_CONTAINERD_BIN=$(if $(filter 2,$(K8S_UP_CONTAINERD)),$(CONTAINERD2_BIN)) KT_VM_OUT=k8s-up \
	  KT_VM_TIMEOUT=$${K8S_UP_SECONDS:-14400} KT_K8S_STEPS=hold \
	  setsid bash integration/vm-test/run.sh k8s-test < /dev/null > $(K8S_UP).log 2>&1 & echo $$! > $(K8S_UP).pid; \
	for _ in $$(seq 1 900); do \
	  [ -e $(K8S_UP)/guest/k8s/held ] && break; \
	  kill -0 "$$(cat $(K8S_UP).pid)" 2> /dev/null || { tail -n 20 $(K8S_UP).log >&2; echo "k8s-up: the cluster did not come up" >&2; exit 1; }; \
	  sleep 2; \
	done; \
	[ -e $(K8S_UP)/guest/k8s/held ] || { echo "k8s-up: not up after 30 minutes" >&2; exit 1; }; \
	echo "k8s-up: kubeconfig $(CURDIR)/$(K8S_UP)/control/admin.kubeconfig"; \
	echo "  $$bins/kubectl --kubeconfig $(CURDIR)/$(K8S_UP)/control/admin.kubeconfig get nodes"; \
	"$$bins/kubectl" --kubeconfig $(K8S_UP)/control/admin.kubeconfig get nodes -o wide

# k8s-test's stories (STEPS=..., by story or step) run on the cluster make k8s-up keeps, each
# with its own set-up and teardown, then cleanup (which deletes the default namespace's pods).
# The nri story needs K8S_UP_CONTAINERD=2.
k8s-run:
	@bash integration/k8s-test/k8s-run.sh $(K8S_UP) '$(STEPS)'

k8s-down:
	@[ -f $(K8S_UP).pid ] || { echo "k8s-down: nothing is up"; exit 0; }; \
	pid=$$(cat $(K8S_UP).pid); touch $(K8S_UP)/guest/k8s/release 2> /dev/null || true; \
	for _ in $$(seq 1 300); do kill -0 "$$pid" 2> /dev/null || break; sleep 1; done; \
	if kill -0 "$$pid" 2> /dev/null; then kill -TERM -- "-$$pid" 2> /dev/null || true; sleep 5; fi; \
	rm -f $(K8S_UP).pid; tail -n 3 $(K8S_UP).log

# Kata Containers 4.1 (beside the checkout: its shim, agent and configuration-remote.toml, built
# from Kata's sources; see the README there), unpacked under target/kata/ and checked against
# integration/kata-test/kata.sha256.
KATA_ARTIFACTS ?= ../shared/kata
KATA_DIR := target/kata
kata: $(KATA_DIR)/.checked

$(KATA_DIR)/.checked: integration/kata-test/kata.sha256 $(KATA_ARTIFACTS)/containerd-shim-kata-v2.xz \
		$(KATA_ARTIFACTS)/kata-agent.xz $(KATA_ARTIFACTS)/configuration-remote.toml
	@mkdir -p $(KATA_DIR)
	for f in containerd-shim-kata-v2 kata-agent; do \
	  xz -dc $(KATA_ARTIFACTS)/$$f.xz > $(KATA_DIR)/$$f.tmp && chmod 0755 $(KATA_DIR)/$$f.tmp && \
	  mv $(KATA_DIR)/$$f.tmp $(KATA_DIR)/$$f || exit 1; \
	done
	install -m 0644 $(KATA_ARTIFACTS)/configuration-remote.toml $(KATA_DIR)/configuration-remote.toml
	cd $(KATA_DIR) && sha256sum --quiet -c $(CURDIR)/integration/kata-test/kata.sha256
	@touch $@

# Real Kata behind the wrapper (integration/kata-test/): containerd on this host, the wrapper
# delegating to containerd-shim-kata-v2 with configuration-remote.toml, Kata's remote
# hypervisor served by kata-topo-remote-hypervisor, which boots the vm-test guest for each pod
# with the real kata-agent inside; every step through CRI. Two legs, as make k8s-test: Debian's
# containerd 1.6 (target/kata-test/report.json), then 2.3.4 (target/kata-test-containerd2/);
# each within KT_VM_TIMEOUT (default 540 s). The last lines name what was not run and count both.
kata-test: deps build-all kata $(if $(wildcard $(CONTAINERD2_ARCHIVE)),containerd2)
	@$(TIMED) start=$$(date +%s); rc=0; passed=0; total=0; \
	legs="kata-test:"; [ -x $(CONTAINERD2_BIN)/containerd ] && legs="$$legs kata-test-containerd2:$(CURDIR)/$(CONTAINERD2_BIN)"; \
	for leg in $$legs; do \
	  name=$${leg%%:*}; cbin=$${leg#*:}; \
	  timed "$$name" "KT_KATA_CONTAINERD_BIN=$$cbin KT_VM_OUT=$$name KT_VM_TIMEOUT=$${KT_VM_TIMEOUT:-540} \
	    bash integration/vm-test/run.sh kata-test" || rc=1; \
	  jq -r '.not_run[]? | "NOT RUN: \(.name) (\(.reason))"' target/$$name/report.json 2> /dev/null; \
	  passed=$$(( passed + $$(jq -r '.passed // 0' target/$$name/report.json 2> /dev/null || echo 0) )); \
	  total=$$(( total + $$(jq -r '.total // 0' target/$$name/report.json 2> /dev/null || echo 0) )); \
	done; \
	[ -x $(CONTAINERD2_BIN)/containerd ] || echo "NOT RUN: kata-test with containerd 2.3.4 (no archive at $(CONTAINERD2_ARCHIVE))"; \
	echo "== make kata-test took $$(( $$(date +%s) - start )) s"; \
	echo "kata-test: $$passed/$$total steps pass"; [ $$rc = 0 ] && [ $$passed = $$total ] && [ $$total -gt 0 ]

# The real kubelet's PodResources answers under every Topology Manager policy and scope, with
# and without a device (integration/k8s-record/guest.sh), copied into
# core/tests/fixtures/pod-resources/kubelet-VERSION/ for the unit tests. Not in make test: it
# checks nothing, it records; run it after moving to another Kubernetes release.
K8S_RECORDINGS = core/tests/fixtures/pod-resources
k8s-record: deps build-all k8s
	@$(TIMED) bins=$$(bash k8s/build.sh 2> /dev/null | tail -n 1); \
	timed "k8s-record" "KT_K8S_BIN=$$bins KT_VM_TIMEOUT=$${KT_VM_TIMEOUT:-1500} bash integration/vm-test/run.sh k8s-record" || exit 1; \
	v=$$(sed -n 's/^Kubernetes //p' target/k8s-record/guest/recordings/kubelet.version); \
	[ -n "$$v" ] || { echo "k8s-record: no kubelet version recorded" >&2; exit 1; }; \
	rm -rf $(K8S_RECORDINGS)/kubelet-$$v; mkdir -p $(K8S_RECORDINGS)/kubelet-$$v; \
	cp target/k8s-record/guest/recordings/*.json target/k8s-record/guest/recordings/*.yaml \
	  target/k8s-record/guest/recordings/topology.xml $(K8S_RECORDINGS)/kubelet-$$v/; \
	echo "k8s-record: $$(ls $(K8S_RECORDINGS)/kubelet-$$v | wc -l) files in $(K8S_RECORDINGS)/kubelet-$$v"

# deps once, then each leg in this order.
# Each phase prints its time (`== PHASE took N s`); the last line the whole run's.
test: deps lint alerts-test unit integration vm-test k8s-test kata-test
	@echo "== make test took $$(( $$(date +%s) - $(MAKE_START) )) s"

# The wrapper benchmark runs once per containerd the integration tests use: Debian's, then
# containerd 2.3.4 from its archive (when it is there), then each directory of
# BENCH_CONTAINERD_BINS (containerd, ctr, containerd-shim-runc-v2 and runc inside).
# KT_BENCH_ROUNDS, KT_BENCH_CRI_ROUNDS, KT_BENCH_STATE_CALLS and KT_BENCH_COLD=1 tune it.
# Then the node-scale section once, on Debian's containerd: KT_BENCH_PODS pods per handler
# (default 100; KT_BENCH_PODS=20 for a quick check), KT_BENCH_PARALLEL at a time (10),
# KT_BENCH_IDLE_SECONDS of idle measured (60). Then kata-topo-nri on containerd 2.3.4:
# KT_BENCH_NRI_UPDATES updates through the plugin (1000); KT_BENCH_NRI_START=0 leaves out the
# start ratio, for the plugin's memory alone. Before all of it, the heap the plugin's front
# end holds per pod (KT_BENCH_HEAP_PODS, 100), by a counting allocator.
BENCH_CONTAINERD_BINS ?= $(if $(wildcard $(CONTAINERD2_ARCHIVE)),$(CONTAINERD2_BIN))
bench: deps $(if $(BENCH_CONTAINERD_BINS),containerd2)
	$(CARGO) bench -p kata-topo-core --locked --bench check
	$(CARGO) bench -p kata-topo-nri --locked --bench heap
	$(CARGO) build --release --workspace --locked --bins
	env -u KT_CONTAINERD_BIN KATA_TOPO_BIN_DIR=$(CURDIR)/target/release \
	  $(CARGO) bench -p kata-topo-integration --locked --bench shim
	@for d in $(BENCH_CONTAINERD_BINS); do \
	  KT_CONTAINERD_BIN=$$(realpath "$$d") KATA_TOPO_BIN_DIR=$(CURDIR)/target/release \
	    $(CARGO) bench -p kata-topo-integration --locked --bench shim || exit 1; \
	done
	env -u KT_CONTAINERD_BIN KATA_TOPO_BIN_DIR=$(CURDIR)/target/release \
	  $(CARGO) bench -p kata-topo-integration --locked --bench node
	@if [ -x $(CONTAINERD2_BIN)/containerd ]; then \
	  KT_CONTAINERD_BIN=$(CURDIR)/$(CONTAINERD2_BIN) KATA_TOPO_BIN_DIR=$(CURDIR)/target/release \
	    $(CARGO) bench -p kata-topo-integration --locked --bench nri; \
	else echo "NOT RUN: the NRI plugin's bench (needs containerd 2.x: $(CONTAINERD2_ARCHIVE))"; fi

demo: deps build-all
ifeq ($(strip $(CONTAINERD_BIN)),)
	@env -u KT_CONTAINERD_BIN $(CARGO) run -q -p kata-topo-demo --locked
else
	@KT_CONTAINERD_BIN=$(abspath $(CONTAINERD_BIN)) $(CARGO) run -q -p kata-topo-demo --locked
endif

# The same demo on containerd 2.3.4 + runc 1.5.1 from the archive.
demo-containerd2: containerd2
	@$(MAKE) --no-print-directory demo CONTAINERD_BIN=$(CONTAINERD2_BIN)

# Many updates through the wrapper in parallel; prints the daemons' RSS, threads and fds after
# a warm-up and at the end, and what the sinks dropped (SOAK_PODS, SOAK_UPDATES per pod).
soak: deps build-release
	KATA_TOPO_BIN_DIR=$(CURDIR)/target/release $(CARGO) bench -p kata-topo-integration --locked --bench soak

# The CLI alone on the bundled scenario (no containerd needed).
demo-cli: deps build
	@bash scenario/demo.sh

build-release:
	$(CARGO) build --release --workspace --locked --bins

# Binaries where containerd finds the shim (its PATH), the Kata configuration where Kata's
# configurations live, and the deploy/ files under $(SHARE_DIR).
install: $(if $(filter release,$(PROFILE)),deps build-release)
	install -d $(DESTDIR)$(PREFIX)/bin
	for b in $(BINARIES); do install -m 0755 target/$(PROFILE)/$$b $(DESTDIR)$(PREFIX)/bin/$$b; done
	install -d $(DESTDIR)$(KATA_CONFIG_DIR)
	install -m 0644 configuration-kata.toml $(DESTDIR)$(KATA_CONFIG_DIR)/configuration-kata-topo.toml
	cd deploy && find . -type f | while read -r f; do \
	  install -D -m 0644 "$$f" "$(DESTDIR)$(SHARE_DIR)/$${f#./}"; done
	@echo "installed; next: merge $(SHARE_DIR)/containerd/kata-topo-config-v2.toml (or -v3) into containerd's config"

uninstall:
	for b in $(BINARIES); do rm -f $(DESTDIR)$(PREFIX)/bin/$$b; done
	rm -f $(DESTDIR)$(KATA_CONFIG_DIR)/configuration-kata-topo.toml
	rm -rf $(DESTDIR)$(SHARE_DIR)
	-rmdir -p --ignore-fail-on-non-empty $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(KATA_CONFIG_DIR) \
	  $(dir $(DESTDIR)$(SHARE_DIR)) 2>/dev/null

# The installer's image (deploy/installer/, docs/installer.md): kata-topo-installer and the
# release binaries, stripped, with the libraries they link (no shell, no kubectl), as
# target/kata-topo-images/installer-$(INSTALLER_VERSION).tar
# (localhost/kata-topo/installer:$(INSTALLER_VERSION)), for `ctr -n k8s.io images import` on
# each node. The version is the workspace's unless given.
INSTALLER_VERSION ?= $(shell sed -n 's/^version = "\(.*\)"$$/\1/p' Cargo.toml | head -n 1)
installer-image: deps build-release
	bash integration/images/build.sh --installer $(INSTALLER_VERSION) target/release target/kata-topo-images

# The end-to-end environment with real Kata (needs Vagrant with libvirt or VirtualBox and
# nested virtualisation; see vagrant/Vagrantfile).
vagrant-test:
	cd vagrant && vagrant up && vagrant provision --provision-with test

clean:
	$(CARGO) clean
