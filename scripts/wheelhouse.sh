#!/usr/bin/env bash
# A wheelhouse for a GPU node without a package index: build it where pip can reach one, install it
# on the node from local files only.
#
#   [PYTHON=.venv/bin/python] scripts/wheelhouse.sh build LIST DIR [PYTHON_VERSION]
#       Downloads every `name==version` line of LIST (comments and blank lines skipped) as a binary
#       wheel for CPython PYTHON_VERSION (default 3.12) on manylinux x86-64, without dependencies
#       (LIST is the whole closure: name each one), into DIR, then writes DIR/SHA256SUMS.
#   scripts/wheelhouse.sh install DIR TARGET
#       Checks DIR/SHA256SUMS, then installs every wheel of DIR into TARGET with no index and no
#       dependency resolution (the list fixed the versions), without byte-compiling. Put TARGET first
#       on PYTHONPATH: its packages then win over the node's own (transformers, tokenizers, ...).
#   scripts/wheelhouse.sh split DIR PARTS_DIR [SIZE]
#       One tar of DIR cut into SIZE pieces (default 60M) with PARTS_DIR/SHA256SUMS, for a channel
#       that carries at most so much at a time; `join PARTS_DIR DIR` puts the wheelhouse back.
set -euo pipefail

platforms=()
for n in 17 24 27 28 31 34 35; do platforms+=(--platform "manylinux_2_${n}_x86_64"); done
platforms+=(--platform manylinux2014_x86_64 --platform manylinux1_x86_64)

list_names() { sed -e 's/#.*//' -e 's/[[:space:]]//g' "$1" | grep -v '^$'; }

case "${1:-}" in
build)
    list=$2 dir=$3 py=${4:-3.12}
    mkdir -p "$dir"
    bad=$(list_names "$list" | grep -v -E '^[A-Za-z0-9._-]+==[^=]+$' || true)
    if [[ -n $bad ]]; then
        echo "wheelhouse: $list: every line must pin one version (name==version); found: $bad" >&2
        exit 2
    fi
    dupes=$(list_names "$list" | sed 's/==.*//' | tr 'A-Z_.' 'a-z--' | sort | uniq -d)
    if [[ -n $dupes ]]; then
        echo "wheelhouse: $list names these twice (one version each, or the install stops): $dupes" >&2
        exit 2
    fi
    for pin in $(list_names "$list"); do
        # a package published as source only (antlr4-python3-runtime 4.9.3) is built here into a
        # wheel; that is right only for pure-Python ones, which pip names py3-none-any
        "${PYTHON:-python3}" -m pip download -q --no-deps --only-binary=:all: --python-version "$py" --implementation cp \
            "${platforms[@]}" -d "$dir" "$pin" 2>/dev/null ||
            "${PYTHON:-python3}" -m pip wheel -q --no-deps -w "$dir" "$pin" || {
            echo "wheelhouse: no wheel for $pin" >&2
            exit 1
        }
    done
    impure=$(cd "$dir" && ls -- *.whl | grep -v -E -- '-(py3[0-9]*-none|py2.py3-none|py37-none|cp'"${py/./}"'-|cp3[0-9]*-abi3)' || true)
    if [[ -n $impure ]]; then
        echo "wheelhouse: wheels built for another Python than $py: $impure" >&2
        exit 1
    fi
    (cd "$dir" && sha256sum -- *.whl > SHA256SUMS)
    echo "wheelhouse: $(ls "$dir"/*.whl | wc -l) wheels, $(du -sh "$dir" | cut -f1) in $dir"
    ;;
install)
    dir=$2 target=$3
    (cd "$dir" && sha256sum --quiet -c SHA256SUMS)
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$target" "$dir"/*.whl
    echo "wheelhouse: installed $(ls "$dir"/*.whl | wc -l) wheels into $target"
    ;;
split)
    dir=$2 parts=$3 size=${4:-60M}
    mkdir -p "$parts"
    tar -C "$dir" -cf - . | split -b "$size" -d -a 2 - "$parts/wheelhouse.tar."
    (cd "$parts" && sha256sum -- wheelhouse.tar.* > SHA256SUMS)
    echo "wheelhouse: $(ls "$parts"/wheelhouse.tar.* | wc -l) parts in $parts"
    ;;
join)
    parts=$2 dir=$3
    (cd "$parts" && sha256sum --quiet -c SHA256SUMS)
    mkdir -p "$dir"
    cat "$parts"/wheelhouse.tar.* | tar -C "$dir" -xf -
    echo "wheelhouse: joined $(ls "$parts"/wheelhouse.tar.* | wc -l) parts into $dir"
    ;;
*)
    sed -n '2,20p' "$0" >&2
    exit 2
    ;;
esac
