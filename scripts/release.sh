#!/bin/sh
# Builds the release tarball devcloud-<version>-linux-<arch>.tar.gz: dist/ compiled from this checkout, the
# production node_modules with native modules for <arch>, the systemd units, config examples, docs, README.md,
# package.json and scripts/install.sh. Works offline: the production node_modules is a pruned copy of the
# checkout's, so run `npm ci` (or `npm install`) once before.
#
# Usage: scripts/release.sh [--arch ARCH[,ARCH...]] [--out DIR] [--qemu-root DIR]
#   --arch       x64, arm64 or armhf (armv7 hard-float), or all; default: this machine's. For another one, the
#                native modules are cross-compiled with Debian's gcc-<triplet> and g++-<triplet> against this
#                machine's Node.js headers, and kept in a cache (DEVCLOUD_CROSS_CACHE, else ~/.cache/devcloud-cross)
#   --out        where the tarballs go (default: release/ in the checkout)
#   --qemu-root  with one --arch of another CPU: also load the native modules and start both CLIs there under
#                qemu-user, with DIR as that CPU's root file system holding /usr/bin/node (scripts/debian-root.sh)
# Prints each tarball's path, one a line, as its last lines. docs/operations.md, "Building a release", explains it.
set -eu

usage() {
  sed -n '2,15s/^# \{0,1\}//p' "$0"
}

say() {
  echo "release.sh: $*" >&2
}

die() {
  say "$*"
  exit 1
}

root=$(cd "$(dirname "$0")/.." && pwd)
out=$root/release
arches=
qemu_root=
while [ $# -gt 0 ]; do
  case $1 in
    --out) [ $# -ge 2 ] || die "--out needs a directory"; out=$2; shift 2 ;;
    --out=*) out=${1#--out=}; shift ;;
    --arch) [ $# -ge 2 ] || die "--arch needs a value"; arches="$arches,$2"; shift 2 ;;
    --arch=*) arches="$arches,${1#--arch=}"; shift ;;
    --qemu-root) [ $# -ge 2 ] || die "--qemu-root needs a directory"; qemu_root=$2; shift 2 ;;
    --qemu-root=*) qemu_root=${1#--qemu-root=}; shift ;;
    -h | --help) usage; exit 0 ;;
    *) die "unknown argument: $1 (see --help)" ;;
  esac
done

cd "$root"
[ -x node_modules/.bin/tsc ] || die "no node_modules here: run npm ci first"
command -v node >/dev/null 2>&1 || die "node is not on PATH"
version=$(node -p 'require("./package.json").version')

# The architectures by the names of --arch; Node.js calls them x64, arm64 and arm (process.arch).
node_arch() {
  case $1 in x64) echo x64 ;; arm64) echo arm64 ;; armhf) echo arm ;; esac
}
case $(node -p process.arch) in
  x64) host=x64 ;;
  arm64) host=arm64 ;;
  arm) host=armhf ;;
  *) die "this machine's Node.js is for $(node -p process.arch): releases are made for x64, arm64 and armhf" ;;
esac
list=
for a in $(echo "${arches#,}" | tr ',' ' '); do
  case $a in
    x64 | amd64 | x86_64) a=x64 ;;
    arm64 | aarch64) a=arm64 ;;
    armhf | arm | armv7l) a=armhf ;;
    all) a="x64 arm64 armhf" ;;
    *) die "unknown --arch $a: x64, arm64, armhf or all" ;;
  esac
  for b in $a; do
    case " $list " in *" $b "*) ;; *) list="$list $b" ;; esac
  done
done
list=${list# }
[ -n "$list" ] || list=$host
if [ -n "$qemu_root" ]; then
  [ "$list" != "${list#* }" ] && die "--qemu-root goes with a single --arch"
  [ "$list" != "$host" ] || die "--qemu-root is for a release of another CPU; this machine runs $host itself"
  [ -x "$qemu_root/usr/bin/node" ] || die "--qemu-root: no $qemu_root/usr/bin/node"
  qemu_root=$(cd "$qemu_root" && pwd)
fi

mkdir -p "$out"
out=$(cd "$out" && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/devcloud-release.XXXXXX")
trap 'rm -rf "$work"' EXIT INT TERM
stage=$work/stage
mkdir "$stage"
umask 022

# --- what every architecture shares: the JavaScript, the packages, the docs ---

say "compiling dist/"
# Straight into the stage, so that the checkout's own dist/ (used by npm start and tests) is left alone.
node_modules/.bin/tsc -p tsconfig.build.json --outDir "$stage/dist"
# The web console the bridge serves (docs/console.md), bundled into the stage's dist/console.
node_modules/.bin/tsx scripts/build-console.ts --out "$stage/dist/console" >/dev/null
# The CLIs are run through the /usr/local/bin links by their #! line.
chmod 755 "$stage/dist/agent/main.js" "$stage/dist/bridge/main.js"

for f in config docs systemd README.md package.json package-lock.json; do
  if [ -e "$f" ]; then cp -PR "$f" "$stage/"; else say "warning: no $f in the checkout"; fi
done
mkdir "$stage/scripts"
cp scripts/install.sh "$stage/scripts/install.sh"
chmod 755 "$stage/scripts/install.sh"

say "production node_modules"
[ -f node_modules/.package-lock.json ] || die "node_modules has no .package-lock.json: run npm ci first"
# The top-level packages npm's record of node_modules does not mark dev-only, each with its nested node_modules:
# the dev tools are most of the checkout's node_modules, and copying files is the slow part on small machines.
mkdir "$stage/node_modules"
node -e '
  const lock = require("./node_modules/.package-lock.json");
  for (const [path, entry] of Object.entries(lock.packages ?? {})) {
    if (!entry.dev && /^node_modules\/(@[^/]+\/)?[^/]+$/.test(path)) console.log(path);
  }
' | while IFS= read -r dir; do
  mkdir -p "$stage/$(dirname "$dir")"
  cp -PR "$dir" "$stage/$dir"
done
cp -PR node_modules/.bin node_modules/.package-lock.json "$stage/node_modules/"
# npm then works out what a production install holds from the lockfile and removes the rest; nothing is fetched,
# and no install script runs, so the native modules stay as built by `npm ci` on this machine.
(cd "$stage" && npm prune --omit=dev --offline --ignore-scripts --no-audit --no-fund --loglevel=error >&2)
# Optional peers that a development dependency brought in stay after the prune (npm marks them devOptional): ws's
# native speed-ups (bufferutil, utf-8-validate) come with prebuilt binaries for other systems. ws works without them,
# so the release leaves them out.
for optional in bufferutil utf-8-validate node-gyp-build; do rm -rf "$stage/node_modules/$optional"; done
# Fails when a production dependency is missing from the checkout's node_modules (an out-of-date npm install).
(cd "$stage" && npm ls --omit=dev --all --offline --loglevel=error >/dev/null) ||
  die "production dependencies are missing or invalid in node_modules: run npm ci and try again"
# Files Node.js never reads (type declarations, source maps, package docs, their CI settings): fewer files make the
# tarball smaller and unpacking it on a gateway's flash quicker.
find "$stage/node_modules" -type d -name .github -prune -exec rm -rf {} +
find "$stage/node_modules" -type f \( -name '*.d.ts' -o -name '*.d.cts' -o -name '*.d.mts' -o -name '*.map' \
  -o -iname '*.md' -o -name '.*.yml' -o -name .gitattributes \) -exec rm -f {} +
# The command links of the packages: nothing runs them on a gateway.
rm -rf "$stage/node_modules/.bin"
# Intermediate build files of the native modules: only the compiled *.node files are loaded.
find "$stage/node_modules" -type d -path '*/build/Release' | while IFS= read -r dir; do
  find "$dir" -mindepth 1 -maxdepth 1 ! -name '*.node' -exec rm -rf {} +
done

# The release must run from its own folder: load the native modules and every module of both CLIs from there.
# Done with this machine's native modules, before those of another CPU replace them: the JavaScript is the same.
LOAD_CHECK='new (require("better-sqlite3"))(":memory:").close(); require("unix-dgram")'
(cd "$stage" && node -e "$LOAD_CHECK") || die "the native modules do not load from the release"
(cd "$work" && node "$stage/dist/agent/main.js" --help >/dev/null && node "$stage/dist/bridge/main.js" --help >/dev/null) ||
  die "the CLIs do not start from the release"

# The packages with compiled code: each folder under node_modules with a binding.gyp (node-gyp's build file).
natives=$(cd "$stage" && find node_modules -name binding.gyp -exec dirname {} \; |
  while IFS= read -r d; do [ -f "$d/package.json" ] && echo "$d"; done | sort)
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)

# --- the native modules of another CPU ---

# node-gyp, the build tool npm runs for install scripts: npm names it to the scripts it runs, and ships it.
find_gyp() {
  if [ -n "${npm_config_node_gyp:-}" ] && [ -f "$npm_config_node_gyp" ]; then echo "$npm_config_node_gyp"; return; fi
  npm_bin=$(command -v npm 2>/dev/null) || die "npm is not on PATH (its node-gyp cross-compiles the native modules)"
  npm_cli=$(readlink -f "$npm_bin")
  for gyp in "$(dirname "$npm_cli")/../node_modules/node-gyp/bin/node-gyp.js" \
    "$(dirname "$npm_cli")/../lib/node_modules/npm/node_modules/node-gyp/bin/node-gyp.js"; do
    if [ -f "$gyp" ]; then readlink -f "$gyp"; return; fi
  done
  die "node-gyp is not where npm ($npm_cli) keeps it (node_modules/node-gyp/bin/node-gyp.js next to npm's bin/); set npm_config_node_gyp to its node-gyp.js"
}

# The Node.js headers to compile against: npm's nodedir, else those of the node on PATH (<prefix>/include/node).
find_nodedir() {
  dir=${npm_config_nodedir:-}
  if [ -z "$dir" ]; then
    dir=$(npm config get nodedir 2>/dev/null || true)
    case $dir in undefined | null) dir= ;; esac
  fi
  [ -n "$dir" ] || dir=$(dirname "$(dirname "$(readlink -f "$(command -v node)")")")
  [ -f "$dir/include/node/node_version.h" ] && [ -f "$dir/include/node/common.gypi" ] ||
    die "no Node.js headers in $dir/include/node (node_version.h, common.gypi): install those of $(node --version), or set npm_config_nodedir to the folder that has include/node"
  echo "$dir"
}

# $1: a NODE_* macro of node_version.h
header() {
  sed -n "s/^#define $1 \([0-9]*\)\$/\1/p" "$nodedir/include/node/node_version.h" | head -1
}

# Sets triplet, gyp_arch and qemu for the architecture $1.
toolchain() {
  case $1 in
    x64) triplet=x86_64-linux-gnu; gyp_arch=x64; qemu=qemu-x86_64; pkg=x86-64-linux-gnu ;;
    arm64) triplet=aarch64-linux-gnu; gyp_arch=arm64; qemu=qemu-aarch64; pkg=aarch64-linux-gnu ;;
    armhf) triplet=arm-linux-gnueabihf; gyp_arch=arm; qemu=qemu-arm; pkg=arm-linux-gnueabihf ;;
  esac
  for tool in gcc g++ ar; do
    command -v "$triplet-$tool" >/dev/null 2>&1 ||
      die "$triplet-$tool is missing, to cross-compile for $1: apt-get install gcc-$pkg g++-$pkg"
  done
  command -v make >/dev/null 2>&1 || die "make is missing: apt-get install make"
}

# The compiled files of the package in node_modules folder $2 for the architecture $1, from the cache or built
# into it; prints the cache entry. Keyed by package and version, architecture, Node.js ABI and compiler version.
cross_build() {
  pkg_name=$(node -p 'require(process.argv[1]).name' "$root/$2/package.json")
  pkg_version=$(node -p 'require(process.argv[1]).version' "$root/$2/package.json")
  key=$(echo "$pkg_name" | tr / +)-$pkg_version-linux-$1-node$abi-gcc$("$triplet-gcc" -dumpversion)
  entry=$cache/$key
  if [ -d "$entry" ]; then
    say "$pkg_name $pkg_version for $1: cached ($entry)"
    echo "$entry"
    return
  fi
  mkdir -p "$cache"
  # One build of an entry at a time (another release may be making it now); the entry appears whole, by rename.
  (
    if command -v flock >/dev/null 2>&1; then flock 9; fi
    [ -d "$entry" ] && exit 0
    say "$pkg_name $pkg_version for $1: cross-compiling with $triplet-g++ (minutes; then cached in $cache)"
    src=$work/cross/$1/$2
    mkdir -p "$(dirname "$src")"
    # From the checkout's copy, which still has the sources; never through the package's install script (it
    # would download a prebuilt binary).
    cp -PR "$root/$2" "$src"
    rm -rf "$src/build"
    log=$work/cross-$1-$(basename "$2").log
    # NODE_PATH: the build file may ask Node.js for a dependency's headers (unix-dgram: nan).
    (cd "$src" && env CC="$triplet-gcc" CXX="$triplet-g++" LINK="$triplet-g++" AR="$triplet-ar" \
      NODE_PATH="$root/node_modules" node "$gyp" rebuild --release --arch="$gyp_arch" --nodedir="$nodedir" \
      >"$log" 2>&1) || die "cross-compiling $pkg_name for $1 failed; the end of its log:
$(tail -15 "$log")"
    tmp=$(mktemp -d "$cache/.$key.XXXXXX")
    find "$src/build/Release" -maxdepth 1 -name '*.node' -exec cp {} "$tmp/" \;
    [ -n "$(ls "$tmp")" ] || die "cross-compiling $pkg_name for $1 made no .node file"
    chmod 755 "$tmp"
    mv "$tmp" "$entry"
  ) 9>"$cache/.$key.lock" || { rm -f "$cache/.$key.lock"; exit 1; }
  rm -f "$cache/.$key.lock"
  echo "$entry"
}

# Checks that every .node file of the release in $2 is a Linux ELF for the architecture $1.
check_elf() {
  node -e '
    const { readFileSync, readdirSync } = require("node:fs");
    const { join } = require("node:path");
    const [arch, dir] = process.argv.slice(1);
    // ELF class (1: 32-bit, 2: 64-bit) and e_machine; for ARM, e_flags: EABI version 5, hard-float calls.
    const want = { x64: [2, 62, "x86-64"], arm64: [2, 183, "AArch64"], armhf: [1, 40, "ARM"] }[arch];
    const files = [];
    const walk = (d) => {
      for (const e of readdirSync(d, { withFileTypes: true })) {
        if (e.isDirectory()) walk(join(d, e.name));
        else if (e.name.endsWith(".node")) files.push(join(d, e.name));
      }
    };
    walk(dir);
    let bad = 0;
    for (const f of files) {
      const b = readFileSync(f);
      const elf = b.length > 52 && b.toString("latin1", 0, 4) === "\x7fELF" && b[5] === 1;
      const cls = b[4];
      const machine = elf ? b.readUInt16LE(18) : -1;
      const flags = elf ? b.readUInt32LE(cls === 1 ? 36 : 48) : 0;
      const ok = elf && cls === want[0] && machine === want[1] &&
        (arch !== "armhf" || ((flags & 0xff000000) === 0x05000000 && (flags & 0x400) !== 0));
      if (!ok) {
        bad++;
        console.error(`release.sh: ${f.slice(dir.length + 1)} is not a ${want[2]} Linux binary` +
          (elf ? ` (ELF class ${cls}, machine ${machine}, flags 0x${flags.toString(16)})` : ""));
      }
    }
    if (files.length === 0) { console.error("release.sh: no .node file in the release"); process.exit(1); }
    process.exit(bad ? 1 : 0);
  ' "$1" "$2" || die "the release for $1 has native code for another CPU"
  if [ "$1" = armhf ]; then
    # ARMv7 at most, so that it runs on the oldest gateways Debian's armhf supports.
    rd=
    if [ -n "$triplet" ]; then rd=$(command -v "$triplet-readelf" || true); fi
    [ -n "$rd" ] || rd=$(command -v readelf || true)
    if [ -n "$rd" ]; then
      find "$2" -name '*.node' | while IFS= read -r f; do
        "$rd" -A "$f" | grep -Eq 'Tag_CPU_arch: v[4-7]' || die "${f#"$2"/} is built for an ARM newer than ARMv7"
      done
    fi
  fi
}

# --- one tarball per architecture ---

cache=${DEVCLOUD_CROSS_CACHE:-}
if [ -z "$cache" ]; then
  if [ -n "${XDG_CACHE_HOME:-}" ]; then cache=$XDG_CACHE_HOME/devcloud-cross
  elif [ -n "${HOME:-}" ] && [ "$HOME" != / ]; then cache=$HOME/.cache/devcloud-cross
  else cache=$root/node_modules/.cache/devcloud-cross
  fi
fi
gyp=
nodedir=
tarballs=
n=0
count=$(echo "$list" | wc -w)
for arch in $list; do
  n=$((n + 1))
  name=devcloud-$version-linux-$arch
  rel=$work/$name
  # The last architecture takes the stage itself; the others a copy of it.
  if [ "$n" = "$count" ]; then mv "$stage" "$rel"; else cp -PRp "$stage" "$rel"; fi

  if [ "$arch" = "$host" ]; then
    # As `npm ci` built them, for this machine's Node.js.
    node_version=$(node -p process.versions.node)
    abi=$(node -p process.versions.modules)
    triplet=
  else
    toolchain "$arch"
    [ -n "$gyp" ] || gyp=$(find_gyp)
    [ -n "$nodedir" ] || nodedir=$(find_nodedir)
    node_version=$(header NODE_MAJOR_VERSION).$(header NODE_MINOR_VERSION).$(header NODE_PATCH_VERSION)
    abi=$(header NODE_MODULE_VERSION)
    [ -n "$abi" ] || die "no NODE_MODULE_VERSION in $nodedir/include/node/node_version.h"
    for dir in $natives; do
      entry=$(cross_build "$arch" "$dir")
      # Only the compiled files: this machine's build (its Makefiles, its paths) goes.
      rm -rf "${rel:?}/$dir/build"
      mkdir -p "$rel/$dir/build/Release"
      cp "$entry"/*.node "$rel/$dir/build/Release/"
    done
  fi
  check_elf "$arch" "$rel"
  if [ -n "$qemu_root" ]; then
    # Debian 12 names qemu-user-static's programs qemu-<cpu>-static; Debian 13's qemu-user has them as qemu-<cpu>.
    if command -v "$qemu-static" >/dev/null 2>&1; then qemu=$qemu-static; fi
    command -v "$qemu" >/dev/null 2>&1 || die "$qemu-static is missing, for --qemu-root: apt-get install qemu-user-static"
    say "loading the native modules and starting the CLIs under $qemu"
    run_qemu() { "$qemu" -L "$qemu_root" "$qemu_root/usr/bin/node" "$@"; }
    (cd "$rel" && run_qemu -e "$LOAD_CHECK") || die "the native modules do not load under $qemu with $qemu_root's node"
    (cd "$work" && run_qemu "$rel/dist/agent/main.js" --help >/dev/null &&
      run_qemu "$rel/dist/bridge/main.js" --help >/dev/null) || die "the CLIs do not start under $qemu"
  fi

  # What this release was built for: the native modules need the same CPU architecture and Node.js ABI.
  printf 'version=%s\ncommit=%s\nplatform=linux-%s\nnode=%s\nnode_abi=%s\nbuilt=%s\n' "$version" "$commit" \
    "$(node_arch "$arch")" "$node_version" "$abi" "$(date -u +%Y-%m-%dT%H:%M:%SZ)" >"$rel/RELEASE"

  say "packing $name.tar.gz"
  tarball=$out/$name.tar.gz
  # Owned by root in the archive: installed as root, the files keep that owner.
  tar -C "$work" --owner=0 --group=0 --numeric-owner --sort=name -czf "$tarball.tmp" "$name"
  mv "$tarball.tmp" "$tarball"
  rm -rf "$rel"
  tarballs="$tarballs $tarball"
done
for t in $tarballs; do echo "$t"; done
