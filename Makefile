# The two commands of the README:
#   make run   set-up, build, default guest image, a real sandbox session
#   make test  the whole test suite (unit, fuzz corpus, integration with real VMs)

BUILD ?= build
BIN := $(BUILD)/bin
# Images built for tests live in the build tree, keyed by their inputs.
TEST_IMAGES := $(abspath $(BUILD))/guest-images

.PHONY: all setup build run test image clean

all: build

setup:
	sh scripts/setup.sh

$(BUILD)/build.ninja:
	cmake -S . -B $(BUILD) -G Ninja

build: setup $(BUILD)/build.ninja
	cmake --build $(BUILD)

image: build
	AIRLOCK_IMAGE_DIR=$(TEST_IMAGES) $(BIN)/airlock image build minimal

run: build
	sh scripts/demo.sh

test: image
	AIRLOCK_IMAGE_DIR=$(TEST_IMAGES) ctest --test-dir $(BUILD) --output-on-failure -j2 --timeout 900

clean:
	rm -rf $(BUILD)
