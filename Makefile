# The two commands of the README: `make run` and `make test`. Both install missing Debian
# packages (scripts/install-deps.sh), configure and build first.
BUILD ?= build
ASAN_BUILD ?= build-asan
FUZZ_BUILD ?= build-fuzz
FUZZ_SECONDS ?= 60
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=

.PHONY: all deps configure build run test sanitize fuzz clean

all: build

deps:
	@bash scripts/install-deps.sh

configure: deps
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS) > /dev/null

build: configure
	@cmake --build $(BUILD) -j $(JOBS)

run: build
	@REGEN_WITH_PLOTS=1 bash scripts/install-deps.sh
	@bash scripts/main-job.sh $(BUILD)

test: build
	@cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

# CPU-only build under AddressSanitizer + UndefinedBehaviorSanitizer (CI runs it after `make test`):
# every CPU test but SANITIZE_SKIP's, which repeat under the sanitizers what other tests run there,
# at a length that cost CI's hour (2026-11-27, under ASan on 2 cores: 415 s of the tests' 1700 s):
# 20 steps under a dp plan, whose first steps' plans and executor the remat and pipeline suites
# run; the MILP's comparison with dp, whose time is CBC's, which is not instrumented; and the
# installed package's test, which builds examples/ again. `make test` runs all of them.
SANITIZE_SKIP ?= ^(20 steps of (ResNet|the Transformer) under a dp plan|milp: dp is within 3%|package: installed)
# Line tables only (-g1): the sanitizers' reports keep their files and lines; the objects are 2.5x
# smaller and compile 10-20% faster than with -g (remat/plan/planners/dp.cpp, 2026-11-27).
# Without the Python module (REGEN_PYTHON=OFF): its seven pybind11 sources are not compiled a second
# time, and its tests drive the library code the C++ suites run here; `make test` runs them
# (uninstrumented).
sanitize: deps
	@cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O2 -g1 -DNDEBUG" -DREGEN_CUDA=OFF -DREGEN_PYTHON=OFF \
	  -DREGEN_SANITIZE=ON > /dev/null
	@cmake --build $(ASAN_BUILD) -j $(JOBS)
	@cd $(ASAN_BUILD) && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
	  ctest --output-on-failure -j $(JOBS) -E '$(SANITIZE_SKIP)'

# The libFuzzer harnesses of tests/fuzz (clang, ASan + UBSan, CPU only), each run for
# FUZZ_SECONDS from its seed corpus (scripts/fuzz.sh); CI runs it after `make sanitize`.
fuzz:
	@REGEN_WITH_FUZZ=1 bash scripts/install-deps.sh
	@CC=clang CXX=clang++ cmake -S . -B $(FUZZ_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DREGEN_CUDA=OFF \
	  -DREGEN_MILP=OFF -DREGEN_PYTHON=OFF -DREGEN_FUZZ=ON -DREGEN_BUILD_TESTS=OFF -DREGEN_NATIVE=OFF > /dev/null
	@cmake --build $(FUZZ_BUILD) -j $(JOBS) --target fuzz_profile fuzz_plan fuzz_safetensors fuzz_data
	@bash scripts/fuzz.sh $(FUZZ_BUILD) $(FUZZ_SECONDS)

clean:
	@rm -rf $(BUILD) $(ASAN_BUILD) $(FUZZ_BUILD)
