# pgdg-key.sh URL FINGERPRINT DEST, run by roles/postgresql.py (see roles/scripts.py).
# Installs the PGDG apt signing key at DEST only if the key downloaded from URL has the pinned
# FINGERPRINT (it is a key, not a fixed file: its sha256 changes when PGDG extends its expiry).
url=$1 fingerprint=$2 dest=$3
part="$dest.download"
mkdir -p "$(dirname "$dest")" || exit 1
if curl -fsSL -o "$part" "$url" &&
    gpg --show-keys --with-colons "$part" | grep -q "^fpr:*$fingerprint:"; then
    mv -f "$part" "$dest"
else
    rm -f "$part"
    echo "PGDG key: download from $url failed or its fingerprint is not $fingerprint" >&2
    exit 1
fi
