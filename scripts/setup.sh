#!/bin/sh
# Installs what airlock needs from Debian's packages. Idempotent: runs
# apt-get only for packages that are missing. Needs root (or sudo).
set -eu

PACKAGES="
  build-essential cmake ninja-build pkg-config git
  qemu-system-x86 qemu-utils
  busybox-static debootstrap mmdebstrap e2fsprogs cpio kmod zstd libssl-dev
  libslirp-dev libboost-dev nlohmann-json3-dev libspdlog-dev libcli11-dev
  libsqlite3-dev libseccomp-dev libcap-dev libarchive-dev libext2fs-dev libtomlplusplus-dev
  libxml2-dev libicu-dev nettle-dev liblzma-dev libbz2-dev zlib1g-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  clang libclang-rt-14-dev
  python3 python3-yaml python3-jsonschema python3-pip python3-setuptools python3-wheel
  iproute2 procps curl dpkg-dev
  nodejs tmux
  prometheus
  runsc
  containerd runc containernetworking-plugins
  golang-go golang-github-containerd-containerd-dev golang-github-containerd-ttrpc-dev
  python3-grpcio python3-protobuf protobuf-compiler
"
# containerd ... ttrpc-dev: the containerd shim (shim/, Go in GOPATH mode on
# Debian's Go sources, built offline) and tests/integration/test_containerd.py
# (a private containerd, runc as the honest baseline, CNI plugins for pods).
# python3-grpcio ... protobuf-compiler: test_cri.py's CRI v1 client (the
# subset in tests/integration/cri/runtime_v1.proto, compiled at test time).
# runsc: gVisor, the peer bench/start.py measures against in the same run.
# libext2fs-dev: airlock diff reads the guest's ext4 disk layers on the host.
# libtomlplusplus-dev: parses image recipes (airlock.toml, src/recipes).
# libxml2-dev ... zlib1g-dev: the static archives of libarchive's own
# dependencies; the CLI links them statically (cmake/static_deps.cmake).
# prometheus: its promtool checks every /metrics scrape in test_metrics.py.
# The MCP client test (tests/mcp) runs the official MCP SDK under Node.js and
# installs it with npm. Some nodejs builds ship npm themselves; Debian's
# does not, so the npm package only when there is no npm command yet.
if ! command -v npm >/dev/null 2>&1; then PACKAGES="$PACKAGES npm"; fi

missing=""
for p in $PACKAGES; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing="$missing $p"
  fi
done

if [ -z "$missing" ]; then
  echo "setup: all packages present"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "setup: installing:$missing"
$SUDO apt-get update -q
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends $missing
