#!/bin/sh
# Builds the Debian packages devcloud-agent_<version>_<arch>.deb and devcloud-bridge_<version>_<arch>.deb from a
# release (scripts/release.sh), with dpkg-deb alone: no debhelper, nothing downloaded. Each package holds what its
# program needs and nothing more: the agent's carries no code or module of the bridge (scripts/deps-closure.ts).
#
# Usage: scripts/deb.sh [--arch x64|arm64|armhf | --release TARBALL|DIR] [--out DIR] [--version VERSION]
#                       [--only agent|bridge]
#   --arch     build the release for this architecture first (scripts/release.sh --arch; default this machine's)
#   --release  or package a release made before
#   --out      where the .deb files go (default release/ in the checkout)
#   --version  the packages' version (default the release's); a test builds an upgrade with it
#   --only     build one of the two packages
# Prints the path of each package built, one a line. docs/operations.md, "Debian packages", explains the layout.
set -eu

usage() {
  sed -n '2,13s/^# \{0,1\}//p' "$0"
}

die() {
  echo "deb.sh: $*" >&2
  exit 1
}

root=$(cd "$(dirname "$0")/.." && pwd)
out=$root/release
src=
arch_opt=
version=
only=
while [ $# -gt 0 ]; do
  case $1 in
    --release) [ $# -ge 2 ] || die "--release needs a tarball or folder"; src=$2; shift 2 ;;
    --arch) [ $# -ge 2 ] || die "--arch needs x64, arm64 or armhf"; arch_opt=$2; shift 2 ;;
    --out) [ $# -ge 2 ] || die "--out needs a folder"; out=$2; shift 2 ;;
    --version) [ $# -ge 2 ] || die "--version needs a value"; version=$2; shift 2 ;;
    --only) [ $# -ge 2 ] || die "--only needs agent or bridge"; only=$2; shift 2 ;;
    -h | --help) usage; exit 0 ;;
    *) die "unknown argument: $1 (see --help)" ;;
  esac
done
case $only in '' | agent | bridge) ;; *) die "--only must be agent or bridge" ;; esac
case $arch_opt in '' | x64 | arm64 | armhf) ;; *) die "--arch must be x64, arm64 or armhf" ;; esac
[ -z "$arch_opt" ] || [ -z "$src" ] || die "--arch and --release do not go together: the release has its architecture"
command -v dpkg-deb >/dev/null 2>&1 || die "dpkg-deb is missing: apt-get install dpkg"
[ -x "$root/node_modules/.bin/tsx" ] || die "no node_modules in the checkout: run npm ci first"
mkdir -p "$out"
out=$(cd "$out" && pwd)
umask 022

work=$(mktemp -d "${TMPDIR:-/tmp}/devcloud-deb.XXXXXX")
trap 'rm -rf "$work"' EXIT INT TERM

if [ -z "$src" ]; then
  src=$(sh "$root/scripts/release.sh" ${arch_opt:+--arch "$arch_opt"} --out "$work" | tail -1) ||
    die "the release could not be built"
fi
[ -e "$src" ] || die "no release at $src"
rel=$work/release
mkdir "$rel"
if [ -d "$src" ]; then cp -PRp "$src/." "$rel/"; else tar -xf "$src" -C "$rel" --strip-components=1 --no-same-owner; fi
[ -f "$rel/RELEASE" ] && [ -d "$rel/node_modules" ] || die "$src is not a devcloud release; scripts/release.sh makes one"

[ -n "$version" ] || version=$(sed -n 's/^version=//p' "$rel/RELEASE")
echo "$version" | grep -Eq '^[0-9][A-Za-z0-9.+~-]*$' || die "not a Debian version: $version"
platform=$(sed -n 's/^platform=//p' "$rel/RELEASE")
# Debian's names for the architectures the release's native modules were built for.
case $platform in
  linux-x64) arch=amd64; triplet=x86_64-linux-gnu ;;
  linux-arm64) arch=arm64; triplet=aarch64-linux-gnu ;;
  linux-arm) arch=armhf; triplet=arm-linux-gnueabihf ;;
  *) die "the release is for $platform; packages are built for linux-x64, linux-arm64 and linux-arm" ;;
esac
# The debug symbols of the native modules are most of their size; a gateway never reads them.
strip=strip
[ "$arch" = amd64 ] || strip=$triplet-strip
command -v "$strip" >/dev/null 2>&1 || die "$strip is missing (binutils for $triplet)"
# The native modules load only in the Node.js major they were built for (its ABI): depend on that major.
node_major=$(sed -n 's/^node=\([0-9]*\)\..*/\1/p' "$rel/RELEASE")
[ -n "$node_major" ] || die "the release does not say which Node.js it was built for"
# Debian's variables for who built the package; a gateway maker sets them to their own.
maintainer="${DEBFULLNAME:-devcloud developers} <${DEBEMAIL:-devcloud@example.com}>"
homepage=$(node -p 'const p = require(process.argv[1]); (p.homepage ?? "")' "$rel/package.json" 2>/dev/null || true)

# $1: package (devcloud-agent or devcloud-bridge), $2: role (agent or bridge).
build() {
  pkg=$1
  role=$2
  tree=$work/$pkg
  lib=/usr/lib/$pkg
  doc=/usr/share/doc/$pkg
  mkdir -p "$tree/DEBIAN" "$tree$lib" "$tree/usr/bin" "$tree/usr/lib/systemd/system" "$tree/usr/lib/sysusers.d" \
    "$tree/etc/devcloud" "$tree$doc"

  # The program: the files of dist/ its entry point reaches, and the packages they need.
  "$root/node_modules/.bin/tsx" "$root/scripts/deps-closure.ts" "$rel" "dist/$role/main.js" >"$work/$pkg.files" ||
    die "cannot work out what the $role needs"
  (cd "$rel" && while IFS= read -r path; do
    mkdir -p "$tree$lib/$(dirname "$path")"
    cp -PRp "$path" "$tree$lib/$path"
  done) <"$work/$pkg.files"
  cp "$rel/package.json" "$rel/RELEASE" "$tree$lib/"
  nm=$tree$lib/node_modules
  # Not loaded, on top of what release.sh already left out (type declarations, source maps, package docs, the
  # native modules' intermediate files in build/Release): better-sqlite3's test extension; the native modules'
  # sources and other build files (a package with a binding.gyp keeps only build/Release/*.node); the packages'
  # tests, examples, benchmarks, docs pages and tool settings. Folders of other names stay: a package's code may
  # live in any of them.
  rm -f "$nm/better-sqlite3/build/Release/test_extension.node"
  find "$nm" -name binding.gyp -type f | while IFS= read -r gyp; do
    native=$(dirname "$gyp")
    rm -rf "$native/src" "$native/deps"
    [ ! -d "$native/build" ] || find "$native/build" -mindepth 1 -maxdepth 1 ! -name Release -exec rm -rf {} +
  done
  find "$nm" -type d \( -name test -o -name tests -o -name example -o -name examples -o -name benchmark \
    -o -name benchmarks \) -prune -exec rm -rf {} +
  find "$nm" -type f \( -name '*.html' -o -name .npmignore -o -name '.eslintrc*' -o -name 'eslint.config.*' \
    -o -name '.prettierrc*' -o -name .editorconfig -o -name '*.sh' \) -exec rm -f {} +
  # The debug symbols are most of a native module's size; a gateway never reads them. A library is not run.
  find "$nm" -name '*.node' -type f -exec "$strip" --strip-unneeded {} + -exec chmod 644 {} +
  # Nothing in node_modules is run as a program, but Debian's rule is plain: a file is executable if and only if
  # it is a script (or a program).
  find "$nm" -type f ! -name '*.node' -print0 | node -e '
    const fs = require("fs");
    const head = Buffer.alloc(2);
    for (const f of fs.readFileSync(0, "utf8").split("\0").filter(Boolean)) {
      const fd = fs.openSync(f, "r");
      const n = fs.readSync(fd, head, 0, 2, 0);
      fs.closeSync(fd);
      fs.chmodSync(f, n === 2 && head.toString("latin1") === "#!" ? 0o755 : 0o644);
    }
  ' 
  chmod 755 "$tree$lib/dist/$role/main.js"
  ln -s "../lib/$pkg/dist/$role/main.js" "$tree/usr/bin/$pkg"

  # The units and the user, with the release's /opt/devcloud paths turned into the package's.
  for unit in "$rel"/systemd/"$pkg"*.service; do
    sed -E -e "s#/opt/devcloud/docs/([A-Za-z0-9_-]+[.]md)#$doc/\\1.gz#g" -e "s#/opt/devcloud#$lib#g" "$unit" \
      >"$tree/usr/lib/systemd/system/$(basename "$unit")"
  done
  user=devcloud
  [ "$role" = agent ] || user=devcloud-bridge
  {
    echo "# sysusers.d(5): the user $pkg.service runs as; see $doc/operations.md.gz, \"The users\"."
    grep "^u $user " "$rel/systemd/devcloud-sysusers.conf"
  } >"$tree/usr/lib/sysusers.d/$pkg.conf"

  # Configuration: a conffile, so that dpkg keeps an administrator's changes through upgrades.
  cp "$rel/config/$role.example.yaml" "$tree/etc/devcloud/$role.yaml"
  chmod 640 "$tree/etc/devcloud/$role.yaml"
  echo "/etc/devcloud/$role.yaml" >"$tree/DEBIAN/conffiles"

  # Documentation: Debian's place for it, compressed as policy asks.
  for f in "$rel"/docs/*.md; do gzip -9n <"$f" >"$tree$doc/$(basename "$f").gz"; done
  gzip -9n <"$rel/README.md" >"$tree$doc/README.md.gz"
  {
    echo "$pkg ($version) unstable; urgency=medium"
    echo
    echo "  * devcloud $version, commit $(sed -n 's/^commit=//p' "$rel/RELEASE")."
    echo
    echo " -- $maintainer  $(date -R -u -d "@${SOURCE_DATE_EPOCH:-$(date +%s)}")"
  } | gzip -9n >"$tree$doc/changelog.gz"
  {
    echo 'Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/'
    echo "Upstream-Name: devcloud"
    echo
    echo 'Files: *'
    echo "Copyright: $(date -u +%Y) devcloud developers"
    echo 'License: Apache-2.0'
    echo ' On Debian systems, the full text of the Apache License 2.0 is in'
    echo ' /usr/share/common-licenses/Apache-2.0. The Node.js packages under'
    echo " $lib/node_modules carry their own licenses in their folders."
  } >"$tree$doc/copyright"

  # Maintainer scripts: what debhelper's systemd and sysusers snippets do, written out.
  sed -e "s/@PKG@/$pkg/g" -e "s/@ROLE@/$role/g" -e "s/@USER@/$user/g" "$root/scripts/deb/postinst" >"$tree/DEBIAN/postinst"
  sed -e "s/@PKG@/$pkg/g" "$root/scripts/deb/prerm" >"$tree/DEBIAN/prerm"
  sed -e "s/@PKG@/$pkg/g" -e "s/@USER@/$user/g" "$root/scripts/deb/postrm" >"$tree/DEBIAN/postrm"
  chmod 755 "$tree/DEBIAN/postinst" "$tree/DEBIAN/prerm" "$tree/DEBIAN/postrm"
  mkdir -p "$tree/usr/share/lintian/overrides"
  sed -e "s/@PKG@/$pkg/g" "$root/scripts/deb/lintian-overrides" >"$tree/usr/share/lintian/overrides/$pkg"

  if [ "$role" = agent ]; then
    description="devcloud agent: the gateway side of devcloud
 Keeps the gateway's variables in SQLite and syncs them with the devcloud
 bridge over MQTT, takes nearby users' authcodes on UDP port 590, runs
 queued commands and applies firmware images with automatic rollback.
 Runs as the systemd service devcloud-agent."
  else
    description="devcloud bridge: the cloud side of devcloud
 Serves the device cloud's REST API and talks to every gateway's agent over
 MQTT, through its embedded broker or an external one, with its data in
 SQLite or PostgreSQL. Runs as the systemd service devcloud-bridge."
  fi
  size=$(du -sk --exclude=DEBIAN "$tree" | cut -f1)
  {
    echo "Package: $pkg"
    echo "Version: $version"
    echo "Architecture: $arch"
    echo "Maintainer: $maintainer"
    echo "Installed-Size: $size"
    # Node.js 20.19 or later of the major the native modules were built for: Debian 13's nodejs, or a Node.js 20
    # package on Debian 12. The native modules need the C and C++ runtimes; adduser is not needed, as systemd-sysusers makes the user.
    echo "Depends: nodejs (>= 20.19), nodejs (<< $((node_major + 1))), libc6 (>= 2.36), libstdc++6 (>= 12), libgcc-s1, systemd (>= 252)"
    [ -z "$homepage" ] || echo "Homepage: $homepage"
    echo "Section: net"
    echo "Priority: optional"
    echo "Description: $description"
  } >"$tree/DEBIAN/control"
  (cd "$tree" && find . -path ./DEBIAN -prune -o -type f -printf '%P\0' | sort -z | xargs -0 md5sum) \
    >"$tree/DEBIAN/md5sums"

  deb=$out/${pkg}_${version}_$arch.deb
  dpkg-deb --root-owner-group -Zxz --build "$tree" "$deb.tmp" >/dev/null || die "dpkg-deb could not build $pkg"
  mv "$deb.tmp" "$deb"
  echo "$deb"
}

[ "$only" = bridge ] || build devcloud-agent agent
[ "$only" = agent ] || build devcloud-bridge bridge
