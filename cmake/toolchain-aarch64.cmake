# Cross-compiling softdot for 64-bit Arm (aarch64) on a Debian x86-64 host:
# Debian's cross compilers (g++-aarch64-linux-gnu) and the arm64 -dev
# packages of multiarch (libhwy-dev:arm64 and so on, under
# /usr/lib/aarch64-linux-gnu; headers are shared in /usr/include). Tests run
# under qemu-user (qemu-aarch64), with the CPU from QEMU_CPU when it is set
# (e.g. "max,sve-default-vector-length=32" for 256-bit SVE).
#   cmake -S . -B build-arm64 -DCMAKE_TOOLCHAIN_FILE=cmake/toolchain-aarch64.cmake
# scripts/test_arm64.sh installs what this needs and runs the tests.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)

# Libraries and CMake packages of the arm64 multiarch directories only;
# programs (the host's) from anywhere.
set(CMAKE_FIND_ROOT_PATH /usr/aarch64-linux-gnu)
set(CMAKE_PREFIX_PATH /usr/lib/aarch64-linux-gnu/cmake)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY BOTH)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE BOTH)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE BOTH)

# ctest and gtest_discover_tests run the test programs through this; the
# dynamic loader and libraries of arm64 come from the multiarch directories.
find_program(SOFTDOT_QEMU_AARCH64 qemu-aarch64 REQUIRED)
set(CMAKE_CROSSCOMPILING_EMULATOR ${SOFTDOT_QEMU_AARCH64})

# pkg-config (MPFR for the tests' reference) reads the arm64 .pc files, not
# the host's.
set(ENV{PKG_CONFIG_LIBDIR} /usr/lib/aarch64-linux-gnu/pkgconfig:/usr/share/pkgconfig)
set(ENV{PKG_CONFIG_PATH} "")
