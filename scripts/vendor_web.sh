#!/usr/bin/env bash
# Re-vendor the dashboard's front-end libraries from the npm registry, at the pinned versions below,
# into broker/web/static/vendor/ with their licences. The dashboard loads nothing from a CDN.
set -euo pipefail
cd "$(dirname "$0")/.."
HTMX=2.0.4
UPLOT=1.6.32
dest=broker/web/static/vendor
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
(cd "$work" && npm pack --silent "htmx.org@$HTMX" "uplot@$UPLOT" >/dev/null)
mkdir -p "$dest"
tar -xzf "$work/htmx.org-$HTMX.tgz" -C "$work" && mv "$work/package" "$work/htmx"
tar -xzf "$work/uplot-$UPLOT.tgz" -C "$work" && mv "$work/package" "$work/uplot"
cp "$work/htmx/dist/htmx.min.js" "$dest/htmx.min.js"
cp "$work/htmx/LICENSE" "$dest/htmx.LICENSE"
cp "$work/uplot/dist/uPlot.iife.min.js" "$dest/uPlot.iife.min.js"
cp "$work/uplot/dist/uPlot.min.css" "$dest/uPlot.min.css"
cp "$work/uplot/LICENSE" "$dest/uPlot.LICENSE"
printf 'htmx.org %s\nuplot %s\n' "$HTMX" "$UPLOT" > "$dest/VERSIONS"
echo "vendored htmx.org $HTMX and uplot $UPLOT into $dest"
