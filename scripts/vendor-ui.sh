#!/usr/bin/env bash
# Refresh the run console's and the API docs' (/docs, /redoc) vendored JavaScript
# (api/static/vendor/) from the npm registry. The console and the docs work offline, load nothing
# from a CDN and need no Node at run time: these files ship in the package.
# Node/npm are needed only to run this script. Bump a version here, run it, commit the result.
#
#   scripts/vendor-ui.sh
set -euo pipefail

UPLOT_VERSION=1.6.32    # charts: https://github.com/leeoniya/uPlot (MIT)
JSYAML_VERSION=5.5.0    # YAML → JSON for the policy validator: https://github.com/nodeca/js-yaml (MIT)
SWAGGER_UI_VERSION=5.35.0  # /docs: https://github.com/swagger-api/swagger-ui (Apache-2.0)
REDOC_VERSION=2.5.4        # /redoc: https://github.com/Redocly/redoc (MIT)

here="$(cd "$(dirname "$0")/.." && pwd)"
dest="$here/api/static/vendor"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

cd "$work"
# npm pack checks each tarball against the registry's integrity hash.
npm pack --silent "uplot@$UPLOT_VERSION" "js-yaml@$JSYAML_VERSION" "swagger-ui-dist@$SWAGGER_UI_VERSION" \
  "redoc@$REDOC_VERSION" >/dev/null

unpack() {  # tarball → directory
  mkdir -p "$2" && tar xzf "$1" -C "$2" --strip-components=1
}
unpack "uplot-$UPLOT_VERSION.tgz" uplot
unpack "js-yaml-$JSYAML_VERSION.tgz" js-yaml
unpack "swagger-ui-dist-$SWAGGER_UI_VERSION.tgz" swagger-ui
unpack "redoc-$REDOC_VERSION.tgz" redoc

rm -rf "$dest"
mkdir -p "$dest/uplot" "$dest/js-yaml" "$dest/swagger-ui" "$dest/redoc"
cp uplot/dist/uPlot.iife.min.js uplot/dist/uPlot.min.css uplot/LICENSE "$dest/uplot/"
cp js-yaml/LICENSE "$dest/js-yaml/"
# The source map is not shipped: drop the comment that points at it (a browser's developer tools
# would otherwise ask the service for a file it does not have).
sed '/^\/\/# sourceMappingURL=/d' js-yaml/dist/browser/js-yaml.umd.min.js > "$dest/js-yaml/js-yaml.min.js"
# The API docs: the two bundles a page needs (the pages and their start-up script are ours:
# api/pages.py, api/static/docs.js), without source maps.
cp swagger-ui/LICENSE swagger-ui/NOTICE "$dest/swagger-ui/"
sed 's|//# sourceMappingURL=[^ ]*$||' swagger-ui/swagger-ui-bundle.js > "$dest/swagger-ui/swagger-ui-bundle.js"
sed 's|/\*# sourceMappingURL=[^ ]*\*/$||' swagger-ui/swagger-ui.css > "$dest/swagger-ui/swagger-ui.css"
cp redoc/LICENSE "$dest/redoc/"
sed 's|//# sourceMappingURL=[^ ]*$||' redoc/bundles/redoc.standalone.js > "$dest/redoc/redoc.standalone.js"

{
  echo "# Vendored by scripts/vendor-ui.sh from the npm registry; do not edit by hand."
  for pkg in "uplot@$UPLOT_VERSION" "js-yaml@$JSYAML_VERSION" "swagger-ui-dist@$SWAGGER_UI_VERSION" \
             "redoc@$REDOC_VERSION"; do
    echo "$pkg $(npm view --silent "$pkg" dist.integrity)"
  done
} > "$dest/VERSIONS"
echo "vendored into $dest:"
( cd "$dest" && find . -type f | sort )
