# Thin wrapper over CMake. `make run` and `make test` work on a fresh Debian 12 machine.
BUILD      ?= build
ASAN_BUILD ?= build-asan
FUZZ_BUILD ?= build-fuzz
JOBS       ?= $(shell nproc)
LISTEN     ?= 127.0.0.1:8080

.PHONY: all deps run test build asan fuzz bench clean

all: build

deps:
	@.ci/deps.sh run

build: deps
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
	@cmake --build $(BUILD) -j$(JOBS) --target khamsin

run: build
	$(BUILD)/khamsin --listen $(LISTEN) examples/hello.lua

asan:
	@.ci/deps.sh test
	@cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DKH_WERROR=ON -DKH_SANITIZE=address,undefined >/dev/null
	@cmake --build $(ASAN_BUILD) -j$(JOBS)

# Every test: C unit tests, layering, fuzz replays (ctest, under ASan+UBSan), busted specs
# against the ASan binary, and a short libFuzzer smoke run of each fuzz target (clang).
test: asan
	@.ci/test.sh $(ASAN_BUILD) $(FUZZ_BUILD)

fuzz:
	@.ci/deps.sh test
	@CC=clang cmake -S . -B $(FUZZ_BUILD) -DKH_FUZZ=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
	@cmake --build $(FUZZ_BUILD) -j$(JOBS) --target kh_fuzz_targets

bench:
	@.ci/deps.sh bench
	bench/http1.sh

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(FUZZ_BUILD) build-release
