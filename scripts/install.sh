#!/bin/sh
# Installs, upgrades or removes devcloud on a Debian machine, from a release made by scripts/release.sh.
#
# Usage (as root):
#   install.sh [--agent] [--bridge] [--no-user] [--any-arch] [RELEASE]   install or upgrade
#   install.sh --uninstall [--purge]                                      remove
#
#   RELEASE      a devcloud-<version>-linux-<arch>.tar.gz or an unpacked release folder; default: the release this
#                script is in. One built for another CPU or Node.js ABI is refused
#   --agent      a gateway: /etc/devcloud/agent.yaml, devcloud-agent.service enabled (the default role)
#   --bridge     the cloud host: /etc/devcloud/bridge.yaml, devcloud-bridge.service enabled (both flags: both)
#   --no-user    do not create the devcloud and devcloud-bridge system users
#   --uninstall  remove /opt/devcloud, the units and the links; keep /etc/devcloud and the state directories
#   --purge      with --uninstall: remove /etc/devcloud, /var/lib/devcloud, /var/lib/devcloud-bridge and the users
#   --any-arch   with DESTDIR: take a release built for another CPU (to package it for that CPU), unchecked
#
# DESTDIR=/some/root installs under that root instead (for packaging and tests): no users are created, no
# systemctl is run, no owner is changed. docs/operations.md, "Install, upgrade, uninstall", explains it all.
set -eu

usage() {
  sed -n '2,19s/^# \{0,1\}//p' "$0"
}

say() {
  echo "install.sh: $*" >&2
}

die() {
  say "$*"
  exit 1
}

DESTDIR=${DESTDIR:-}
DESTDIR=${DESTDIR%/}
action=install
purge=no
agent=no
bridge=no
users=yes
any_arch=no
src=
while [ $# -gt 0 ]; do
  case $1 in
    --agent) agent=yes ;;
    --bridge) bridge=yes ;;
    --no-user) users=no ;;
    --uninstall) action=uninstall ;;
    --purge) purge=yes ;;
    --any-arch) any_arch=yes ;;
    -h | --help) usage; exit 0 ;;
    -*) die "unknown option: $1 (see --help)" ;;
    *) [ -z "$src" ] || die "more than one release given"; src=$1 ;;
  esac
  shift
done
[ "$purge" = no ] || [ "$action" = uninstall ] || die "--purge goes with --uninstall"
[ "$agent" = yes ] || [ "$bridge" = yes ] || agent=yes

# The paths the units and the agent's defaults use; under DESTDIR when packaging.
OPT=/opt/devcloud
ETC=/etc/devcloud
STATE=/var/lib/devcloud
BRIDGE_STATE=/var/lib/devcloud-bridge
UNITS=/etc/systemd/system
SYSUSERS=/usr/lib/sysusers.d/devcloud.conf
BIN=/usr/local/bin
UNIT_NAMES='devcloud-agent.service devcloud-agent-rollback.service devcloud-bridge.service'

# Real installs touch the system: users, owners, systemd. A DESTDIR install only writes files.
live=yes
[ -z "$DESTDIR" ] || live=no
[ "$any_arch" = no ] || [ "$live" = no ] || die "--any-arch goes with DESTDIR: a machine runs only a release for its own CPU"
if [ "$live" = yes ] && [ "$(id -u)" != 0 ]; then
  die "run as root (or set DESTDIR to install under another root)"
fi
systemd=no
if [ "$live" = yes ] && [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1; then systemd=yes; fi
umask 022

uninstall() {
  for u in $UNIT_NAMES; do
    # One at a time: systemctl gives up on all the units it is given when one of them does not exist.
    [ "$systemd" = no ] || systemctl disable --now "$u" >/dev/null 2>&1 || true
    rm -f "$DESTDIR$UNITS/$u"
  done
  rm -f "$DESTDIR$SYSUSERS"
  for b in devcloud-agent devcloud-bridge; do
    # Only our own links: a devcloud-agent installed some other way stays.
    case $(readlink "$DESTDIR$BIN/$b" 2>/dev/null || true) in
      "$OPT"/*) rm -f "$DESTDIR$BIN/$b" ;;
    esac
  done
  rm -rf "$DESTDIR$OPT" "$DESTDIR$OPT".new.* "$DESTDIR$OPT".old.*
  [ "$systemd" = no ] || systemctl daemon-reload
  if [ "$purge" = yes ]; then
    rm -rf "$DESTDIR$ETC" "$DESTDIR$STATE" "$DESTDIR$BRIDGE_STATE"
    if [ "$live" = yes ]; then
      for user in devcloud devcloud-bridge; do
        if id "$user" >/dev/null 2>&1; then userdel "$user" || say "could not remove the user $user"; fi
      done
    fi
    say "removed devcloud, its configuration and its state"
  else
    say "removed devcloud; kept $ETC and the state in $STATE (--purge removes them)"
  fi
}

if [ "$action" = uninstall ]; then
  uninstall
  exit 0
fi

# --- install or upgrade ---

if [ -z "$src" ]; then src=$(cd "$(dirname "$0")/.." && pwd); fi
[ -e "$src" ] || die "no release at $src"
notrelease="$src is not a devcloud release; scripts/release.sh makes one"
# A source checkout has dist/ and node_modules/ too, but with the dev tools: only a release has RELEASE.
[ -f "$src" ] || [ -f "$src/RELEASE" ] || die "$notrelease"

mkdir -p "$DESTDIR/opt"
# The new tree is assembled next to /opt/devcloud (same file system) and renamed into place only when complete:
# a failed or interrupted install leaves the installed version as it was.
new=$DESTDIR$OPT.new.$$
old=$DESTDIR$OPT.old.$$
trap 'rm -rf "$new"' EXIT
trap 'exit 1' INT TERM
mkdir "$new"
if [ -d "$src" ]; then
  cp -PRp "$src/." "$new/"
else
  tar -xf "$src" -C "$new" --strip-components=1 --no-same-owner
fi
[ -f "$new/RELEASE" ] && [ -f "$new/dist/agent/main.js" ] && [ -d "$new/node_modules" ] || die "$notrelease"
version=$(sed -n 's/^version=//p' "$new/RELEASE")

# The native modules were built for one architecture and Node.js ABI: refuse a release this machine cannot run
# before it replaces a working one. The CPU is the one this machine's node is for (a 64-bit kernel may run a 32-bit
# armhf system); without node, Debian's name for the system's architecture.
release_platform=$(sed -n 's/^platform=//p' "$new/RELEASE")
release_abi=$(sed -n 's/^node_abi=//p' "$new/RELEASE")
built_for="built for: $(grep -E '^(platform|node|node_abi)=' "$new/RELEASE" 2>/dev/null | tr '\n' ' ')"
if command -v node >/dev/null 2>&1; then
  platform=$(node -p 'process.platform + "-" + process.arch')
else
  case $(dpkg --print-architecture 2>/dev/null || uname -m) in
    amd64 | x86_64) platform=linux-x64 ;;
    arm64 | aarch64) platform=linux-arm64 ;;
    armhf | armv7l) platform=linux-arm ;;
    *) platform= ;;
  esac
fi
case $platform in linux-arm) arch=armhf ;; *) arch=${platform#linux-} ;; esac
foreign=no
if [ -n "$release_platform" ] && [ -n "$platform" ] && [ "$release_platform" != "$platform" ]; then
  [ "$any_arch" = yes ] ||
    die "this release is for $release_platform and this machine is $platform: install devcloud-$version-linux-$arch.tar.gz (scripts/release.sh --arch $arch builds it)"
  foreign=yes
  say "a release for $release_platform, on this $platform machine (--any-arch): its native modules are not checked"
fi
if [ "$foreign" = yes ]; then
  :
elif command -v node >/dev/null 2>&1; then
  abi=$(node -p process.versions.modules)
  [ -z "$release_abi" ] || [ "$release_abi" = "$abi" ] ||
    die "this release does not run with $(command -v node) ($(node --version), Node.js ABI $abi); it was $built_for"
  (cd "$new" && node -e 'new (require("better-sqlite3"))(":memory:").close(); require("unix-dgram")') ||
    die "this release does not run with $(command -v node) ($(node --version)); it was $built_for"
elif [ "$live" = yes ]; then
  die "Node.js is not installed: apt-get install nodejs (20.19 or later), then run this again"
else
  say "warning: no node on PATH; the native modules were not checked"
fi
if [ "$live" = yes ] && [ ! -x /usr/bin/node ]; then
  say "warning: the units run /usr/bin/node, which is missing; add a drop-in with ExecStart= for your node"
fi
[ "$live" = no ] || chown -R root:root "$new"

upgrade=no
[ ! -e "$DESTDIR$OPT" ] || upgrade=yes
if [ "$upgrade" = yes ]; then mv "$DESTDIR$OPT" "$old"; fi
if ! mv "$new" "$DESTDIR$OPT"; then
  [ "$upgrade" = no ] || mv "$old" "$DESTDIR$OPT"
  die "could not move the new release into $OPT; the installed one is unchanged"
fi
# With the old tree, whatever an install killed half-way left next to it.
rm -rf "$old" "$DESTDIR$OPT".new.* "$DESTDIR$OPT".old.*
trap - EXIT

# Units, the sysusers.d entry and the command links; replaced on every upgrade (local changes go in drop-ins).
mkdir -p "$DESTDIR$UNITS" "$DESTDIR$BIN"
for u in $UNIT_NAMES; do
  if [ -f "$DESTDIR$OPT/systemd/$u" ]; then cp "$DESTDIR$OPT/systemd/$u" "$DESTDIR$UNITS/$u"; chmod 644 "$DESTDIR$UNITS/$u"; fi
done
if [ -f "$DESTDIR$OPT/systemd/devcloud-sysusers.conf" ]; then
  mkdir -p "$(dirname "$DESTDIR$SYSUSERS")"
  cp "$DESTDIR$OPT/systemd/devcloud-sysusers.conf" "$DESTDIR$SYSUSERS"
  chmod 644 "$DESTDIR$SYSUSERS"
fi
ln -sfn "$OPT/dist/agent/main.js" "$DESTDIR$BIN/devcloud-agent"
ln -sfn "$OPT/dist/bridge/main.js" "$DESTDIR$BIN/devcloud-bridge"

if [ "$live" = yes ] && [ "$users" = yes ]; then
  if command -v systemd-sysusers >/dev/null 2>&1 && [ -f "$SYSUSERS" ]; then
    systemd-sysusers devcloud.conf
  else
    id devcloud >/dev/null 2>&1 ||
      useradd --system --user-group --home-dir "$STATE" --no-create-home --shell /usr/sbin/nologin devcloud
    id devcloud-bridge >/dev/null 2>&1 ||
      useradd --system --user-group --home-dir "$BRIDGE_STATE" --no-create-home --shell /usr/sbin/nologin devcloud-bridge
  fi
fi

# Configuration and state: created when missing, never overwritten; an upgrade leaves them as they are.
# $1: example file, $2: config file, $3: group that must read it (it may hold the broker password).
config_file() {
  if [ ! -e "$DESTDIR$ETC/$2" ]; then
    cp "$DESTDIR$OPT/config/$1" "$DESTDIR$ETC/$2"
    chmod 640 "$DESTDIR$ETC/$2"
    if [ "$live" = yes ] && id "$3" >/dev/null 2>&1; then chgrp "$3" "$DESTDIR$ETC/$2"; fi
    say "wrote $ETC/$2 from the example: edit it (at least mqtt.url) before starting the service"
  fi
}
# $1: state directory, $2: its owner.
state_dir() {
  if [ ! -d "$DESTDIR$1" ]; then
    mkdir -p "$DESTDIR$1"
    chmod 750 "$DESTDIR$1"
    if [ "$live" = yes ] && id "$2" >/dev/null 2>&1; then chown "$2:$2" "$DESTDIR$1"; fi
  fi
}
mkdir -p "$DESTDIR$ETC"
if [ "$agent" = yes ]; then
  config_file agent.example.yaml agent.yaml devcloud
  state_dir "$STATE" devcloud
fi
if [ "$bridge" = yes ]; then
  config_file bridge.example.yaml bridge.yaml devcloud-bridge
  state_dir "$BRIDGE_STATE" devcloud-bridge
fi

if [ "$systemd" = yes ]; then
  systemctl daemon-reload
  [ "$agent" = no ] || systemctl enable devcloud-agent.service
  [ "$bridge" = no ] || systemctl enable devcloud-bridge.service
  # A running service goes on with the old code until restarted: restart it now, and only if it runs.
  if [ "$upgrade" = yes ]; then
    for u in devcloud-agent.service devcloud-bridge.service; do
      systemctl try-restart "$u" || say "warning: $u did not restart; see systemctl status $u"
    done
  fi
fi

if [ "$upgrade" = yes ]; then
  say "upgraded $OPT to $version; configuration and state kept"
else
  say "installed devcloud $version in $OPT"
  if [ "$systemd" = yes ]; then
    [ "$agent" = no ] || say "next: edit $ETC/agent.yaml, then systemctl start devcloud-agent"
    [ "$bridge" = no ] || say "next: edit $ETC/bridge.yaml, then systemctl start devcloud-bridge"
  fi
fi
