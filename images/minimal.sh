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

step wget
# Debian's busybox (1.35, static and dynamic alike) is built without
# FEATURE_WGET_TIMEOUT, but wget still declares its -T option as "T:+" (an
# integer) with a NULL place to store it: `wget -T 5 URL` segfaults in
# getopt32 before doing anything (gdb: the store through NULL). This is the
# crash users met; name lookups are not involved (glibc 2.34+ has the files
# and dns NSS services built in, so the static binary loads no libnss_*.so).
# A wrapper in PATH cannot help: the static busybox's sh runs its own applets
# without a PATH search. So the option string is patched in our copy:
# "T:+" -> "T:" (a string option, which getopt32 skips storing when the place
# is NULL): -T is accepted and, as in this build's wget, without effect (the
# exec's own timeout bounds a transfer). Same length, option bits unchanged;
# refused unless the exact string occurs once.
perl -0777 -i -pe '
  $n = s/\^cqSO:o:P:Y:U:T:\+(t:n::\0[^\0]*\0)/^cqSO:o:P:Y:U:T:$1\0/g;
  END { exit($n == 1 ? 0 : 3) }' "$root/bin/busybox" ||
  die "busybox wget's option string is not the one known to crash on -T: check images/minimal.sh"
# The patched copy parses -T: an invalid URL fails in wget's own check.
said=$("$root/bin/busybox" wget -T 1 -q http:// 2>&1) && die "patched busybox wget accepted an empty URL"
case $said in *"bad address"* | *"invalid"* | *"not an http"*) ;; *) die "patched busybox wget: $said" ;; esac

step files
airlock_base_files "$root"
# Names: /etc/hosts first, then the DNS server the agent writes to
# /etc/resolv.conf when the sandbox has a network.
printf 'hosts: files dns\nnetworks: files\npasswd: files\ngroup: files\n' >"$root/etc/nsswitch.conf"

step mkfs.ext4
airlock_mkfs "$root" "$out/rootfs.ext4" 128
