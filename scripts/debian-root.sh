#!/bin/sh
# Makes (once) and prints the path of a Debian 13 (trixie) root file system for the tests that run devcloud on a
# real Debian: the .deb booted under systemd (amd64, a bootable root with systemd and Node.js) and the arm releases
# under qemu-user (arm64 and armhf, a sysroot with Debian's Node.js unpacked, nothing configured, since none of its
# programs can run here without emulation). Built with debootstrap from Debian's mirror, the one network source the
# tests use besides the npm registry; kept in the cache folder, so that later runs take no time and need no network.
#
# Usage: scripts/debian-root.sh [--arch amd64|arm64|armhf] [--cache DIR] [--mirror URL]
#   --arch    the root's architecture (default amd64)
#   --cache   where the roots are kept (default $DEVCLOUD_ROOT_CACHE, else /var/cache/devcloud-test)
#   --mirror  the Debian mirror (default the first deb.debian.org-style URI of this machine's apt sources)
# Prints the root's path as its last line. Needs root, debootstrap and, for --arch amd64, nothing else;
# docs/operations.md, "Testing on real Debian", explains what the tests do with it.
set -eu

usage() {
  sed -n '2,13s/^# \{0,1\}//p' "$0"
}

die() {
  echo "debian-root.sh: $*" >&2
  exit 1
}

arch=amd64
cache=${DEVCLOUD_ROOT_CACHE:-/var/cache/devcloud-test}
mirror=
suite=trixie
while [ $# -gt 0 ]; do
  case $1 in
    --arch) [ $# -ge 2 ] || die "--arch needs a value"; arch=$2; shift 2 ;;
    --cache) [ $# -ge 2 ] || die "--cache needs a folder"; cache=$2; shift 2 ;;
    --mirror) [ $# -ge 2 ] || die "--mirror needs a URL"; mirror=$2; shift 2 ;;
    -h | --help) usage; exit 0 ;;
    *) die "unknown argument: $1 (see --help)" ;;
  esac
done
case $arch in amd64 | arm64 | armhf) ;; *) die "--arch must be amd64, arm64 or armhf" ;; esac
[ "$(id -u)" = 0 ] || die "run as root (debootstrap makes device nodes and sets owners)"
command -v debootstrap >/dev/null 2>&1 || [ -x /usr/sbin/debootstrap ] || die "debootstrap is missing: apt-get install debootstrap"
PATH=$PATH:/usr/sbin:/sbin

if [ -z "$mirror" ]; then
  # The mirror apt already uses here: a deb822 URIs: line or a one-line sources.list entry.
  mirror=$(cat /etc/apt/sources.list.d/*.sources /etc/apt/sources.list 2>/dev/null |
    sed -n -e 's/^URIs:[[:space:]]*\([^[:space:]]*\).*/\1/p' -e 's/^deb[[:space:]]\{1,\}\(\[[^]]*\][[:space:]]*\)\{0,1\}\([^[:space:]]*\).*/\2/p' |
    grep -v security | head -1)
  [ -n "$mirror" ] || mirror=http://deb.debian.org/debian
fi

# What the tests need in the root. amd64 boots: systemd as PID 1, D-Bus for systemctl, Node.js for the agent
# (Debian 13's nodejs is 20.19, which the agent's engines field accepts). The arm roots only run Node.js.
case $arch in
  amd64) include=systemd,systemd-sysv,dbus,nodejs,ca-certificates,procps ;;
  *) include=nodejs ;;
esac
root=$cache/$suite-$arch
stamp=$root/.devcloud-root
# Bumped when what the script puts into a root changes, so that cached roots are made again.
want="$suite $arch $include layout=2"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  echo "$root"
  exit 0
fi

mkdir -p "$cache"
work=$(mktemp -d "$cache/.building-$arch.XXXXXX")
trap 'rm -rf "$work"' EXIT INT TERM
log=$work.log
echo "debian-root.sh: debootstrap $suite $arch from $mirror (log: $log)" >&2
# $1: the suite's name on the mirror. The mirror may hold trixie's files under both names, one of them stale
# (an index that no longer matches its packages): the other name is tried before giving up.
bootstrap() {
  rm -rf "$work/root"
  if [ "$arch" = amd64 ]; then
    debootstrap --variant=minbase --include="$include" "$1" "$work/root" "$mirror" /usr/share/debootstrap/scripts/$suite \
      >"$log" 2>&1
  else
    # --foreign stops before anything of the root is run (that would need qemu registered with binfmt_misc, which
    # a container may not allow). Every package it fetched is then unpacked: a sysroot for qemu-user's -L.
    debootstrap --foreign --arch="$arch" --variant=minbase --include="$include" "$1" "$work/root" "$mirror" \
      /usr/share/debootstrap/scripts/$suite >"$log" 2>&1 || return 1
    for deb in "$work/root"/var/cache/apt/archives/*.deb; do
      dpkg-deb -x "$deb" "$work/root" || return 1
    done
    rm -f "$work/root"/var/cache/apt/archives/*.deb
  fi
}
if ! bootstrap $suite; then
  echo "debootstrap $suite failed ($(tail -1 "$log")); trying the mirror's stable, which is $suite" >&2
  bootstrap stable || die "debootstrap failed; the end of $log: $(tail -3 "$log")"
  grep -q '^13' "$work/root/etc/debian_version" || die "the mirror's stable is not Debian 13 ($suite)"
fi
[ -x "$work/root/usr/bin/node" ] || die "the root has no /usr/bin/node"
# debootstrap writes no /etc/hosts; an installed Debian has one, and the agent's default broker is localhost.
printf '127.0.0.1\tlocalhost\n::1\t\tlocalhost ip6-localhost ip6-loopback\n' >"$work/root/etc/hosts"
echo "$want" >"$work/root/.devcloud-root"
rm -rf "$root"
mv "$work/root" "$root"
rm -f "$log"
echo "$root"
