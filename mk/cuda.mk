# CUDA (issue 9): the Go tests run everywhere (a fake driver stands in for
# libcuda on machines without a GPU). The GPU check's binaries are built
# here and run on a GPU machine: see bench/gpu/check.sh.
.PHONY: gpu-check-build

gpu-check-build:
	GPU_BUILD=$(BUILD)/gpu bench/gpu/check.sh build
