# fetch-verified.sh URL DEST ARTIFACT SHA256 [MODE]
# Leaves at DEST the file at URL only if its sha256 is SHA256; ARTIFACT names it in messages.
# SHA256 is required: there is no unpinned download. With MODE, the file is root-owned with
# that mode before it takes DEST's name.
# The download goes to DEST.part and is renamed into place (same directory, so atomic): DEST
# is the verified file or untouched. Any failure deletes DEST.part and exits 1 with a message.
url=$1 dest=$2 artifact=$3 mode=${5:-}
sha256=$(printf %s "$4" | tr A-F a-f)
part="$dest.part"
case $sha256 in
    *[!0-9a-f]*|'') echo "$artifact: no sha256 pin for $url: nothing was downloaded" >&2; exit 1 ;;
esac
[ ${#sha256} -eq 64 ] || { echo "$artifact: the sha256 pin is not 64 hex digits" >&2; exit 1; }
# The site mirror's login (roles/apt/proxy.py writes it, root 0600; roles/shared/ops.py DOWNLOAD_NETRC):
# curl reads it from the file and sends it to that host only, never from its command line.
netrc=/etc/gpu-cluster/download.netrc
mkdir -p "$(dirname "$dest")" && rm -f "$part" || exit 1
# Does the login belong to this URL's host? The host as curl matches a netrc machine: without
# scheme, user, port and path, in any case. Only the machine names are read from the file.
host=${url#*://}; host=${host%%/*}; host=${host##*@}
case $host in \[*) host=${host%%]*}] ;; *) host=${host%:*} ;; esac
host=$(printf %s "$host" | tr A-Z a-z)
login=
if [ -f "$netrc" ]; then
    for machine in $(awk '{ for (i = 1; i < NF; i++) if ($i == "machine") print $(i + 1) }' "$netrc"); do
        [ "$(printf %s "$machine" | tr A-Z a-z)" = "$host" ] && login=yes
    done
fi
# A minimal image may have neither curl nor wget before its first package install.
if [ -f "$netrc" ] && command -v curl >/dev/null 2>&1; then
    curl -fsSL --retry 3 --netrc-file "$netrc" -o "$part" "$url"
elif [ -n "$login" ]; then
    # wget reads only ~/.netrc and would need the password in its argv; Python's urllib sends
    # no login: the mirror would answer 401. Other hosts need no login: the fallbacks below.
    echo "$artifact: the mirror login for $host ($netrc) needs curl, which is not installed" >&2; exit 1
elif command -v curl >/dev/null 2>&1; then
    curl -fsSL --retry 3 -o "$part" "$url"
elif command -v wget >/dev/null 2>&1; then
    wget -q -O "$part" "$url"
else
    python3 -c 'import shutil, sys, urllib.request
shutil.copyfileobj(urllib.request.urlopen(sys.argv[1], timeout=120), open(sys.argv[2], "wb"))' \
        "$url" "$part"
fi || { rm -f "$part"; echo "$artifact: download failed from $url" >&2; exit 1; }
actual=$(sha256sum "$part" | cut -d' ' -f1)
if [ "$actual" != "$sha256" ]; then
    rm -f "$part"
    echo "$artifact: sha256 mismatch for $url: expected $sha256, got $actual;" \
        "the download was deleted, nothing was installed" >&2
    exit 1
fi
if [ -n "$mode" ]; then
    chown root:root "$part" && chmod "$mode" "$part" || { rm -f "$part"; exit 1; }
fi
mv -f "$part" "$dest"
