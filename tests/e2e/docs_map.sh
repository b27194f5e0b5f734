#!/bin/bash
# docs/map-of-the-code.md names folders in backquotes (`core/`, `plugins/strategies/ddp/`); each
# must exist in the source tree, so the map cannot outlive the layout it describes.
#   docs_map.sh <source dir>
set -u
src=$1
map=$src/docs/map-of-the-code.md
[ -f "$map" ] || { echo "FAIL: $map is missing"; exit 1; }
# A folder is a backquoted path that ends in '/', made of path characters only.
mapfile -t folders < <(grep -o '`[A-Za-z0-9_.-][A-Za-z0-9_./-]*/`' "$map" | tr -d '`' | sort -u)
if [ "${#folders[@]}" -lt 10 ]; then
  echo "FAIL: only ${#folders[@]} folders found in $map; the check would prove nothing"
  exit 1
fi
missing=0
for d in "${folders[@]}"; do
  if [ ! -d "$src/$d" ]; then
    echo "FAIL: docs/map-of-the-code.md names $d, which is not a folder of the tree"
    missing=$((missing + 1))
  fi
done
[ "$missing" -eq 0 ] || exit 1
echo "ok: ${#folders[@]} folders named by docs/map-of-the-code.md exist"
