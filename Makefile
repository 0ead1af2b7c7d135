# Facet: the two commands a fresh machine needs are `make demo` and `make test`.
SHELL := /bin/bash
GO ?= go
# go-nvml's cgo bindings use NVML calls NVIDIA marked deprecated; the
# warnings are theirs, not ours.
export CGO_CFLAGS ?= -Wno-deprecated-declarations
BIN := $(CURDIR)/bin
RUN_DIR ?= /tmp/facet-run

.PHONY: allocator-matrix all build tools lint-tool codegen-tool promtool-tool image image-sim build-release verify-release generate verify-generate lint test unit e2e multinode demo demo-down bench bench-scale clean fuzz fuzz-smoke

all: build

## build: every binary for the demo and the end-to-end tests. -tags facetsim
## links the simulator (internal/nvml/sim) into facet-kubeletplugin, for --machine.
build:
	$(GO) build -tags facetsim -o $(BIN)/ ./cmd/...
	# The plugin with test failpoints ($$FACET_FAILPOINT), for test/e2e
	# only; the shipped binary (make build-release) has none.
	$(GO) build -tags facetsim,facet_failpoints -o $(BIN)/failpoints/ ./cmd/facet-kubeletplugin
	GO=$(GO) hack/build-cdi-hook.sh $(BIN)/nvidia-cdi-hook

## image: Facet's OCI image facet.local/facet:<chart appVersion>, for
## linux/amd64 and linux/arm64, as _output/facet-image.tar (hack/image.sh:
## go-containerregistry, no Docker, no registry); load it on a node with
## `ctr -n k8s.io images import`
image:
	hack/image.sh

## image-sim: the demo's and e2e's image, facet.local/facet:<version>-sim,
## the plugin built with -tags facetsim, for this machine's platform only,
## as _output/facet-image-sim.tar. Never ship it.
image-sim:
	hack/image.sh --sim

## build-release: the shipped binaries, without the simulator, in bin/release/
build-release:
	$(GO) build -o $(BIN)/release/ ./cmd/facet-kubeletplugin ./cmd/facet-webhook ./cmd/facet-mps ./cmd/facet-imex ./cmd/facet-preemptor ./cmd/facet-controller ./cmd/facet-install
	$(MAKE) verify-release

## verify-release: fail if a shipped daemon links go-nvml's mock, the
## simulator or the MPS stand-in
verify-release:
	@for b in facet-kubeletplugin facet-webhook facet-mps facet-imex facet-preemptor facet-controller facet-install; do \
	  syms=$$($(GO) tool nm $(BIN)/release/$$b) || exit 1; \
	  if grep -qE 'go-nvml/pkg/nvml/mock|facet-gpu/facet/internal/' <<<"$$syms"; then \
	    echo "bin/release/$$b links simulator code" >&2; exit 1; fi; \
	  echo "bin/release/$$b: no simulator or go-nvml mock symbols"; \
	done

# deepcopy-gen and controller-gen, pinned in hack/tools/codegen/go.mod
# (tool directives).
DEEPCOPY_GEN := $(GO) tool -modfile=$(CURDIR)/hack/tools/codegen/go.mod deepcopy-gen
CONTROLLER_GEN := $(GO) tool -modfile=$(CURDIR)/hack/tools/codegen/go.mod controller-gen
DEEPCOPY_PKGS := ./api/gpu.facet.dev/v1alpha1
# The CRDs of the served kinds (ComputeDomain), from the API types'
# kubebuilder markers, where the chart's template reads them
# (templates/computedomain-crd.yaml).
CRD_DIR := deployments/helm/facet/files/crds
GEN_CRDS = $(CONTROLLER_GEN) crd:crdVersions=v1 paths=./api/... output:crd:dir=$(1)

## codegen-tool: build deepcopy-gen and controller-gen (go tool caches them
## in the build cache)
codegen-tool:
	$(DEEPCOPY_GEN) --help >/dev/null 2>&1
	$(CONTROLLER_GEN) --help >/dev/null 2>&1

## generate: regenerate the API types' deep copies (zz_generated.deepcopy.go)
## and the CRDs of the served kinds (deployments/helm/facet/files/crds)
generate:
	$(DEEPCOPY_GEN) --go-header-file hack/boilerplate.go.txt --output-file zz_generated.deepcopy.go $(DEEPCOPY_PKGS)
	rm -rf $(CRD_DIR) && $(call GEN_CRDS,$(CRD_DIR))

## verify-generate: fail if the generated files are stale (regenerates in a
## temporary copy of the module, then diffs)
verify-generate:
	@tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	mkdir -p "$$tmp/hack" && cp -r go.mod go.sum api pkg "$$tmp/" && cp hack/boilerplate.go.txt "$$tmp/hack/" && \
	find "$$tmp/api" -name zz_generated.deepcopy.go -delete && \
	(cd "$$tmp" && $(DEEPCOPY_GEN) --go-header-file hack/boilerplate.go.txt --output-file zz_generated.deepcopy.go $(DEEPCOPY_PKGS) && \
	  $(call GEN_CRDS,$$tmp/crds)) && \
	diff -ru api "$$tmp/api" && diff -ru $(CRD_DIR) "$$tmp/crds" || { echo "generated files are stale: run make generate" >&2; exit 1; }

# golangci-lint v2, built from the Go module proxy at a pinned version into
# the same cache as the cluster's tools (outside the checkout, survives
# make clean).
GOLANGCI_LINT_VERSION := v2.15.0
FACET_CACHE ?= $(HOME)/.cache/facet
GOLANGCI_LINT := $(FACET_CACHE)/bin/golangci-lint-$(GOLANGCI_LINT_VERSION)

$(GOLANGCI_LINT):
	mkdir -p $(FACET_CACHE)/bin/.golangci-lint
	GOBIN=$(FACET_CACHE)/bin/.golangci-lint $(GO) install github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$(GOLANGCI_LINT_VERSION)
	mv $(FACET_CACHE)/bin/.golangci-lint/golangci-lint $@

## tools: build every pinned tool the test rounds need (Kubernetes 1.35.4,
## 1.36.3 and 1.37.2, etcd, containerd, Kueue, golangci-lint, deepcopy-gen)
## into ~/.cache/facet, niced, in the order the rounds need them; start it
## first on a new machine (about an hour on 2 cores). `hack/tools.sh
## --status` says which caches are cold.
tools:
	hack/tools.sh

# promtool of the Prometheus release test/promrules pins (its go.mod's
# tool line), built once per version into the tools cache, outside any test's
# timeout: built inside TestRules under the rounds' load, it once ran past
# go test's 10 minutes.
PROMETHEUS_VERSION := $(shell awk '$$1 == "github.com/prometheus/prometheus" { print $$2 }' test/promrules/go.mod)
PROMTOOL := $(FACET_CACHE)/bin/promtool-$(PROMETHEUS_VERSION)

## promtool-tool: build promtool (once per Prometheus version, cached)
promtool-tool: $(PROMTOOL)

$(PROMTOOL):
	mkdir -p $(FACET_CACHE)/bin
	# A temporary name of its own: two builds at once (make tools beside
	# make unit) never write one file.
	tmp=$$(mktemp $@.XXXXXX) && cd test/promrules && $(GO) build -o $$tmp github.com/prometheus/prometheus/cmd/promtool && mv $$tmp $@

## lint-tool: build golangci-lint (once per machine, cached)
lint-tool: $(GOLANGCI_LINT)

## lint: golangci-lint over the main module and the two test modules
## (test/helm, test/promrules) with one config (.golangci.yml), and no tracked
## file over 1 MiB (hack/check-large-files.sh: build output stays out of git)
lint: $(GOLANGCI_LINT)
	hack/check-large-files.sh
	$(GOLANGCI_LINT) run ./...
	cd test/helm && $(GOLANGCI_LINT) run --config ../../.golangci.yml ./...
	cd test/promrules && $(GOLANGCI_LINT) run --config ../../.golangci.yml ./...

## test: unit tests, allocator tests (on each Kubernetes minor),
## end-to-end tests on a real node, and on a cluster of several nodes; each
## round prints its wall time ("[ci] stage ...", hack/stage.sh). The e2e
## rounds and the multinode round run side by side, and the unit tests and
## the allocator matrix beside them, niced (hack/test.sh)
test:
	MAKE="$(MAKE)" hack/test.sh

# Runs a recipe line as a named, timed stage (.ci/run tabulates them).
STAGE := hack/stage.sh

## unit: everything that needs no cluster (NVML simulated, upstream allocator)
unit:
	$(STAGE) "unit: go vet" $(GO) vet ./...
	$(STAGE) "unit: go vet -tags facetsim" $(GO) vet -tags facetsim ./cmd/...
	# -timeout: go test's default is 10 minutes per package; pkg/node/dradriver
	# (its crash matrix) took over 10 minutes for -count=3 on 2 cores at
	# load 35-50, which leaves one run little margin on a loaded machine.
	# The bound only turns a hang into a failure.
	$(STAGE) "unit: go test" $(GO) test -timeout 30m ./api/... ./pkg/... ./internal/... ./cmd/... ./test/allocator/... ./hack/kueue-webhooks/
	# The Helm chart, rendered with Helm as a library (its own module, so
	# Helm's dependencies stay out of Facet's go.mod).
	cd test/helm && ../../$(STAGE) "unit: Helm chart" $(GO) test ./...
	# The fake CRI's exec mode (hack/tools is its own module: Kubernetes'
	# own packages stay out of Facet's go.mod).
	cd hack/tools && ../../$(STAGE) "unit: fake CRI" $(GO) test ./fakecri/
	# The chart's alerts and dashboard against Prometheus's parser and
	# promtool (its own module, for Prometheus's dependencies); promtool is
	# built as a stage of its own, never inside the test.
	$(STAGE) "unit: promtool build" $(MAKE) --no-print-directory promtool-tool
	cd test/promrules && FACET_PROMTOOL=$(PROMTOOL) ../../$(STAGE) "unit: alerts and dashboard" $(GO) test ./...

## allocator-matrix: test/allocator against the allocator of Kubernetes
## 1.36 and 1.37 too (unit runs it on 1.35, go.mod's); the bug tests expect
## each version's own behaviour (hack/allocator-matrix.sh)
allocator-matrix:
	ALLOCATOR_VERSIONS="v0.36.3 v0.37.2" $(STAGE) "allocator matrix (1.36, 1.37)" hack/allocator-matrix.sh

## e2e: start a real Kubernetes node with containerd and run test/e2e,
## four times: 1.35 with the DRA alpha gates on, stock 1.35 (every alpha
## gate off), where the tests of gated modes skip and TestStock matters most,
## 1.36 with Kubernetes' default gates (the DRA gates beta and on), and 1.37
## with its default gates (device taints and extended resources GA).
## TestKueue (Kueue v0.17.0 beside the node: hack/build-kueue.sh,
## hack/kueue.sh; docs/kueue.md) runs on the two 1.35 rounds.
# A round that fails does not stop the others: each round is its own
# node, and a failure on one Kubernetes version says nothing about the
# next. make e2e fails at the end if any round failed, naming
# them.
# CHART_ONCE: the chart's live tests whose outcome does not depend on the
# Kubernetes version (docs/contributing.md, "Which chart live tests run on
# every round"): they run in the 1.36.3 round only.
CHART_ONCE := ^(TestLiveChartHostDriverRoot|TestLiveChartWebhookDeployment|TestLiveChartWebhookDown|TestLiveChartHAMiCoreUnpullable)$$
# FACET_E2E_PARALLEL: how many rounds run side by side, each on a node of
# its own (hack/e2e-rounds.sh; default 4, all at once; 1: one after
# another).
e2e: build
	CHART_ONCE='$(CHART_ONCE)' $(STAGE) "e2e rounds ($${FACET_E2E_PARALLEL:-4} at a time)" hack/e2e-rounds.sh

## multinode: a cluster of real kubelets on this machine, nine of them with
## Facet on simulated machines (dgx-h100 in mig mode, dgx-a100-80gb in
## shared mode, l4x4 in exclusive mode, a six-node GB200 NVL72-class rack of
## two cliques; fake CRI), and test/multinode on it: placement by class and
## CEL, a claim that fits nowhere, spreading, one node's plugin restart, the
## IMEX daemon's stand-in on the rack (hack/multinode.sh,
## hack/cluster/add-node.sh, hack/cluster/add-rack.sh)
multinode: build
	$(STAGE) "multinode (10 nodes)" hack/multinode.sh

## demo: the main job on a simulated DGX H100 node, Facet installed with its
## Helm chart (FACET_DEMO_PLUGIN=host: the plugin as a host process;
## FACET_DEMO_KUEUE=1: Kueue beside it with a team's quota); the node stays up
demo: build
	hack/demo.sh

## demo-down: stop the demo node
demo-down:
	hack/kueue.sh stop $(RUN_DIR)
	hack/demo-admission.sh stop $(RUN_DIR)
	hack/plugin.sh stop $(RUN_DIR)
	RUN_DIR=$(RUN_DIR) hack/cluster/down.sh

## fuzz: each fuzz target for FUZZTIME (`go test` in unit runs their seed corpora)
FUZZTIME ?= 60s
# e.g. FUZZFLAGS=-parallel=1 on a shared machine
FUZZFLAGS ?=
FUZZ_TARGETS := \
	./api/gpu.facet.dev/v1alpha1:FuzzDecode \
	./pkg/node/checkpoint:FuzzDecode \
	./internal/nvml/sim:FuzzParseMachine \
	./pkg/node/claimcdi:FuzzDeviceNames \
	./pkg/node/claimuid:FuzzValidate
fuzz:
	@set -e; for t in $(FUZZ_TARGETS); do \
		pkg=$${t%%:*}; fn=$${t##*:}; \
		echo "== $$fn in $$pkg for $(FUZZTIME)"; \
		$(GO) test "$$pkg" -run '^$$' -fuzz "^$$fn$$" -fuzztime $(FUZZTIME) $(FUZZFLAGS); \
	done

## fuzz-smoke: each fuzz target briefly
fuzz-smoke:
	$(MAKE) fuzz FUZZTIME=5s

bench:
	$(GO) test -run '^$$' -bench . -benchmem ./pkg/... ./internal/... ./test/allocator/...

## bench-scale: scheduling throughput and latency through a real kube-apiserver
## and kube-scheduler with 100 and 500 bare Nodes of Facet's slices and of
## NVIDIA's driver's (hack/scale, test/scale); prints a table of every
## version, shape and driver. Not part of `make test`.
## BENCH_SCALE_VERSIONS picks the Kubernetes versions (hack/build-k8s.sh
## builds what is missing), BENCH_SCALE_ARGS adds flags (go run ./hack/scale -h).
BENCH_SCALE_VERSIONS ?= v1.35.4 v1.36.3 v1.37.2
BENCH_SCALE_ARGS ?=
bench-scale:
	@set -e; versions=""; for v in $(BENCH_SCALE_VERSIONS); do \
		bin=$$(hack/build-k8s.sh $$v); versions="$$versions,$$v=$$bin"; done; \
	$(GO) run ./hack/scale -versions "$${versions#,}" $(BENCH_SCALE_ARGS)

clean:
	rm -rf $(BIN)
