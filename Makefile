# Facet: the two commands a fresh machine needs are `make demo` and `make test`.
SHELL := /bin/bash
GO ?= go
# go-nvml's cgo bindings use NVML calls NVIDIA marked deprecated; the
# warnings are theirs, not ours.
export CGO_CFLAGS ?= -Wno-deprecated-declarations
BIN := $(CURDIR)/bin
RUN_DIR ?= /tmp/facet-run

.PHONY: all build build-release verify-release test unit e2e demo demo-down bench clean

all: build

## build: every binary for the demo and the end-to-end tests. -tags facetsim
## links the simulator (pkg/nvml/sim) into facet-kubeletplugin, for --machine.
build:
	$(GO) build -tags facetsim -o $(BIN)/ ./cmd/...
	cd hack/tools/cdihook && $(GO) build -o $(BIN)/nvidia-cdi-hook github.com/NVIDIA/nvidia-container-toolkit/cmd/nvidia-cdi-hook

## build-release: the shipped binaries, without the simulator, in bin/release/
build-release:
	$(GO) build -o $(BIN)/release/ ./cmd/facet-kubeletplugin ./cmd/facet-webhook
	$(MAKE) verify-release

## verify-release: fail if the shipped plugin links go-nvml's mock or the simulator
verify-release:
	@if $(GO) tool nm $(BIN)/release/facet-kubeletplugin | grep -E 'go-nvml/pkg/nvml/mock|facet/pkg/nvml/sim\.' >/dev/null; then \
		echo "bin/release/facet-kubeletplugin links simulator code" >&2; exit 1; fi
	@echo "bin/release/facet-kubeletplugin: no simulator or go-nvml mock symbols"

## test: unit tests, allocator tests and end-to-end tests on a real node
test: unit e2e

## unit: everything that needs no cluster (NVML simulated, upstream allocator)
unit:
	$(GO) vet ./...
	$(GO) vet -tags facetsim ./cmd/...
	$(GO) test ./api/... ./pkg/... ./cmd/... ./test/allocator/...
	# The Helm chart, rendered with Helm as a library (its own module, so
	# Helm's dependencies stay out of Facet's go.mod).
	cd test/helm && $(GO) test ./...

## e2e: start a real Kubernetes 1.35 node with containerd and run test/e2e
e2e: build
	hack/e2e.sh

## demo: the main job on a simulated DGX H100 node; the node stays up
demo: build
	hack/demo.sh

## demo-down: stop the demo node
demo-down:
	hack/plugin.sh stop $(RUN_DIR)
	RUN_DIR=$(RUN_DIR) hack/cluster/down.sh

bench:
	$(GO) test -run '^$$' -bench . -benchmem ./pkg/... ./test/allocator/...

clean:
	rm -rf $(BIN)
