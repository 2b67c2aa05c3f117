#!/usr/bin/env bash
# Install configurable-http-proxy (JupyterHub's default proxy, an npm package) for the hub
# tests into .venv/hub-proxy, exactly as locked in environment/hub/proxy/package-lock.json.
# Idempotent and quiet: re-runs npm only when the lock file changed. Needs Node 20+ and npm.
set -euo pipefail
cd "$(dirname "$0")/.."
src=environment/hub/proxy
dest=.venv/hub-proxy
stamp="$dest/.lock-$(sha256sum "$src/package-lock.json" | cut -c1-16)"
if [ -f "$stamp" ] && [ -x "$dest/node_modules/.bin/configurable-http-proxy" ]; then
    exit 0
fi
if ! command -v npm >/dev/null; then
    echo "[setup] npm is missing: install Node.js 20+ (apt-get install nodejs npm) for the JupyterHub tests" >&2
    exit 1
fi
echo "[setup] installing configurable-http-proxy into $dest (npm ci)"
mkdir -p "$dest"
cp "$src/package.json" "$src/package-lock.json" "$dest/"
# --engine-strict=false: commander (a dependency) declares Node 22 but runs on Node 20,
# which the hub test proves by starting the proxy.
npm ci --prefix "$dest" --no-audit --no-fund --loglevel=error --engine-strict=false >/dev/null
rm -f "$dest"/.lock-*
touch "$stamp"
