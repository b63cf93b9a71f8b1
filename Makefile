# zygote: copy-on-write microVM sandboxes for AI agents.
#   make demo   install what is missing, build everything (incl. guest kernel/rootfs), run the demo
#   make test   install, build, lint and run every test suite (incl. the nested lane's smoke part
#               and the Kubernetes suite)
#   make test-kvm-nested   the whole nested lane: the kvm runtime's Linux path under emulated SVM
#   make test-k8s   zygote on Kubernetes: real etcd + kube-apiserver on loopback, controller, 3 nodes
SHELL := /bin/bash
CARGO ?= cargo
ZYGOTE := target/release/zygote
PROBE_ELF := guest/probe/target/x86_64-unknown-none/release/zygote-probe
# `== [phase HH:MM:SS EPOCH] NAME` at the start of each long step: CI logs show where the
# time goes, and scripts/fresh-check.sh sums them per phase.
PHASE = @printf '== [phase %s %s] %s\n' "$$(date +%T)" "$$(date +%s)"

.PHONY: all setup build probe agent console guest lint test test-rust test-api test-sdk test-e2b test-fuzz demo clean \
	test-console \
	test-cold-path fresh-check \
	test-kvm-nested test-kvm-nested-smoke bench-nested \
	test-k8s bench-k8s k8s-generate

all: build

setup:
	$(PHASE) setup
	@bash scripts/setup.sh

probe:
	$(PHASE) probe
	@bash guest/probe/build.sh >/dev/null

agent:
	$(PHASE) agent
	$(CARGO) build --release -p zygote-agent --target x86_64-unknown-linux-musl

# The web console (console/: TypeScript, esbuild) into console/dist, which the daemon
# embeds at /ui: built before cargo so the daemon carries it.
console: setup
	$(PHASE) console
	@bash scripts/console-build.sh

build: setup probe agent console
	$(PHASE) build
	$(CARGO) build --release --workspace
	@install -m 0755 $(PROBE_ELF) target/release/zygote-probe

# Guest kernel and the minimal rootfs, cached under ~/.cache/zygote keyed by their inputs.
guest: build
	$(PHASE) guest
	$(ZYGOTE) image build minimal

lint: setup
	$(PHASE) lint
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

test-rust: build guest
	$(PHASE) test-rust
	$(CARGO) test --release --workspace --no-fail-fast

# Schemathesis against a live zygoted on loopback, no guest: status codes, response schemas
# and content types as the OpenAPI document says, no 5xx (skips, saying why, without QEMU or PyPI).
test-api: build
	$(PHASE) test-api
	bash scripts/api-conformance.sh

# The web console in Debian's chromium (headless, playwright-core) against a private
# zygoted on the qemu runtime, plus its node unit tests; screenshots in
# target/console-artifacts/ (skips the browser part, saying why, without qemu or chromium).
# ~15 s on the 2-core development machine (QEMU TCG), so it is part of `make test`.
test-console: build guest
	$(PHASE) test-console
	bash scripts/console-test.sh

# Python and TypeScript SDKs (and the MCP server) against a live zygoted.
test-sdk: build guest
	$(PHASE) test-sdk
	bash scripts/sdk-test.sh

# E2B's unchanged SDKs (Python e2b==2.63.0, npm e2b@2.51.0) against a live zygoted on the qemu
# runtime, sandboxes from the `base` template (issue 35; built on first run, ~5 min cold).
test-e2b: build guest
	$(PHASE) test-e2b
	bash scripts/e2b-test.sh

# Bounded fuzzing of what zygote reads from hostile sources (virtio descriptor chains,
# agent frames, image layers, snapshot packs): libFuzzer via cargo-fuzz when it installs,
# else the seeded randomized tests of the same targets (20 s per target).
test-fuzz: setup
	$(PHASE) test-fuzz
	ZYGOTE_SETUP_FUZZ=1 bash scripts/setup.sh
	bash scripts/fuzz.sh 20

# The nested lane (guest/nested/README.md): zygote's own VMM running Linux guests inside an
# L1 Linux whose kvm_amd runs under QEMU TCG with SVM exposed. The smoke part is in `make test`.
test-kvm-nested: build guest
	python3 scripts/nested-lane.py --lane full

test-kvm-nested-smoke: build guest
	$(PHASE) nested-smoke
	python3 scripts/nested-lane.py --lane smoke

# Inside L1: `zygote bench linux` (branch of a Linux sandbox through the daemon on the kvm
# runtime); the last line printed is its JSON summary. See bench/README.md.
bench-nested: build guest
	python3 scripts/nested-lane.py --lane bench

# zygote on Kubernetes (k8s/README.md): builds kube-apiserver, etcd and kubectl from the Go
# module proxy (cached in ~/.cache/zygote/k8s), the controller and the node agent, then runs
# the unit tests and the e2e suite (3 zygoted on the qemu runtime as 3 nodes).
test-k8s: build guest
	$(PHASE) test-k8s
	bash scripts/k8s-test.sh

# Claim latency, create-to-running via the API server vs the daemon, Lost + refill, memory,
# many Sandboxes over 3 nodes (bench/README.md, issue 23 section).
bench-k8s: build guest
	bash scripts/k8s-bench.sh

# Regenerates the CRDs and deepcopy code from k8s/api with controller-gen.
k8s-generate:
	bash scripts/k8s-generate.sh

# A new user's first commands in an empty HOME (only the guest kernel linked in): a
# directory nobody creates fails here, not on a new machine (scripts/cold-path.sh).
test-cold-path: build guest
	$(PHASE) cold-path
	bash scripts/cold-path.sh

# The README's two commands on a fresh machine: a clean clone, a throw-away HOME with
# nothing cached, `make demo` then `make test`, each phase timed. Not part of `make test`.
fresh-check:
	bash scripts/fresh-check.sh

test: lint test-cold-path test-rust test-api test-console test-fuzz test-sdk test-e2b test-kvm-nested-smoke test-k8s
	$(PHASE) done

demo: build guest
	$(PHASE) demo
	@echo "== zygote doctor"; $(ZYGOTE) doctor || true
	@echo "== probe guest on zygote's KVM VMM (2 vCPUs)"; $(ZYGOTE) probe --vcpus 2 --scenario smp
	@echo "== a real Linux sandbox"; $(ZYGOTE) run --image minimal -- sh -c 'uname -a; echo hello from $$(hostname)'
	@echo "== BRANCH a live VM by fork vs. snapshotting it (probe guest, 256 MiB)"; $(ZYGOTE) bench branch --mem-mib 256 --iterations 3

clean:
	$(CARGO) clean
	rm -rf guest/probe/target
