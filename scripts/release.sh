#!/bin/sh
# Builds the release tarball devcloud-<version>.tar.gz: dist/ compiled from this checkout, the production
# node_modules (native modules built for this machine's architecture and Node.js), the systemd units, config
# examples, docs, README.md, package.json and scripts/install.sh. Works offline: the production node_modules is
# a pruned copy of the checkout's, so run `npm ci` (or `npm install`) once before.
#
# Usage: scripts/release.sh [--out DIR]      (default DIR: release/ in the checkout)
# Prints the tarball's path as its last line. docs/operations.md, "Install, upgrade, uninstall", explains it.
set -eu

usage() {
  sed -n '2,8s/^# \{0,1\}//p' "$0"
}

die() {
  echo "release.sh: $*" >&2
  exit 1
}

root=$(cd "$(dirname "$0")/.." && pwd)
out=$root/release
while [ $# -gt 0 ]; do
  case $1 in
    --out) [ $# -ge 2 ] || die "--out needs a directory"; out=$2; shift 2 ;;
    --out=*) out=${1#--out=}; shift ;;
    -h | --help) usage; exit 0 ;;
    *) die "unknown argument: $1 (see --help)" ;;
  esac
done

cd "$root"
[ -x node_modules/.bin/tsc ] || die "no node_modules here: run npm ci first"
command -v node >/dev/null 2>&1 || die "node is not on PATH"
version=$(node -p 'require("./package.json").version')
name=devcloud-$version
mkdir -p "$out"
out=$(cd "$out" && pwd)

work=$(mktemp -d "${TMPDIR:-/tmp}/devcloud-release.XXXXXX")
trap 'rm -rf "$work"' EXIT INT TERM
stage=$work/$name
mkdir "$stage"
umask 022

echo "release.sh: compiling into $name/dist" >&2
# Straight into the stage, so that the checkout's own dist/ (used by npm start and tests) is left alone.
node_modules/.bin/tsc -p tsconfig.build.json --outDir "$stage/dist"
# The CLIs are run through the /usr/local/bin links by their #! line.
chmod 755 "$stage/dist/agent/main.js" "$stage/dist/bridge/main.js"

for f in config docs systemd README.md package.json package-lock.json; do
  if [ -e "$f" ]; then cp -PR "$f" "$stage/"; else echo "release.sh: warning: no $f in the checkout" >&2; fi
done
mkdir "$stage/scripts"
cp scripts/install.sh "$stage/scripts/install.sh"
chmod 755 "$stage/scripts/install.sh"

echo "release.sh: production node_modules" >&2
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
(cd "$stage" && node -e 'new (require("better-sqlite3"))(":memory:").close(); require("unix-dgram")') ||
  die "the native modules do not load from the release"
(cd "$work" && node "$stage/dist/agent/main.js" --help >/dev/null && node "$stage/dist/bridge/main.js" --help >/dev/null) ||
  die "the CLIs do not start from the release"

# What this release was built for: the native modules need the same CPU architecture and Node.js ABI.
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
node -e '
  const [version, commit] = process.argv.slice(1);
  const v = process.versions;
  process.stdout.write(`version=${version}\ncommit=${commit}\nplatform=${process.platform}-${process.arch}\n` +
    `node=${v.node}\nnode_abi=${v.modules}\nbuilt=${new Date().toISOString()}\n`);
' "$version" "$commit" >"$stage/RELEASE"

echo "release.sh: packing" >&2
tarball=$out/$name.tar.gz
# Owned by root in the archive: installed as root, the files keep that owner.
tar -C "$work" --owner=0 --group=0 --numeric-owner --sort=name -czf "$tarball.tmp" "$name"
mv "$tarball.tmp" "$tarball"
echo "$tarball"
