# Thin wrapper: the build is CMake (CMakeLists.txt). Outputs land in $(BUILDDIR)/{lib,include,bin}.
#   make [all]            build both libraries, tests, benchmarks
#   make nccl_ep.build    build libnccl_ep only        make nccl_m2n.build   build libnccl_m2n only
#   make test             build, then run the host tests (ctest; no GPU needed)
#   make demo             the main job: the demo/benchmark on local GPUs, or what can be done without them
#   make gpu-check        build and run every GPU test and benchmark on the local GPUs; results in bench/results/
#   make install PREFIX=/opt/nccl_ext
#   make clean
# Variables: BUILDDIR (build), NCCL_HOME (else the CUDA toolkit, else PyTorch's nvidia.nccl wheel),
#            CUDA_HOME (/usr/local/cuda), CUDA_ARCHS (90), JOBS (all cores), PREFIX (/usr/local).
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
ifdef CMAKE_EXTRA
CMAKE_ARGS += $(CMAKE_EXTRA)
endif

.PHONY: all configure nccl_ep.build nccl_m2n.build test demo gpu-check install clean

all: configure
	cmake --build $(BUILDDIR) -j $(JOBS)

configure:
	cmake $(CMAKE_ARGS)

nccl_ep.build: configure
	cmake --build $(BUILDDIR) -j $(JOBS) --target nccl_ep

nccl_m2n.build: configure
	cmake --build $(BUILDDIR) -j $(JOBS) --target nccl_m2n

test: all
	ctest --test-dir $(BUILDDIR) --output-on-failure -j $(JOBS)

demo: all
	BUILDDIR=$(BUILDDIR) tools/demo.sh

gpu-check: all
	BUILDDIR=$(BUILDDIR) tools/gpu_check.sh

install: all
	cmake --install $(BUILDDIR) --prefix $(PREFIX)

clean:
	rm -rf $(BUILDDIR)
