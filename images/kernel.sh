#!/bin/sh
# Downloads the guest kernel package and unpacks it (never installs it on the
# host). Environment: AIRLOCK_KERNEL_PACKAGE (e.g.
# linux-image-6.1.0-57-cloud-amd64), AIRLOCK_KERNEL_VERSION (its Debian
# version). Writes OUT_DIR/vmlinuz, OUT_DIR/config, OUT_DIR/release and
# OUT_DIR/modules/<release>/... .
set -eu
. "$AIRLOCK_RECIPE_DIR/common.sh"
out=$1
pkg=$AIRLOCK_KERNEL_PACKAGE
ver=$AIRLOCK_KERNEL_VERSION

step "download $pkg $ver"
cd "$AIRLOCK_WORK"
if ! apt-get download "$pkg=$ver" >apt.log 2>&1; then
  cat apt.log >&2
  if grep -qE 'Unable to locate|has no installation candidate|not found|Version .* was not found' apt.log; then
    die "apt-get download $pkg=$ver failed: the package lists do not know it (run apt-get update)"
  fi
  die "apt-get download $pkg=$ver failed"
fi
deb=$(ls ./*.deb 2>/dev/null | head -1)
[ -n "$deb" ] || die "apt-get download $pkg=$ver produced no .deb"

step "unpack $pkg"
dpkg-deb -x "$deb" tree || die "dpkg-deb -x $deb failed"
rm -f "$deb"
vmlinuz=$(ls tree/boot/vmlinuz-* 2>/dev/null | head -1)
[ -n "$vmlinuz" ] || die "$pkg has no boot/vmlinuz-*"
release=${vmlinuz##*/vmlinuz-}
[ -d "tree/lib/modules/$release" ] || die "$pkg has no lib/modules/$release"
cp "$vmlinuz" "$out/vmlinuz"
cp "tree/boot/config-$release" "$out/config"
echo "$release" >"$out/release"
mkdir -p "$out/modules"
mv "tree/lib/modules/$release" "$out/modules/$release"
