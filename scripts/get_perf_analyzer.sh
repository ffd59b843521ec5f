#!/usr/bin/env bash
# Fetch Triton's perf_analyzer without a GPU: the binary ships inside the tritonclient
# 2.41.0 manylinux wheel; it needs Debian's libb64-0d and libcudart.so.12 (from the PyPI
# package nvidia-cuda-runtime-cu12, pinned like the wheel) and then runs on a CPU-only machine.
# Installs into .tools/ and writes .tools/bin/perf_analyzer, a wrapper that sets
# LD_LIBRARY_PATH. Usage: scripts/get_perf_analyzer.sh [PYTHON]
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${1:-.venv/bin/python}"
DEST=.tools/perf_analyzer
WRAPPER=.tools/bin/perf_analyzer

if [ -x "$WRAPPER" ] && "$WRAPPER" --version >/dev/null 2>&1; then
    exit 0
fi
if ! dpkg -s libb64-0d >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ]; then
        apt-get install -y -qq libb64-0d >/dev/null 2>&1 || {
            apt-get update -qq && apt-get install -y -qq libb64-0d >/dev/null; }
    else
        echo "perf_analyzer needs Debian's libb64-0d: sudo apt-get install libb64-0d" >&2
        exit 1
    fi
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
"$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: \
    --platform manylinux1_x86_64 "tritonclient==2.41.0" -d "$work"
"$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: \
    --platform manylinux2014_x86_64 "nvidia-cuda-runtime-cu12==12.9.79" -d "$work"
mkdir -p "$DEST" "$(dirname "$WRAPPER")"
unzip -o -q "$work"/tritonclient-2.41.0-*.whl 'tritonclient-2.41.0.data/data/bin/perf_analyzer' -d "$work"
install -m 755 "$work/tritonclient-2.41.0.data/data/bin/perf_analyzer" "$DEST/perf_analyzer"
unzip -o -q "$work"/nvidia_cuda_runtime_cu12-*.whl 'nvidia/cuda_runtime/lib/libcudart.so.12' -d "$work"
install -m 644 "$work/nvidia/cuda_runtime/lib/libcudart.so.12" "$DEST/libcudart.so.12"
cat > "$WRAPPER" <<WRAP
#!/usr/bin/env bash
export LD_LIBRARY_PATH="$(pwd)/$DEST\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
exec "$(pwd)/$DEST/perf_analyzer" "\$@"
WRAP
chmod +x "$WRAPPER"
"$WRAPPER" --version >/dev/null 2>&1 || { echo "perf_analyzer does not run here" >&2; exit 1; }
echo "perf_analyzer: $WRAPPER"
