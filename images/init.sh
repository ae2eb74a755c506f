#!/bin/sh
# /init of the airlock initramfs (busybox sh). Loads the virtio modules,
# mounts the root disk and hands PID 1 to the guest agent. Every failure
# prints `airlock-initramfs: <what>` on the console and powers off: a boot
# must never hang silently.
export PATH=/bin

fail() {
  echo "airlock-initramfs: $*"
  poweroff -f
  sleep 10
  exit 1
}

mount -t proc proc /proc || fail "mount /proc"
mount -t sysfs sysfs /sys || fail "mount /sys"
mount -t devtmpfs devtmpfs /dev || fail "mount devtmpfs on /dev"

while read -r m; do
  insmod "/lib/modules/$m.ko" || fail "insmod $m"
done </lib/modules/load-order

# virtio_blk probes asynchronously; wait up to 10 s for the disk.
i=0
while [ ! -b /dev/vda ]; do
  i=$((i + 1))
  [ $i -gt 1000 ] && fail "no root disk /dev/vda after 10 s"
  usleep 10000
done

# No ext4lazyinit thread: it would zero the inode tables of the groups the
# agent's grow of / adds (past the image's end the disk overlay reads as
# zeros already) and prefetch block bitmaps, in the background on the
# sandbox's one vCPU, in the middle of its first minutes of execs.
mount -t ext4 -o rw,noatime,noinit_itable,no_prefetch_block_bitmaps /dev/vda /newroot ||
  fail "mount /dev/vda (ext4) on /newroot"
mount -t tmpfs -o mode=0755,nosuid,nodev,size=64m tmpfs /newroot/run || fail "mount tmpfs on /newroot/run"
mkdir -p /newroot/run/airlock || fail "mkdir /newroot/run/airlock"
cp /airlock-guest /newroot/run/airlock/airlock-guest || fail "copy the guest agent to /newroot/run/airlock"
chmod 0755 /newroot/run/airlock/airlock-guest || fail "chmod the guest agent"
for d in dev proc sys; do
  mount --move "/$d" "/newroot/$d" || fail "mount --move /$d /newroot/$d"
done
exec switch_root /newroot /run/airlock/airlock-guest
fail "switch_root /newroot /run/airlock/airlock-guest"
