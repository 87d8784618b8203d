#!/usr/bin/env bash
# Sourced by hack/install-vllm-cli.sh and hack/install-sglang-cli.sh: an engine's wheel and the few
# pure packages its parser needs beyond the vLLM image's, downloaded without their dependencies for
# that image's Python (3.11) and unpacked into DIR/site. Cached: DIR/.stamp holds what was unpacked.
#
# unpack_wheels LABEL DIR STAMP "PLATFORM..." STRIP SPEC...
#   STRIP: the wheel (by name, e.g. vllm) whose shared objects are left out, "" for none.
unpack_wheels() {
  local label=$1 dir=$2 stamp=$3 platforms=$4 strip=$5
  shift 5
  if [[ -f $dir/.stamp && "$(cat "$dir/.stamp")" == "$stamp" ]]; then
    echo "$label up to date in $dir"
    return 0
  fi
  local args=() platform
  for platform in $platforms; do args+=(--platform "$platform"); done
  rm -rf "$dir" && mkdir -p "$dir/wheels" "$dir/site"
  python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.11 \
    "${args[@]}" --implementation cp -d "$dir/wheels" "$@"
  python3 - "$dir/site" "$strip" "$dir"/wheels/*.whl <<'PY'
import sys, zipfile
site, strip, wheels = sys.argv[1], sys.argv[2], sys.argv[3:]
for path in wheels:
    with zipfile.ZipFile(path) as wheel:
        names = wheel.namelist()
        if strip and path.rsplit("/", 1)[-1].startswith(strip + "-"):
            names = [name for name in names if not name.endswith(".so")]
        wheel.extractall(site, names)
PY
  rm -rf "$dir/wheels"
  echo "$stamp" > "$dir/.stamp"
  echo "$label unpacked into $dir/site"
}
