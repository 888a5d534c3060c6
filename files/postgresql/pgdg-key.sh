# pgdg-key.sh URL FINGERPRINT DEST, run by roles/postgresql/server.py (see roles/shared/scripts.py).
# Installs the PGDG apt signing key at DEST only if the file downloaded from URL holds exactly
# one key, the one with the pinned FINGERPRINT (it is a key, not a fixed file: its sha256
# changes when PGDG extends its expiry). apt trusts every key of a signed-by keyring, so a
# second key in the download is refused too. DEST is replaced whole (a rename), never added to;
# a DEST that is not exactly the pinned key is removed when no good key can be had: apt then
# refuses PGDG's packages instead of trusting a key nobody pinned.
url=$1 fingerprint=$2 dest=$3
part="$dest.download"
mkdir -p "$(dirname "$dest")" || exit 1
home=$(mktemp -d) || exit 1
trap 'rm -rf "$home"' EXIT

# The fingerprints of FILE's primary keys, one a line (the fpr record right after each pub
# record); nothing when gpg cannot read all of it (a key and then garbage counts as no key).
primary_keys() {
    listing=$(gpg --homedir "$home" --batch --no-options --with-colons --show-keys "$1" 2>/dev/null) &&
        printf '%s\n' "$listing" |
        awk -F: '$1 == "pub" { pub = 1; next } $1 == "fpr" && pub { print toupper($10); pub = 0 }'
}

found=""
if curl -fsSL -o "$part" "$url"; then
    found=$(primary_keys "$part")
fi
if [ -n "$found" ] && [ "$found" = "$fingerprint" ]; then
    chmod 644 "$part" && mv -f "$part" "$dest"
    exit
fi
rm -f "$part"
keys=$(printf '%s' "$found" | grep -c .)
message="PGDG key: the download from $url holds $keys key(s), not exactly the one with fingerprint $fingerprint: refused"
if [ -f "$dest" ] && [ "$(primary_keys "$dest")" != "$fingerprint" ]; then
    rm -f "$dest"
    message="$message; $dest held other keys and was removed"
else
    message="$message, $dest left as it was"
fi
echo "$message" >&2
exit 1
