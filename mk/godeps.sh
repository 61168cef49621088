#!/usr/bin/env bash
# mk/godeps.sh OUT PKG...: writes OUT.d, a make rule that names every file
# of this module the Go build of PKG reads (Go, cgo, C, headers, assembly,
# embedded files), each of those packages' directories (so that a file added
# or removed counts too), go.mod and go.sum; plus an empty rule per file, so
# that a deleted file makes OUT stale instead of stopping make. Packages from
# the module cache are covered by go.sum. GO and TAGS come from the
# environment, as the Makefile sets them.
set -euo pipefail
out=$1
shift
tmpl='{{if and .Module .Module.Main}}{{$d := .Dir}}{{$d}}
{{range .GoFiles}}{{$d}}/{{.}}
{{end}}{{range .CgoFiles}}{{$d}}/{{.}}
{{end}}{{range .CFiles}}{{$d}}/{{.}}
{{end}}{{range .HFiles}}{{$d}}/{{.}}
{{end}}{{range .SFiles}}{{$d}}/{{.}}
{{end}}{{range .EmbedFiles}}{{$d}}/{{.}}
{{end}}{{end}}'
deps=$("${GO:-go}" list -deps -tags "${TAGS:-}" -f "$tmpl" "$@" | sort -u)
tmp=$(mktemp "$out.d.XXXXXX")
{
  printf '%s: go.mod go.sum' "$out"
  for d in $deps; do printf ' \\\n  %s' "$d"; done
  printf '\n'
  for d in $deps; do printf '%s:\n' "$d"; done
} >"$tmp"
mv "$tmp" "$out.d"
