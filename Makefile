# Convenience wrapper around the CMake presets (see CMakePresets.json).
#   make demo   - release build, run the main example (train_digits)
#   make test   - debug build + full ctest run
#   make format-check - every tracked C++ file as clang-format-14 writes it (CI's first stage)
#   make asan   - AddressSanitizer/UBSan build + ctest
#   make tsan   - ThreadSanitizer build + ctest
#   make bed    - debug build + the tests labelled `bed` (faults on a cluster of network namespaces,
#                 tools/cluster_bed.sh; root only, skipped with the reason elsewhere), six at a time
#   make slow   - debug build + the tests labelled `slow`, which the other test targets leave out
#                 (the long sweep of interrupted and resumed training, docs/fault_tolerance.md)
#   make fuzz   - libFuzzer build (clang, ASan/UBSan) + every fuzz target for FUZZ_SECONDS (60) each
#   make simulated-gpus - the gpu-labelled tests on 1, 2 and 4 simulated GPUs (debug), and on 2
#                 under ThreadSanitizer (MIRRORED_SIMULATED_GPUS; see docs/gpu.md)
#   make cuda   - CUDA/NCCL backend build (Release) + ctest (GPU tests skip without a GPU)
#   make cuda-debug - what CI runs: at -O0, the library with CUDA, the CUDA example and benchmark and
#                 the GPU tests compile (they skip without a GPU), with the header and package checks;
#                 the CPU tests compile alike without CUDA, so the debug stage builds and runs them
#   make bench  - release build, run every benchmark
#   make bench-report - on an idle machine: every benchmark + TensorFlow side by side + the digits
#                 MLP trained by train_digits, TF Keras and PyTorch DDP, tables, charts (docs/img/)
#                 and the generated block of docs/performance.md (bench/run_all.sh; installs Debian's
#                 python3-torch for the DDP side: scripts/install-deps.sh --ddp)
#   make interop - installs Debian's libtorch-dev, builds examples/interop (release, build/interop)
#                 and runs it: a libtorch model trained on 2 CPU replicas through DLPack
#   make clean  - remove build/

JOBS ?= 2
FUZZ_SECONDS ?= 60

.PHONY: all deps format-check demo test bed slow asan tsan simulated-gpus fuzz cuda cuda-debug bench bench-report interop clean

all: test

deps:
	bash scripts/install-deps.sh

# Every tracked C++ file as clang-format-14 writes it (tools/check_format.sh --fix rewrites them).
format-check: deps
	bash tools/check_format.sh

# Only the example and the library it links: the demo must not wait for every test.
demo: deps
	cmake --preset release
	cmake --build --preset release -j$(JOBS) --target train_digits
	./build/release/train_digits

test: deps
	cmake --preset debug
	cmake --build --preset debug -j$(JOBS)
	ctest --preset debug

bed: deps
	cmake --preset debug
	cmake --build --preset debug -j$(JOBS)
	ctest --preset bed

slow: deps
	cmake --preset debug
	cmake --build --preset debug -j$(JOBS)
	ctest --preset slow

asan: deps
	cmake --preset asan
	cmake --build --preset asan -j$(JOBS)
	ctest --preset asan

tsan: deps
	cmake --preset tsan
	cmake --build --preset tsan -j$(JOBS)
	ctest --preset tsan

simulated-gpus: deps
	cmake --preset debug
	cmake --build --preset debug -j$(JOBS)
	@set -e; for n in 1 2 4; do \
	  echo "==> ctest -L gpu with MIRRORED_SIMULATED_GPUS=$$n (debug)"; \
	  MIRRORED_SIMULATED_GPUS=$$n ctest --preset debug -L gpu; \
	done
	cmake --preset tsan
	cmake --build --preset tsan -j$(JOBS)
	@echo "==> ctest -L gpu with MIRRORED_SIMULATED_GPUS=2 (tsan)"
	MIRRORED_SIMULATED_GPUS=2 ctest --preset tsan -L gpu

fuzz: deps
	JOBS=$(JOBS) bash tools/run-fuzz.sh $(FUZZ_SECONDS)

cuda: deps
	cmake --preset cuda
	cmake --build --preset cuda -j$(JOBS)
	ctest --preset cuda

cuda-debug: deps
	cmake --preset cuda-debug
	cmake --build --preset cuda-debug -j$(JOBS)
	ctest --preset cuda-debug

bench: deps
	cmake --preset release
	cmake --build --preset release -j$(JOBS)
	@set -e; found=0; \
	for b in build/release/bench/*; do \
	  [ -f "$$b" ] && [ -x "$$b" ] || continue; \
	  found=1; echo "==> $$b"; "$$b"; \
	done; \
	if [ "$$found" = 0 ]; then echo "no benchmarks built (is libbenchmark-dev installed?)" >&2; exit 1; fi

bench-report:
	bash scripts/install-deps.sh --ddp
	bash bench/run_all.sh --jobs $(JOBS)

# Only the example and the library it links, CPU only (libtorch-dev is Debian's CPU build).
interop:
	bash scripts/install-deps.sh --interop
	cmake -S . -B build/interop -G Ninja -DCMAKE_BUILD_TYPE=Release -DMIRRORED_BUILD_INTEROP=ON \
	  -DMIRRORED_BUILD_TESTS=OFF -DMIRRORED_BUILD_BENCH=OFF -DMIRRORED_ENABLE_CUDA=OFF
	cmake --build build/interop -j$(JOBS) --target torch_mirrored
	./build/interop/torch_mirrored

clean:
	rm -rf build
