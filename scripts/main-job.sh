#!/usr/bin/env bash
# The main job behind `make run`.
set -euo pipefail
build="${1:-build}"
"$build/regen" demo
