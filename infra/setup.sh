#!/usr/bin/env bash
# One-time, idempotent installation of everything rlstream needs on this machine. Safe to run repeatedly:
# each step checks whether its result is already there.
set -euo pipefail
cd "$(dirname "$0")/.."

# npm packages: reinstall only when the lockfile changed since the last install.
stamp=node_modules/.rlstream-lock-stamp
if [ ! -f "$stamp" ] || ! cmp -s package-lock.json "$stamp"; then
  npm ci --no-audit --no-fund
  cp package-lock.json "$stamp"
fi
