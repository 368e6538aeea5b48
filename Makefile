# Thin wrapper: the build is CMake (CMakeLists.txt). Outputs land in $(BUILDDIR)/{lib,include,bin}.
#   make [all]            build both libraries, tests, benchmarks
#   make nccl_ep.build    build libnccl_ep only        make nccl_m2n.build   build libnccl_m2n only
#   make test             test-docs, then build for every supported NCCL release (NCCL_RELEASES=all), run the host
#                         tests (ctest; no GPU needed), then test-asan and test-python
#   make test-asan        build only the C API fuzz target with AddressSanitizer, LeakSanitizer and
#                         UndefinedBehaviorSanitizer, in its own tree $(BUILDDIR)-asan, and run it (no GPU needed)
#   make test-python      build the wheel (pip wheel .), install it in a fresh venv with torch, run tests/python
#   make test-docs        the docs check (tools/docs_check.py: no history markers, no broken links) and the result
#                         index (tools/results_index.py --check); the first step of make test
#   make demo             the main job: the demo/benchmark on local GPUs, or what can be done without them
#   make gpu-check        build and run every GPU test and benchmark on the local GPUs; results in bench/results/
#   make gpu-sanitize     build and run every GPU test under compute-sanitizer (memcheck, racecheck, synccheck)
#   make install PREFIX=/opt/nccl_ext
#   make clean
# Variables: BUILDDIR (build), NCCL_HOME (else the CUDA toolkit, else PyTorch's nvidia.nccl wheel),
#            NCCL_RELEASES (the NCCL release families to serve: empty = the found NCCL's; all = every supported one,
#            as the wheel does; or a list "2.29.2;2.30.3"; headers from PyPI, cmake/NcclAbi.cmake),
#            CUDA_HOME (/usr/local/cuda), CUDA_ARCHS (90; the wheel: "90-real;100-real;120-real"), JOBS (all cores),
#            PREFIX (/usr/local).
BUILDDIR ?= build
CUDA_HOME ?= /usr/local/cuda
PREFIX ?= /usr/local
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
GENERATOR := $(shell command -v ninja >/dev/null 2>&1 && echo Ninja || echo "Unix Makefiles")

CMAKE_ARGS := -S . -B $(BUILDDIR) -G "$(GENERATOR)" -DCMAKE_CUDA_COMPILER=$(CUDA_HOME)/bin/nvcc \
              -DCUDAToolkit_ROOT=$(CUDA_HOME)
ifdef NCCL_HOME
CMAKE_ARGS += -DNCCL_HOME=$(NCCL_HOME)
endif
ifdef CUDA_ARCHS
CMAKE_ARGS += "-DCMAKE_CUDA_ARCHITECTURES=$(CUDA_ARCHS)"
endif
# Always passed, so that a tree configured for the matrix (make test) goes back to the found NCCL alone.
NCCL_RELEASES ?=
CMAKE_ARGS += "-DNCCL_EXT_NCCL_RELEASES=$(NCCL_RELEASES)"
ifdef CMAKE_EXTRA
CMAKE_ARGS += $(CMAKE_EXTRA)
endif
# The sanitizer tree: the same configuration in its own folder, with ASan + LSan + UBSan (every report fatal) and
# debug info for the reports.
ASAN_BUILDDIR := $(BUILDDIR)-asan
ASAN_ARGS := $(patsubst $(BUILDDIR),$(ASAN_BUILDDIR),$(CMAKE_ARGS)) -DNCCL_EXT_SANITIZE=address,undefined \
             -DCMAKE_BUILD_TYPE=RelWithDebInfo -DNCCL_EXT_BUILD_BENCH=OFF

.PHONY: all configure nccl_ep.build nccl_m2n.build test test-asan test-python test-docs demo gpu-check gpu-sanitize install clean

all: configure
	cmake --build $(BUILDDIR) -j $(JOBS)

configure:
	cmake $(CMAKE_ARGS)

nccl_ep.build: configure
	cmake --build $(BUILDDIR) -j $(JOBS) --target nccl_ep

nccl_m2n.build: configure
	cmake --build $(BUILDDIR) -j $(JOBS) --target nccl_m2n

test: test-docs
	$(MAKE) --no-print-directory all NCCL_RELEASES=$(or $(NCCL_RELEASES),all)
	ctest --test-dir $(BUILDDIR) --output-on-failure -j $(JOBS)
	$(MAKE) --no-print-directory test-asan
	$(MAKE) --no-print-directory test-python

# Only the fuzz target (and the libraries it links) is built in the sanitizer tree; -L fuzz runs only its tests.
test-asan:
	cmake $(ASAN_ARGS)
	cmake --build $(ASAN_BUILDDIR) -j $(JOBS) --target api_fuzz
	ctest --test-dir $(ASAN_BUILDDIR) -L fuzz --output-on-failure -j $(JOBS)

test-python:
	BUILDDIR=$(BUILDDIR) tools/python_test.sh

# The docs describe the present and link to files that exist; bench/results/README.md indexes what is there.
test-docs:
	python3 tools/docs_check.py
	python3 tools/results_index.py --check

demo: all
	BUILDDIR=$(BUILDDIR) tools/demo.sh

gpu-check: all
	BUILDDIR=$(BUILDDIR) tools/gpu_check.sh

gpu-sanitize: all
	BUILDDIR=$(BUILDDIR) tools/gpu_sanitize.sh

install: all
	cmake --install $(BUILDDIR) --prefix $(PREFIX)

clean:
	rm -rf $(BUILDDIR) $(ASAN_BUILDDIR) $(BUILDDIR)-py $(BUILDDIR)-wheel
