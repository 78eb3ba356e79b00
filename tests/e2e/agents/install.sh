#!/usr/bin/env bash
# Installs the pinned agent clients (package.json + package-lock.json beside this script:
# the one place their versions are written) and prints the directory of their executables.
# Called by .ci/run before the suite and by tests/e2e/test_agent_clients.py (a no-op once
# installed). The install is kept under ~/.cache/kvserve/agents/<sha256 of package.json and the lock>, so a
# later run skips the download (about 30 s, 1.3 GB unpacked) and a changed pin gets a fresh
# directory. `npm install` beside the lock file installs the lock's versions and checks their
# integrity hashes (not `npm ci`: npm 11 refuses this lock as "out of sync" over the other
# platforms' optional packages it leaves out). Two install scripts must run (package.json's
# allowScripts names them for npm 11): Claude Code's and opencode's postinstall steps copy
# their platform's native binary over a placeholder `bin` entry.
# Node 20 is enough although Claude Code and Qwen Code declare node >= 22: both run on it.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
key=$(cat "$here/package.json" "$here/package-lock.json" | sha256sum | cut -c1-16)
dest="$HOME/.cache/kvserve/agents/$key"
if [ ! -d "$dest" ]; then
    mkdir -p "$HOME/.cache/kvserve/agents"
    work=$(mktemp -d "$HOME/.cache/kvserve/agents/.install-XXXXXX")
    trap 'rm -rf "$work"' EXIT
    cp "$here/package.json" "$here/package-lock.json" "$work/"
    (cd "$work" && npm install --no-audit --no-fund --loglevel=error >&2)
    # Another install may have finished first: keep it, drop this one.
    mv -T "$work" "$dest" 2>/dev/null || true
fi
echo "$dest/node_modules/.bin"
