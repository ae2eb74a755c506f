#!/bin/sh
# Prints the path of a Debian cloud kernel for the VMM tests, downloading and
# unpacking it (not installing it) into CACHE_DIR/<package>_<version>/ on
# first use. Keyed by package version, so a kernel update fetches anew.
# Usage: fetch_kernel.sh CACHE_DIR
set -eu
cache=$1
mkdir -p "$cache"
exec 9>"$cache/.lock"
flock 9  # ctest -j runs several tests at once; one download is enough

# The kernel package the metapackage currently points at.
resolve() {
  apt-cache depends linux-image-cloud-amd64 2>/dev/null |
    awk '/Depends: linux-image-[0-9]/ {print $2; exit}'
}
pkg=$(resolve || true)
if [ -z "$pkg" ]; then
  apt-get update -q >&2
  pkg=$(resolve)
fi
[ -n "$pkg" ] || { echo "fetch_kernel: cannot resolve linux-image-cloud-amd64" >&2; exit 1; }
ver=$(apt-cache show --no-all-versions "$pkg" | awk '/^Version:/ {print $2; exit}')
dir="$cache/${pkg}_$ver"
kernel=$(ls "$dir"/x/boot/vmlinuz-* 2>/dev/null | head -n1 || true)
if [ -z "$kernel" ]; then
  rm -rf "$dir.tmp" && mkdir -p "$dir.tmp"
  (cd "$dir.tmp" && apt-get download -q "$pkg" >&2 && dpkg-deb -x ./*.deb x && rm -f ./*.deb)
  rm -rf "$dir" && mv "$dir.tmp" "$dir"
  kernel=$(ls "$dir"/x/boot/vmlinuz-* | head -n1)
fi
echo "$kernel"
