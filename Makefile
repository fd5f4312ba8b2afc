# Convenience wrapper around the CMake presets (see CMakePresets.json).
#   make demo   - release build, run the main example (train_digits)
#   make test   - debug build + full ctest run
#   make asan   - AddressSanitizer/UBSan build + ctest
#   make tsan   - ThreadSanitizer build + ctest
#   make cuda   - CUDA/NCCL backend build + ctest (GPU tests skip without a GPU)
#   make bench  - release build, run every benchmark
#   make bench-report - on an idle machine: every benchmark + TensorFlow side by side, tables,
#                 charts (docs/img/) and the generated block of docs/performance.md (bench/run_all.sh)
#   make clean  - remove build/

JOBS ?= 2

.PHONY: all deps demo test asan tsan cuda bench bench-report clean

all: test

deps:
	bash scripts/install-deps.sh

# Only the example and the library it links: the demo must not wait for every test.
demo: deps
	cmake --preset release
	cmake --build --preset release -j$(JOBS) --target train_digits
	./build/release/train_digits

test: deps
	cmake --preset debug
	cmake --build --preset debug -j$(JOBS)
	ctest --preset debug

asan: deps
	cmake --preset asan
	cmake --build --preset asan -j$(JOBS)
	ctest --preset asan

tsan: deps
	cmake --preset tsan
	cmake --build --preset tsan -j$(JOBS)
	ctest --preset tsan

cuda: deps
	cmake --preset cuda
	cmake --build --preset cuda -j$(JOBS)
	ctest --preset cuda

bench: deps
	cmake --preset release
	cmake --build --preset release -j$(JOBS)
	@set -e; found=0; \
	for b in build/release/bench/*; do \
	  [ -f "$$b" ] && [ -x "$$b" ] || continue; \
	  found=1; echo "==> $$b"; "$$b"; \
	done; \
	if [ "$$found" = 0 ]; then echo "no benchmarks built (is libbenchmark-dev installed?)" >&2; exit 1; fi

bench-report: deps
	bash bench/run_all.sh --jobs $(JOBS)

clean:
	rm -rf build
