# Shared helpers for airlock image recipes. Sourced, not run.
#
# Contract between ImageStore (src/engine/storage/image_store.cc) and the
# scripts in this folder:
#   * a script is run as `sh SCRIPT OUT_DIR` with the environment variables
#     AIRLOCK_RECIPE_DIR (this folder) and AIRLOCK_WORK (an empty scratch
#     directory inside the build's temporary directory, removed afterwards);
#   * it announces each step on stdout with a line `@@step NAME` (shown to the
#     user as progress; a failure is reported under the last step named);
#   * it exits non-zero on any failure (all scripts run under `set -eu`).
# A recipe (a file whose second line is `# airlock-recipe: ...`) writes
# OUT_DIR/rootfs.ext4; the root filesystem must provide /bin/sh and the empty
# mount points /proc /sys /dev /run (the initramfs moves its mounts there and
# puts the guest agent on a tmpfs at /run/airlock).

step() { echo "@@step $1"; }

die() {
  echo "error: $*" >&2
  exit 1
}

# The files every image shares: users root and `user` (uid/gid 1000), host
# name, hosts, and the empty mount points. $1 = root directory.
airlock_base_files() {
  r=$1
  mkdir -p "$r/etc" "$r/proc" "$r/sys" "$r/dev" "$r/run" "$r/mnt" "$r/root" "$r/home/user" "$r/tmp"
  chmod 1777 "$r/tmp"
  chmod 0700 "$r/root"
  if ! grep -q '^root:' "$r/etc/passwd" 2>/dev/null; then
    echo 'root:x:0:0:root:/root:/bin/sh' >>"$r/etc/passwd"
  fi
  if ! grep -q '^root:' "$r/etc/group" 2>/dev/null; then
    echo 'root:x:0:' >>"$r/etc/group"
  fi
  grep -q '^user:' "$r/etc/passwd" 2>/dev/null ||
    echo 'user:x:1000:1000:sandbox user:/home/user:/bin/sh' >>"$r/etc/passwd"
  grep -q '^user:' "$r/etc/group" 2>/dev/null || echo 'user:x:1000:' >>"$r/etc/group"
  if [ -f "$r/etc/shadow" ] && ! grep -q '^user:' "$r/etc/shadow"; then
    echo 'user:!:19000:0:99999:7:::' >>"$r/etc/shadow"
  fi
  echo airlock >"$r/etc/hostname"
  printf '127.0.0.1\tlocalhost\n127.0.1.1\tairlock\n::1\t\tlocalhost ip6-localhost ip6-loopback\n' >"$r/etc/hosts"
  if [ "$(id -u)" = 0 ]; then
    chown 1000:1000 "$r/home/user"
  fi
}

# Size in MiB for an ext4 image holding directory $1 plus $2 MiB of headroom,
# rounded up to 64 MiB, at least $3 MiB.
airlock_image_mb() {
  used_kb=$(du -sk "$1" | cut -f1)
  mb=$((used_kb * 12 / 10 / 1024 + $2))
  mb=$(((mb + 63) / 64 * 64))
  [ "$mb" -lt "$3" ] && mb=$3
  echo "$mb"
}

# Makes ext4 image $2 (size $3 MiB, sparse) from directory $1, with no loop
# mount. Not root: mkfs.ext4 copies the builder's uid into the image, so every
# inode is then handed to root (and /home/user to 1000) with debugfs.
airlock_mkfs() {
  dir=$1 img=$2 mb=$3
  rm -f "$img"
  mkfs.ext4 -q -F -L airlock-root -m 0 -E lazy_itable_init=0,lazy_journal_init=0 \
    -d "$dir" "$img" "${mb}M" || die "mkfs.ext4 -d $dir failed"
  if [ "$(id -u)" != 0 ]; then
    cmds="$AIRLOCK_WORK/debugfs.cmds"
    (cd "$dir" && find . -mindepth 1) | sed 's|^\.||' | while IFS= read -r p; do
      printf 'sif "%s" uid 0\nsif "%s" gid 0\n' "$p" "$p"
    done >"$cmds"
    printf 'sif / uid 0\nsif / gid 0\nsif /home/user uid 1000\nsif /home/user gid 1000\n' >>"$cmds"
    debugfs -w -f "$cmds" "$img" >/dev/null 2>"$AIRLOCK_WORK/debugfs.err" ||
      die "debugfs could not set file owners in $img: $(tail -3 "$AIRLOCK_WORK/debugfs.err")"
  fi
  e2fsck -fn "$img" >/dev/null 2>&1 || die "e2fsck found errors in $img"
}
