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
# it runs every CPU test; none is excluded.
sanitize: deps
	@cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DREGEN_CUDA=OFF -DREGEN_SANITIZE=ON > /dev/null
	@cmake --build $(ASAN_BUILD) -j $(JOBS)
	@cd $(ASAN_BUILD) && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
	  ctest --output-on-failure -j $(JOBS)

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
