#!/usr/bin/env bash
# The npm packages of the project in the current directory (infra/setup.sh runs it; a test runs it on a tiny
# project of its own). `npm ci` when package-lock.json differs from the copy stamped at the last install; when
# node_modules already satisfies package.json (`npm ls` is clean) the stamp is just refreshed: `npm ci` deletes
# node_modules, which would break other processes using this tree for no gain.
#
# A clean clone takes the packages from the per-user cache when one was installed from this same lockfile on
# this Node and platform: hard links (`cp -al`, about 10 s for 1.4 GB) instead of `npm ci` (71 s of a clean-clone CI
# run). The cache is filled by copying a fresh `npm ci`, never by linking it, and holds no stamp (the stamp is the
# tree's own), but a linked file is one file: a change to it in any clone, or in the cache by hand, reaches every
# later clone. So the cache entry holds a checksum list of its files (sha-256 of each, every symbolic link's
# target, every file's mode), written when it is filled; a clone's linked tree is checked against it before it is
# used, and on any difference the entry is discarded, saying why, and `npm ci` runs instead and fills it again.
# npm replaces package files rather than writing into them, except its hidden lockfile (node_modules/.package-lock.json,
# rewritten in place by `npm install`, seen changing the cache through the link): a clone gets a copy of that one.
#
# Usage: bash infra/npm-packages.sh             install as above
#        bash infra/npm-packages.sh manifest DIR  print DIR's checksum list (a node_modules directory)
# or sourced (infra/setup.sh), then npm_packages: a function npm_after_install, if defined, runs after `npm ci`
# and before the cache is filled (setup checks that chDB's optional native library was unpacked).
set -euo pipefail

say() { echo "setup: $*" >&2; }
step_started=0
step() { say "$* …"; step_started=$(date +%s); }
step_done() { say "  done in $(($(date +%s) - step_started))s"; }

# The checksum list of a node_modules directory, paths relative to it, in a fixed order. openssl's sha-256 uses the
# CPU's SHA instructions (1.4 GB in 1.4 s of CPU here, against 8 s for coreutils' sha256sum, which stands in where
# openssl is missing); both are printed as `<sha-256> <path>`.
npm_manifest() {
  local dir=$1
  (
    cd "$dir"
    if command -v openssl >/dev/null 2>&1; then
      find . -type f -print0 | LC_ALL=C sort -z | xargs -0 -r openssl dgst -sha256 -r | sed -E 's/^([0-9a-f]{64}) \*/\1 /'
    else
      find . -type f -print0 | LC_ALL=C sort -z | xargs -0 -r sha256sum | sed -E 's/^\\?([0-9a-f]{64})  /\1 /'
    fi
    find . -type l -printf 'link %p -> %l\n' | LC_ALL=C sort
    find . ! -type l ! -type d ! -type f -printf 'other %y %p\n' | LC_ALL=C sort
    find . -type f -printf 'mode %m %p\n' | LC_ALL=C sort
  )
}

# Move a cache entry out of the way (one rename, so no setup ever links a half-deleted one), then delete it.
npm_cache_discard() {
  local entry=$1 why=$2
  say "the npm package cache $entry failed its integrity check ($why): discarded; installing with npm ci instead, which fills it again"
  local gone="$entry.discarded.$$"
  if mv -T "$entry" "$gone" 2>/dev/null; then rm -rf "$gone"; fi
}

# Link the cache entry's packages into ./node_modules if every file matches its checksum list; 1 if not used.
npm_cache_restore() {
  local entry=$1
  if [ ! -f "$entry/complete" ] || [ ! -d "$entry/node_modules" ]; then
    npm_cache_discard "$entry" "it is incomplete"
    return 1
  fi
  if [ ! -f "$entry/manifest" ]; then
    npm_cache_discard "$entry" "it has no checksum list: filled before the check existed"
    return 1
  fi
  step "linking the npm packages installed from this same lockfile from $entry, each file checked against its checksum list"
  rm -rf node_modules.partial
  if ! cp -al "$entry/node_modules" node_modules.partial 2>/dev/null; then
    rm -rf node_modules.partial
    say "  could not link from $entry (another setup discarding it?): installing with npm ci"
    return 1
  fi
  # The linked tree is checked, not the entry: what this clone uses is exactly what was checked.
  local found
  found=$(mktemp)
  npm_manifest node_modules.partial >"$found"
  if ! cmp -s "$found" "$entry/manifest"; then
    local first
    first=$(diff "$entry/manifest" "$found" | grep -m1 -E '^[<>]' | cut -c1-300 || true)
    rm -f "$found"
    rm -rf node_modules.partial
    npm_cache_discard "$entry" "first difference, < listed, > found: $first"
    return 1
  fi
  rm -f "$found"
  if [ -f node_modules.partial/.package-lock.json ]; then
    cp --remove-destination node_modules.partial/.package-lock.json node_modules.partial/.package-lock.json.copy
    mv -f node_modules.partial/.package-lock.json.copy node_modules.partial/.package-lock.json
  fi
  mv node_modules.partial node_modules
  step_done
}

# Copy ./node_modules (a fresh npm ci) into the cache entry with its checksum list.
npm_cache_fill() {
  local entry=$1
  step "keeping a copy of the npm packages in $entry for the next clean clone"
  local tmp="$entry.partial.$$"
  rm -rf "$tmp" && mkdir -p "$tmp"
  # (the cache is a convenience: a full disk must not fail the setup)
  if cp -a node_modules "$tmp/node_modules" && rm -f "$tmp/node_modules/.rlstream-lock-stamp" &&
    npm_manifest "$tmp/node_modules" >"$tmp/manifest" && touch "$tmp/complete"; then
    # Another setup may have filled the same key meanwhile: the first rename wins, the copy of the other goes.
    mv -T "$tmp" "$entry" 2>/dev/null || rm -rf "$tmp"
    step_done
  else
    rm -rf "$tmp"
    say "  WARNING: the copy failed (disk full? $(df -h "$(dirname "$entry")" | awk 'NR==2 {print $4}') free there): no cache entry kept"
  fi
}

npm_packages() {
  local logs="${RLSTREAM_INFRA_DIR:-.infra}"
  mkdir -p "$logs"
  # (what infra/setup.sh exports, for a run of this script alone: onnxruntime-node's install script would download)
  export ONNXRUNTIME_NODE_INSTALL=skip
  local stamp=node_modules/.rlstream-lock-stamp
  local key
  key=$({ sha256sum package-lock.json; node -p 'process.version + process.platform + process.arch'; } | sha256sum | cut -c1-32)
  local entry="$HOME/.cache/rlstream/node_modules/$key"
  if [ ! -e node_modules ] && [ -e "$entry" ] && npm_cache_restore "$entry"; then
    cp package-lock.json "$stamp"
  fi
  if [ -f "$stamp" ] && cmp -s package-lock.json "$stamp"; then return 0; fi
  if [ -d node_modules ] && npm ls --depth=0 >/dev/null 2>&1; then
    cp package-lock.json "$stamp"
    return 0
  fi
  step "installing npm packages (npm ci; about 2 minutes on 2 cores, log in $logs/npm-ci.log)"
  # A lockfile out of step with package.json makes `npm ci` refuse; a fresh clone must still install, so fall
  # back to `npm install` (which rewrites the lockfile: commit it) with a visible warning. npm ci's refusal
  # (its whole usage text) goes to a log; its first error line is shown.
  # The lockfile lists chdb's optional macOS and linux-arm64 libraries by hand: this machine's registry does not
  # serve them (404), so `npm install` here leaves them out, and `npm ci` then refuses the lockfile. On this
  # platform npm skips them (os/cpu), so no download is needed. An `npm install` that drops them again shows up
  # here as this warning: put the three entries back (version, os, cpu, optional).
  if ! npm ci --no-audit --no-fund --loglevel=error >"$logs/npm-ci.log" 2>&1; then
    say "WARNING: npm ci refused ($(grep -m1 -E 'npm (error|ERR!) (Missing|Invalid|code)' "$logs/npm-ci.log" || echo "see $logs/npm-ci.log")); running npm install"
    npm install --no-audit --no-fund --loglevel=error
  fi
  if declare -F npm_after_install >/dev/null; then npm_after_install; fi
  step_done
  if [ ! -f "$entry/complete" ] && [ ! -L node_modules ]; then npm_cache_fill "$entry"; fi
  cp package-lock.json "$stamp"
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  case "${1:-install}" in
    install) npm_packages ;;
    manifest) npm_manifest "$2" ;;
    *) echo "usage: $0 [install | manifest DIR]" >&2; exit 2 ;;
  esac
fi
