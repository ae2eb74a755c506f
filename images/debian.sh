#!/bin/sh
# airlock-recipe: Debian bookworm minbase with python3, pip, curl, git
set -eu
. "$AIRLOCK_RECIPE_DIR/common.sh"
out=$1
suite=${AIRLOCK_DEBIAN_SUITE:-bookworm}
packages=python3,python3-pip,curl,git,ca-certificates

step mirror
# The mirror comes from the host's own apt configuration (one-line .list
# files and deb822 .sources files), never from a name written here. Every
# `deb` entry for $suite, $suite-updates and $suite-security is passed on.
sources=$AIRLOCK_WORK/sources.list
{
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [ -f "$f" ] || continue
    sed -e 's/#.*//' "$f" | awk '$1 == "deb" {
      i = 2; if ($2 ~ /^\[/) { while (i <= NF && $i !~ /\]$/) i++; i++ }
      uri = $i; s = $(i + 1); comps = ""
      for (j = i + 2; j <= NF; j++) comps = comps " " $j
      print uri, s, comps }'
  done
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] || continue
    # deb822: stanzas separated by blank lines; Enabled: no skips one.
    awk 'function flush() {
           if (types ~ /(^| )deb( |$)/ && enabled != "no")
             for (u in U) for (s in S) print U[u], S[s], comps
           types = ""; comps = ""; enabled = ""; delete U; delete S }
         /^[ \t]*#/ { next }
         /^[ \t]*$/ { flush(); next }
         { key = tolower($1); sub(/:$/, "", key); $1 = ""; sub(/^ +/, "") }
         key == "types" { types = $0 }
         key == "uris" { n = split($0, a, " "); for (k = 1; k <= n; k++) U[k] = a[k] }
         key == "suites" { n = split($0, a, " "); for (k = 1; k <= n; k++) S[k] = a[k] }
         key == "components" { comps = $0 }
         key == "enabled" { enabled = tolower($0) }
         END { flush() }' "$f"
  done
} | awk -v s="$suite" '$2 == s || $2 == s "-updates" || $2 == s "-security" {
      c = ""; for (j = 3; j <= NF; j++) c = c " " $j
      if (c == "") c = " main"
      print "deb " $1 " " $2 c }' | sort -u >"$sources"
if [ -n "${AIRLOCK_DEBIAN_MIRROR:-}" ]; then
  echo "deb $AIRLOCK_DEBIAN_MIRROR $suite main" >"$sources"
fi
grep -q " $suite " "$sources" ||
  die "the host's apt configuration has no 'deb' source for suite $suite (set AIRLOCK_DEBIAN_MIRROR to a Debian mirror URL)"
cat "$sources"

# As root mmdebstrap builds in a plain directory; otherwise it needs user
# namespaces and subordinate ids (mode unshare). The ext4 image is made by a
# hook inside mmdebstrap, where the files are owned by (namespace) root, so
# the image gets the right owners in both modes.
if [ "$(id -u)" = 0 ]; then
  mode=root
else
  mode=unshare
  grep -q "^$(id -un):" /etc/subuid 2>/dev/null ||
    die "building the debian image unprivileged needs a subordinate uid range for $(id -un) in /etc/subuid (or build as root)"
  chmod 0777 "$out" "$AIRLOCK_WORK"
fi

step mmdebstrap
# TMPDIR inside the build directory keeps the chroot on the same disk and
# lets the caller measure progress by the directory's size.
mkdir -p "$AIRLOCK_WORK/tmp"
chmod 0777 "$AIRLOCK_WORK/tmp"
set -- --mode="$mode" --variant=minbase --include="$packages" \
  --aptopt='Acquire::Retries "3"' \
  --dpkgopt='path-exclude=/usr/share/man/*' \
  --dpkgopt='path-exclude=/usr/share/doc/*' \
  --dpkgopt='path-include=/usr/share/doc/*/copyright' \
  --dpkgopt='path-exclude=/usr/share/locale/*' \
  --customize-hook='chroot "$1" apt-get clean' \
  --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*.bin "$1"/var/log/*.log "$1"/etc/resolv.conf' \
  --customize-hook=". '$AIRLOCK_RECIPE_DIR/common.sh' && airlock_base_files \"\$1\" && chown 1000:1000 \"\$1/home/user\""
if [ "$mode" = root ]; then
  # A plain directory, unmounted when mmdebstrap is done.
  TMPDIR=$AIRLOCK_WORK/tmp mmdebstrap "$@" "$suite" "$AIRLOCK_WORK/root" "$sources" ||
    die "mmdebstrap failed (mode $mode)"
  # mmdebstrap can leave the chroot's /proc mounted (seen with 1.3.5 in root
  # mode); mkfs.ext4 -d must not copy it and cleanup must not descend into it.
  grep " $AIRLOCK_WORK/root/" /proc/mounts | cut -d' ' -f2 | sort -r | while read -r m; do
    umount "$m" || umount -l "$m" || die "cannot unmount $m left by mmdebstrap"
  done
  step mkfs.ext4
  airlock_mkfs "$AIRLOCK_WORK/root" "$out/rootfs.ext4" "$(airlock_image_mb "$AIRLOCK_WORK/root" 512 512)"
else
  # Unprivileged: files are owned by root only inside mmdebstrap's user
  # namespace, so the image is made there, from a non-recursive bind mount
  # of the chroot (without the /proc, /sys and /dev mounted into it).
  # NOTE: not yet exercised by a test (the development hosts build as root).
  TMPDIR=$AIRLOCK_WORK/tmp mmdebstrap "$@" --format=null \
    --customize-hook="mkdir -p '$AIRLOCK_WORK/view' && mount --bind \"\$1\" '$AIRLOCK_WORK/view' && . '$AIRLOCK_RECIPE_DIR/common.sh' && echo '@@step mkfs.ext4' && airlock_mkfs '$AIRLOCK_WORK/view' '$out/rootfs.ext4' \$(airlock_image_mb '$AIRLOCK_WORK/view' 512 512); rc=\$?; umount '$AIRLOCK_WORK/view'; exit \$rc" \
    "$suite" /dev/null "$sources" ||
    die "mmdebstrap failed (mode $mode)"
fi
[ -s "$out/rootfs.ext4" ] || die "mmdebstrap finished without making rootfs.ext4"
