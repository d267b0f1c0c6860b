#!/usr/bin/env bash
# bubblewrap on a node without apt or root: unpack Debian packages into a folder and print the
# folder to put on PATH.
#   here:   mkdir -p DEBS && (cd DEBS && apt-get download bubblewrap libcap2 libselinux1 libpcre2-8-0)
#   there:  export PATH=$(bash scripts/bwrap_from_deb.sh DEBS /var/tmp/atlas-bwrap):$PATH
# Where the node lacks one of the libraries bwrap links, a wrapper runs it with the unpacked ones.
# bwrap must stay readable and runnable by the sandbox's unprivileged uid, hence a+rX.
set -euo pipefail
debs=${1:?DEBS folder} dest=${2:?DEST folder}
mkdir -p "$dest" && chmod 755 "$dest"
for deb in "$debs"/*.deb; do
    if command -v dpkg > /dev/null; then
        dpkg -x "$deb" "$dest"
    else  # an ar archive holding data.tar.*
        python3 - "$deb" "$dest" << 'PY'
import io, sys, tarfile
data, pos = open(sys.argv[1], "rb").read(), 8
while pos < len(data):
    name, size = data[pos:pos + 16].strip().decode(), int(data[pos + 48:pos + 58])
    if name.startswith("data.tar"):
        tarfile.open(fileobj=io.BytesIO(data[pos + 60:pos + 60 + size])).extractall(sys.argv[2])
    pos += 60 + size + (size & 1)
PY
    fi
done
chmod -R a+rX "$dest"
bin=$dest/usr/bin
if ldd "$bin/bwrap" | grep -q "not found"; then
    lib="$dest/lib/x86_64-linux-gnu:$dest/usr/lib/x86_64-linux-gnu"
    mkdir -p "$dest/bin"
    printf '#!/bin/sh\nLD_LIBRARY_PATH=%s exec %s "$@"\n' "$lib" "$bin/bwrap" > "$dest/bin/bwrap"
    chmod 755 "$dest/bin/bwrap"
    bin=$dest/bin
fi
"$bin/bwrap" --version >&2
echo "$bin"
