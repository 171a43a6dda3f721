#!/usr/bin/env bash
# Stand-ins for the two images the MCS conformance suite hard-codes (nothing can be pulled here),
# built from Debian 12 packages with buildah and written as OCI archives for `testbed/bed import`:
#
#   alpine/socat:1.7.4.4     the suite's hello pods: `/bin/sh -c` a script (grep -E, tr, awk,
#                            echo, export) that runs `socat -v -v TCP-LISTEN:42,crlf,reuseaddr,fork
#                            SYSTEM:'echo "pod ip $first_ip"'` (and UDP-LISTEN); socat 1.7.4.4 is
#                            the version upstream's tag names (Debian's socat 1.7.4.4-2).
#   nicolaka/netshoot:v0.15  the suite's request pod: sh, `nc -4/-6 -v -w` (OpenBSD netcat, as in
#                            netshoot: Debian's netcat-openbsd), BIND's `nslookup` (as in
#                            netshoot: Debian's bind9-dnsutils), grep, awk, tail.
#
# Both are what upstream's are at heart: Alpine images whose shell and small tools are BusyBox
# (here Debian's busybox: sh, grep, awk, tail, tr, sleep, ... as links to /bin/busybox) plus the
# real socat, nc and nslookup with the libraries they link. Not busybox-static: its shell runs its
# own applets before anything on PATH (FEATURE_SH_STANDALONE), so `nc` would be BusyBox's, which
# has no -v, -4 or -6. They run as root, as
# upstream's do (socat binds port 42). Each rootfs is the packages' files unpacked with dpkg-deb
# (no maintainer scripts: the links update-alternatives would make are made here), an ld.so cache,
# /etc/passwd, /etc/group and /etc/nsswitch.conf; documentation is left out.
#
# Prints one line per image, `REF ARCHIVE`. Archives are cached under
# $XCC_CACHE/images/mcs-<name>-<hash>.tar, the hash over this script and the exact package
# versions (apt's candidates), so a second run with the same inputs returns at once. Needs apt's
# package lists (apt-get update), apt-get download (Debian's archive), buildah; run it outside the
# bed's network namespace. --check also runs the built tools once (scripts of the suite's own
# commands, in a network namespace of loopback only): testbed/mcs-images-check.sh. --cached
# builds nothing and fails when an archive is not cached (inside the bed's namespace, where
# nothing can be downloaded: the hash only reads apt's local package lists).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cache=${XCC_CACHE:-$HOME/.cache/cross-cluster-controller}
die() { echo "mcs-images: $*" >&2; exit 1; }
check=false
cached=false
case ${1:-} in
  --check) check=true ;;
  --cached) cached=true ;;
  "") ;;
  *) die "unknown argument '$1' (--check, --cached)" ;;
esac
$cached || command -v buildah >/dev/null || die "buildah is missing (bash scripts/install-prereqs)"
command -v apt-cache >/dev/null || die "apt-cache is missing (a Debian machine is assumed)"
# a fresh machine may have no package lists yet: fetch them once (outside the bed only)
if ! $cached && [ -z "$(apt-cache show --no-all-versions busybox 2>/dev/null | head -1)" ] &&
  [ "$(id -u)" = 0 ]; then
  echo "mcs-images: apt knows no busybox: apt-get update" >&2
  apt-get update -qq || die "apt-get update failed"
fi

# name|reference|packages|entrypoint (JSON)|cmd (JSON). The references in full: the kubelet asks
# containerd for docker.io/alpine/socat:1.7.4.4 when a pod names alpine/socat:1.7.4.4, and the
# archive's name is what `ctr images import` calls the image.
images=(
  "socat|docker.io/alpine/socat:1.7.4.4|busybox socat netbase|[\"socat\"]|[]"
  "netshoot|docker.io/nicolaka/netshoot:v0.15|busybox netcat-openbsd bind9-dnsutils netbase|[]|[\"/bin/sh\"]"
)

# closure PKG...: the packages PKG need (Depends and Pre-Depends, recursively; real packages only),
# as `name=version` of apt's candidates, sorted
closure() {
  local names
  names=$(apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts --no-breaks \
    --no-replaces --no-enhances "$@" 2>/dev/null | grep -v '^ ' | grep -v '^<' | sort -u)
  [ -n "$names" ] || die "apt knows none of $* (run apt-get update)"
  # shellcheck disable=SC2086
  apt-cache show --no-all-versions $names 2>/dev/null |
    awk '/^Package: /{p=$2} /^Version: /{print p "=" $2}' | sort -u
}

# fetch NAME=VERSION...: each .deb into $cache/debs (shared with scripts/build-image), printed
fetch() {
  local spec p v deb
  mkdir -p "$cache/debs"
  for spec in "$@"; do
    p=${spec%%=*}
    v=${spec#*=}
    # apt names a file NAME_VERSION_ARCH.deb with the version's ':' as %3a
    deb=$(ls "$cache/debs/${p}_${v//:/%3a}_"*.deb 2>/dev/null | head -1 || true)
    if [ -z "$deb" ]; then
      (cd "$cache/debs" && apt-get -o APT::Sandbox::User=root download "$spec" >/dev/null) ||
        die "apt-get download $spec failed"
      deb=$(ls "$cache/debs/${p}_${v//:/%3a}_"*.deb | head -1)
    fi
    echo "$deb"
  done
}

# make_rootfs DIR DEB...: the packages unpacked and made usable without their maintainer scripts
make_rootfs() {
  local r=$1 deb f a name taken
  shift
  for deb in "$@"; do dpkg-deb -x "$deb" "$r"; done
  rm -rf "$r/usr/share/doc" "$r/usr/share/man" "$r/usr/share/info" "$r/usr/share/lintian" \
    "$r/usr/share/locale"
  # what netcat-openbsd's postinst does with update-alternatives
  [ ! -e "$r/bin/nc.openbsd" ] || { ln -sf nc.openbsd "$r/bin/nc"; ln -sf nc.openbsd "$r/bin/netcat"; }
  # BusyBox's applets as links, except where a package brought the real tool (nc, nslookup, ...):
  # a link in /usr/bin would come before a real tool in /bin on PATH
  taken=$(find "$r/bin" "$r/sbin" "$r/usr/bin" "$r/usr/sbin" -maxdepth 1 \( -type f -o -type l \) \
    -printf '%f\n' 2>/dev/null | sort -u)
  for a in $("$r/bin/busybox" --list-full); do
    name=${a##*/}
    grep -qxF -- "$name" <<<"$taken" && continue
    mkdir -p "$r/$(dirname "$a")"
    ln -s /bin/busybox "$r/$a"
  done
  [ -L "$r/bin/sh" ] || [ -e "$r/bin/sh" ] || die "no /bin/sh in the rootfs"
  mkdir -p "$r/etc" "$r/tmp" "$r/root" "$r/var/run"
  chmod 1777 "$r/tmp"
  cat >"$r/etc/passwd" <<'EOF'
root:x:0:0:root:/root:/bin/sh
nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin
EOF
  cat >"$r/etc/group" <<'EOF'
root:x:0:
nogroup:x:65534:
EOF
  echo "hosts: files dns" >"$r/etc/nsswitch.conf"
  # the libraries' directories (libc6 ships x86_64-linux-gnu.conf) in an ld.so cache
  echo "include /etc/ld.so.conf.d/*.conf" >"$r/etc/ld.so.conf"
  ldconfig -r "$r" || die "ldconfig -r $r failed"
  # every dynamic program finds every library it links
  for f in "$r"/usr/bin/socat "$r"/bin/nc.openbsd "$r"/usr/bin/nslookup; do
    [ -e "$f" ] || continue
    if chroot "$r" /lib64/ld-linux-x86-64.so.2 --list "${f#"$r"}" | grep -q 'not found'; then
      chroot "$r" /lib64/ld-linux-x86-64.so.2 --list "${f#"$r"}" >&2
      die "${f#"$r"} misses a library"
    fi
  done
}

# build NAME REF ENTRYPOINT CMD ROOTFS ARCHIVE
build() {
  local name=$1 ref=$2 ep=$3 cmd=$4 r=$5 archive=$6 w ctr_id
  w=$(dirname "$archive")
  local b=(buildah --storage-driver vfs --root "$w/storage" --runroot "$w/run")
  ctr_id=$("${b[@]}" from scratch) || return 1
  "${b[@]}" copy "$ctr_id" "$r/" / >/dev/null || return 1
  "${b[@]}" config --entrypoint "$ep" --cmd "$cmd" --user 0:0 --workingdir / \
    --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --label "org.opencontainers.image.description=stand-in for $ref built from Debian 12 packages by cross-cluster-controller's testbed/mcs-images.sh" \
    "$ctr_id" || return 1
  "${b[@]}" commit -q "$ctr_id" "$ref" >/dev/null || return 1
  "${b[@]}" push -q "$ref" "oci-archive:$archive:$ref" || return 1
}

mkdir -p "$cache/images"
self=$(sha256sum "$0" | cut -c1-64)
for spec in "${images[@]}"; do
  IFS='|' read -r name ref pkgs ep cmd <<<"$spec"
  # shellcheck disable=SC2086
  versions=$(closure $pkgs)
  key=$(printf '%s\n%s\n%s\n' "$self" "$spec" "$versions" | sha256sum | cut -c1-16)
  out="$cache/images/mcs-$name-$key.tar"
  if [ ! -f "$out" ] && $cached; then
    die "$ref is not built for these package versions ($out is missing): run testbed/mcs-images.sh outside the bed first (scripts/test does)"
  fi
  if [ ! -f "$out" ] || $check; then
    echo "mcs-images: building $ref from $(wc -l <<<"$versions") Debian packages" >&2
    w=$(mktemp -d "$cache/images/mcs-build.XXXXXX")
    # shellcheck disable=SC2064
    trap "rm -rf '$w'" EXIT
    # shellcheck disable=SC2046,SC2086
    make_rootfs "$w/rootfs" $(fetch $versions) || { rm -rf "$w"; exit 1; }
    if $check; then
      bash "$here/mcs-images-check.sh" rootfs "$name" "$w/rootfs" || { rm -rf "$w"; die "the $name rootfs failed its check"; }
    fi
    if [ ! -f "$out" ]; then
      build "$name" "$ref" "$ep" "$cmd" "$w/rootfs" "$w/image.tar" || { rm -rf "$w"; die "buildah failed for $ref"; }
      mv "$w/image.tar" "$out"
    fi
    rm -rf "$w"
  fi
  echo "$ref $out"
done
