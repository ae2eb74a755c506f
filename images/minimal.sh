#!/bin/sh
# airlock-recipe: busybox-static root filesystem; builds in seconds
set -eu
. "$AIRLOCK_RECIPE_DIR/common.sh"
out=$1
root=$AIRLOCK_WORK/root

step busybox
busybox=/bin/busybox
[ -x "$busybox" ] || die "$busybox not found: install the busybox-static package"
"$busybox" --list-full >/dev/null 2>&1 || die "$busybox is not busybox"
if ldd "$busybox" >/dev/null 2>&1; then
  die "$busybox is dynamically linked: install busybox-static instead of busybox"
fi
mkdir -p "$root/bin" "$root/sbin" "$root/usr/bin" "$root/usr/sbin"
cp "$busybox" "$root/bin/busybox"
chmod 0755 "$root/bin/busybox"
# One process for all ~270 applet links (a fork per link costs seconds).
"$busybox" --list-full | grep -vx bin/busybox |
  perl -e 'my $r = shift; while (<STDIN>) { chomp; symlink("/bin/busybox", "$r/$_") or die "symlink $_: $!\n" }' "$root" ||
  die "cannot link the busybox applets"

step files
airlock_base_files "$root"

step mkfs.ext4
airlock_mkfs "$root" "$out/rootfs.ext4" 128
