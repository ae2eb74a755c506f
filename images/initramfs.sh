#!/bin/sh
# Packs the initramfs: busybox, the kernel modules the cloud kernel builds as
# modules (virtio transport, block, console, rng, net), the guest agent, and
# /init (init.sh in this folder), which loads them, mounts /dev/vda and
# switch_roots into the agent.
# Environment: AIRLOCK_KERNEL_DIR (from kernel.sh), AIRLOCK_GUEST_AGENT (the
# static airlock-guest binary), AIRLOCK_INITRD_COMPRESS (gzip | none).
# Writes OUT_DIR/initrd.img.
set -eu
. "$AIRLOCK_RECIPE_DIR/common.sh"
out=$1
kdir=$AIRLOCK_KERNEL_DIR
release=$(cat "$kdir/release")
mods=$kdir/modules/$release
root=$AIRLOCK_WORK/initramfs
compress=${AIRLOCK_INITRD_COMPRESS:-none}

# What the guest needs; dependencies are added from each module's own
# `depends` field, so the load order is always the real one.
WANTED="virtio_pci virtio_mmio virtio_blk virtio_console virtio_rng virtio_net"

step modules
mkdir -p "$root/bin" "$root/lib/modules" "$root/dev" "$root/proc" "$root/sys" "$root/newroot"
: >"$AIRLOCK_WORK/order"
# Module names use '-' and '_' interchangeably.
find_ko() {
  pat=$(echo "$1" | sed 's/[-_]/[-_]/g')
  find "$mods" -regex ".*/$pat\.ko\(\.xz\|\.zst\|\.gz\)?" | head -1
}
is_builtin() {
  pat=$(echo "$1" | sed 's/[-_]/[-_]/g')
  grep -q "/$pat\.ko\$" "$mods/modules.builtin" 2>/dev/null
}
add_module() {
  local m ko dep
  m=$(echo "$1" | tr - _)
  grep -qx "$m" "$AIRLOCK_WORK/order" && return 0
  grep -qx "$m" "$AIRLOCK_WORK/visiting" 2>/dev/null && die "module dependency cycle at $m"
  ko=$(find_ko "$m")
  if [ -z "$ko" ]; then
    is_builtin "$m" && return 0
    die "kernel $release has no module $m (neither built in nor in lib/modules)"
  fi
  echo "$m" >>"$AIRLOCK_WORK/visiting"
  for dep in $(modinfo -F depends "$ko" | tr , ' '); do
    add_module "$dep"
  done
  case $ko in
  *.ko) cp "$ko" "$root/lib/modules/$m.ko" ;;
  *.xz) xz -dc "$ko" >"$root/lib/modules/$m.ko" ;;
  *.zst) zstd -qdc "$ko" >"$root/lib/modules/$m.ko" ;;
  *.gz) gzip -dc "$ko" >"$root/lib/modules/$m.ko" ;;
  esac
  echo "$m" >>"$AIRLOCK_WORK/order"
}
for m in $WANTED; do add_module "$m"; done
cp "$AIRLOCK_WORK/order" "$root/lib/modules/load-order"

step agent
[ -f "$AIRLOCK_GUEST_AGENT" ] || die "guest agent $AIRLOCK_GUEST_AGENT not found"
if ldd "$AIRLOCK_GUEST_AGENT" >/dev/null 2>&1; then
  die "guest agent $AIRLOCK_GUEST_AGENT is dynamically linked; it must be static"
fi
cp "$AIRLOCK_GUEST_AGENT" "$root/airlock-guest"
chmod 0755 "$root/airlock-guest"
cp /bin/busybox "$root/bin/busybox"
for a in sh mount insmod mkdir cp chmod sleep poweroff switch_root echo cat usleep; do
  ln -sf busybox "$root/bin/$a"
done
cp "$AIRLOCK_RECIPE_DIR/init.sh" "$root/init"
chmod 0755 "$root/init"

step cpio
# Owners are forced to root (-R 0:0) so this works unprivileged. The console
# device node cannot be made without privilege, so its cpio entry is written
# by hand (newc format) and appended: the kernel unpacks concatenated archives
# and needs /dev/console to give /init its stdout.
cpio_file=$AIRLOCK_WORK/initrd.cpio
(cd "$root" && find . | sort | cpio -o -H newc -R 0:0 --quiet) >"$cpio_file"
newc_entry() { # name mode rdevmajor rdevminor
  namesize=$((${#1} + 1))
  printf '070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X' \
    0 "$2" 0 0 1 0 0 0 0 "$3" "$4" "$namesize" 0
  printf '%s\0' "$1"
  pad=$(((4 - (110 + namesize) % 4) % 4))
  [ "$pad" -gt 0 ] && head -c "$pad" /dev/zero
  return 0
}
{
  newc_entry dev/console $((0020600)) 5 1
  newc_entry TRAILER!!! 0 0 0
} >>"$cpio_file"

case $compress in
gzip) gzip -6 -n -c "$cpio_file" >"$out/initrd.img" ;;
none) cp "$cpio_file" "$out/initrd.img" ;;
*) die "AIRLOCK_INITRD_COMPRESS must be gzip or none, not $compress" ;;
esac
