# Facet: the two commands a fresh machine needs are `make demo` and `make test`.
SHELL := /bin/bash
GO ?= go
# go-nvml's cgo bindings use NVML calls NVIDIA marked deprecated; the
# warnings are theirs, not ours.
export CGO_CFLAGS ?= -Wno-deprecated-declarations
BIN := $(CURDIR)/bin
RUN_DIR ?= /tmp/facet-run

.PHONY: all build test unit e2e demo demo-down bench clean fuzz fuzz-smoke

all: build

build:
	$(GO) build -o $(BIN)/ ./cmd/...
	# The plugin with test failpoints ($$FACET_FAILPOINT), for test/e2e
	# only; the shipped binary above has none.
	$(GO) build -tags facet_failpoints -o $(BIN)/failpoints/ ./cmd/facet-kubeletplugin
	cd hack/tools/cdihook && $(GO) build -o $(BIN)/nvidia-cdi-hook github.com/NVIDIA/nvidia-container-toolkit/cmd/nvidia-cdi-hook

## test: unit tests, allocator tests and end-to-end tests on a real node
test: unit e2e

## unit: everything that needs no cluster (NVML simulated, upstream allocator)
unit:
	$(GO) vet ./...
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

## fuzz: each fuzz target for FUZZTIME (`go test` in unit runs their seed corpora)
FUZZTIME ?= 60s
# e.g. FUZZFLAGS=-parallel=1 on a shared machine
FUZZFLAGS ?=
FUZZ_TARGETS := \
	./api/gpu.facet.dev/v1alpha1:FuzzDecode \
	./pkg/checkpoint:FuzzDecode \
	./pkg/nvml:FuzzParseMachine \
	./pkg/cdi:FuzzDeviceNames \
	./pkg/claimuid:FuzzValidate
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
	$(GO) test -run '^$$' -bench . -benchmem ./pkg/... ./test/allocator/...

clean:
	rm -rf $(BIN)
