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
# Debian's static busybox is built without FEATURE_WGET_TIMEOUT, but its
# wget still parses -T into a NULL pointer: `wget -T 5 URL` segfaults before
# doing anything (busybox 1.35; reproduced on the host, gdb: getopt32 storing
# the -T number through NULL). Name lookups themselves are fine: glibc 2.34+
# has the files and dns NSS services built in, so the static binary needs no
# libnss_*.so. The applet is wrapped: -T N becomes `timeout N` around the
# whole transfer (busybox's own timeout applet), everything else is passed on.
rm -f "$root/usr/bin/wget"
cat >"$root/usr/bin/wget" <<'WGET'
#!/bin/sh
# airlock: busybox wget with -T SECONDS done by `timeout` (see images/minimal.sh).
secs=
n=$#
while [ "$n" -gt 0 ]; do
  a=$1
  shift
  n=$((n - 1))
  case $a in
  -T)
    [ "$n" -gt 0 ] || { echo "wget: option requires an argument -- 'T'" >&2; exit 1; }
    secs=$1
    shift
    n=$((n - 1))
    ;;
  -T*) secs=${a#-T} ;;
  --timeout=*) secs=${a#--timeout=} ;;
  *) set -- "$@" "$a" ;;
  esac
done
case $secs in
'') exec /bin/busybox wget "$@" ;;
*[!0-9]* | 0) echo "wget: -T needs a whole number of seconds > 0, not '$secs'" >&2; exit 1 ;;
esac
/bin/busybox timeout "$secs" /bin/busybox wget "$@"
rc=$?
# timeout ends wget with SIGTERM: say so, and fail like wget's own errors.
[ "$rc" -ne 143 ] || { echo "wget: timed out after $secs s" >&2; exit 1; }
exit "$rc"
WGET
chmod 0755 "$root/usr/bin/wget"

step files
airlock_base_files "$root"
# Names: /etc/hosts first, then the DNS server the agent writes to
# /etc/resolv.conf when the sandbox has a network.
printf 'hosts: files dns\nnetworks: files\npasswd: files\ngroup: files\n' >"$root/etc/nsswitch.conf"

step mkfs.ext4
airlock_mkfs "$root" "$out/rootfs.ext4" 128
