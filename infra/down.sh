#!/usr/bin/env bash
# Stops what infra/up.sh started.
set -euo pipefail
