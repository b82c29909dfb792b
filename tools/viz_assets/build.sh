#!/usr/bin/env bash
# Rebuild irkit/viz/assets/dagre.min.js (and its license) from the npm registry, pinned by
# package-lock.json. Needs node/npm only here, never at run time: the asset is committed and
# inlined into every HTML page. Usage: bash tools/viz_assets/build.sh
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
assets="$here/../../irkit/viz/assets"
cd "$here"
npm ci --no-audit --no-fund --ignore-scripts
src=node_modules/@dagrejs/dagre
cp "$src/dist/dagre.min.js" "$assets/dagre.min.js"
# The bundle holds dagre and its one dependency @dagrejs/graphlib (both MIT): both notices.
{ cat "$src/LICENSE"; echo; echo "--- @dagrejs/graphlib (bundled inside dagre.min.js) ---"; cat node_modules/@dagrejs/graphlib/LICENSE; } > "$assets/dagre.LICENSE"
version="$(node -p "require('./$src/package.json').version")"
sha="$(sha256sum "$assets/dagre.min.js" | cut -d' ' -f1)"
printf '@dagrejs/dagre %s (MIT), dist/dagre.min.js, sha256 %s\n' "$version" "$sha" > "$assets/dagre.VERSION"
rm -rf node_modules
echo "bundled @dagrejs/dagre $version into irkit/viz/assets"
