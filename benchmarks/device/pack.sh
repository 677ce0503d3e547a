#!/usr/bin/env bash
# Run here, on the CPU machine, after `make test` (it reads .venv): builds what the device calls
# carry, in folders of the checkout that .git/info/exclude ignores. A call carries 64 MiB at most,
# the working tree included, and the default model's GGUF file alone is 98 MB, so it travels in
# two parts, in two calls made back to back (the first part waits in the device's /tmp, which
# lasts while the machine stays warm):
#   .whl  rolecast's wheel, and the Python packages the GPU image lacks, at the versions .venv
#         has (cp312 wheels: the image's Python is 3.12), trl and datasets for grpo_vs_trl
#   .m1   the first part of the GGUF file, and the model's config and tokenizer files (cfg/:
#         enough for random weights of SmolLM2's shape)
#   .m2   the second part
#   .ray  with `pack.sh ray`: Ray for the scale stage, which the image lacks (its wheel is 79 MB:
#         unpacked without its Java jars and web UI, and xz-compressed, 30 MB), for a third call
# Then: benchmarks/device/check.sh, run there (docs/gpu.md, "Checking a change on the lent H100").
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=.venv/bin/python
[ -x "$PY" ] || { echo "pack.sh: run 'make test' first (it builds .venv)" >&2; exit 2; }
EXCLUDE=$(git rev-parse --git-path info/exclude)  # in a worktree .git is a file, not the folder
mkdir -p "$(dirname "$EXCLUDE")"
for d in .whl .m1 .m2 .ray; do grep -qx "/$d/" "$EXCLUDE" 2>/dev/null || echo "/$d/" >> "$EXCLUDE"; done
rm -rf .whl .m1 .m2 .ray && mkdir -p .whl .m1/cfg .m2

deps=(pydantic pydantic-core annotated-types typing-inspection jsonschema jsonschema-specifications referencing
      rpds-py jsonschema-rs structlog xgrammar apache-tvm-ffi gguf trl datasets dill multiprocess)
pins() { "$PY" -c "import importlib.metadata as m, sys; print(*(f'{n}=={m.version(n)}' for n in sys.argv[1:]))" "$@"; }
read -ra pins <<< "$(pins "${deps[@]}")"
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 -d .whl "${pins[@]}" 2>&1 | grep -v "^WARNING: Location" || true
[ "$(ls .whl | wc -l)" -eq "${#deps[@]}" ] || { echo "pack.sh: expected ${#deps[@]} wheels in .whl, got $(ls .whl | wc -l)" >&2; exit 1; }
"$PY" -m pip wheel -q --no-deps . -w .whl 2>&1 | grep -v "^WARNING: Location" || true

# The model: its converted checkpoint's config and tokenizer files, and the GGUF file in two parts
# sized so that each call stays under the limit with the working tree and .whl beside it.
ckpt=$("$PY" -c "from orchestrator.models import checkpoint_dir; print(checkpoint_dir())")  # converts it once
cp "$ckpt"/*.json "$ckpt"/*.jinja .m1/cfg/
gguf=$("$PY" -c "from orchestrator.models import _GGUF_FILE, _gguf_dir; print(_gguf_dir() / _GGUF_FILE)")
# a call's budget: 64 MiB less 2 MiB of slack, less the working tree (tracked and untracked files)
budget=$(( 62 * 1024 * 1024 - $( { git ls-files -z; git ls-files -z --others --exclude-standard; } | du -cb --files0-from=- | tail -1 | cut -f1) ))
room=$(( budget - $(du -cb .whl .m1/cfg | tail -1 | cut -f1) ))
[ $(( $(stat -c %s "$gguf") - room )) -lt "$budget" ] || { echo "pack.sh: the GGUF file would need three calls" >&2; exit 1; }
head -c "$room" "$gguf" > .m1/gg.00
tail -c +$(( room + 1 )) "$gguf" > .m2/gg.01
md5sum "$gguf" | cut -d' ' -f1 > .m2/gg.md5
if [ "${1:-}" = ray ]; then
  tmp=$(mktemp -d)
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux2014_x86_64 -d "$tmp" "$(pins ray)" \
    2>&1 | grep -v "^WARNING: Location" || true
  mkdir -p "$tmp/site" .ray && (cd "$tmp/site" && unzip -q "$tmp"/ray-*.whl && rm -rf ray/jars ray/dashboard/client/build)
  tar -C "$tmp/site" -cf - . | xz -T0 -6 > .ray/ray.tar.xz
  rm -rf "$tmp"
fi
du -sh .whl .m1 .m2 .ray 2>/dev/null
