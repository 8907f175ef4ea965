#!/usr/bin/env bash
# Proves, without a Docker engine, that the binary the Dockerfile builds runs with only the
# runtime image's libraries:
#   1. the build host is the Dockerfile's Debian release (same glibc and OpenSSL as its stages);
#   2. builds the binary with the Dockerfile's exact cargo command;
#   3. every ELF NEEDED soname of it is listed in docker/runtime-libraries.txt, and each
#      listed package ships that soname, is installed by the Dockerfile's runtime stage
#      (origin dockerfile) or is in debian-slim's apt/dpkg dependency closure (origin base);
#   4. runs the binary as uid 10001 in a root filesystem made of those .deb packages only
#      (chroot, read-only where the kernel lets us bind-mount): --version and check-config
#      of the image's config/streamstate.toml.
# Packages come from Debian's archive through apt (cached under $STREAMSTATE_TOOLS/debs).
# Needs root (chroot), as CI and the developer machines have.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$(pwd)
tools="${STREAMSTATE_TOOLS:-/var/tmp/streamstate-tools}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/tmp/streamstate-target}"
list="$root/docker/runtime-libraries.txt"

fail() { echo "FAIL image: $*" >&2; exit 1; }
pass() { echo "PASS image: $*"; }

# 1. Same Debian release as the Dockerfile's build and runtime stages.
codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
runtime_from=$(grep -E '^FROM ' Dockerfile | tail -n1 | awk '{print $2}')
build_from=$(grep -E '^FROM .* AS chef' Dockerfile | awk '{print $2}')
[[ "$runtime_from" == "debian:${codename}-slim" ]] \
  || fail "runtime base is $runtime_from but this host is Debian '$codename': the check needs a ${runtime_from#debian:} host"
[[ "$build_from" == *"-${codename}" ]] || fail "build stage $build_from is not Debian $codename like this host"
pass "host is Debian $codename like the Dockerfile's stages ($build_from, $runtime_from)"

# 2. The Dockerfile's build command, verbatim.
build_cmd="cargo build --release --locked --bin streamstate"
grep -qF "RUN $build_cmd" Dockerfile || fail "the Dockerfile no longer runs '$build_cmd'; update this check"
echo "== $build_cmd (CARGO_TARGET_DIR=$CARGO_TARGET_DIR)"
$build_cmd
bin="$CARGO_TARGET_DIR/release/streamstate"

# 3. NEEDED sonames against the committed list.
mapfile -t needed < <(readelf -d "$bin" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | sort -u)
interp=$(readelf -l "$bin" | sed -n 's/.*Requesting program interpreter: \(.*\)]/\1/p')
needed+=("$(basename "$interp")")
mapfile -t needed < <(printf "%s\n" "${needed[@]}" | sort -u)
declare -A pkg_of origin_of
while read -r soname pkg origin; do
  [[ -z "$soname" || "$soname" == \#* ]] && continue
  pkg_of[$soname]=$pkg
  origin_of[$soname]=$origin
done <"$list"
for so in "${needed[@]}"; do
  [[ -n "${pkg_of[$so]:-}" ]] || fail "the binary needs $so, which docker/runtime-libraries.txt does not list"
done
pass "all ${#needed[@]} sonames the binary needs are listed: ${needed[*]}"

runtime_install=$(awk '/^FROM debian:/{r=1} r' Dockerfile | grep -oE 'apt-get install [^&]*' | head -n1)
mapfile -t closure < <(apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts \
  --no-breaks --no-replaces --no-enhances apt dpkg 2>/dev/null | grep -E '^[a-z0-9]' | sed 's/:.*//' | sort -u)
[[ ${#closure[@]} -gt 10 ]] || fail "apt-cache found no dependency closure for apt/dpkg (run apt-get update?)"
packages=()
for so in "${!pkg_of[@]}"; do
  pkg=${pkg_of[$so]}
  case "${origin_of[$so]}" in
    dockerfile) grep -qw -- "$pkg" <<<"$runtime_install" || fail "$pkg ($so) is marked dockerfile but the runtime stage does not install it" ;;
    base) printf '%s\n' "${closure[@]}" | grep -qx -- "$pkg" || fail "$pkg ($so) is marked base but is not in apt/dpkg's dependency closure" ;;
    *) fail "$so: origin must be base or dockerfile, not '${origin_of[$so]}'" ;;
  esac
  packages+=("$pkg")
done
mapfile -t packages < <(printf '%s\n' "${packages[@]}" ca-certificates | sort -u)
pass "every listed package is in debian:$codename-slim or installed by the Dockerfile"

# 4. A root filesystem of those packages only.
debs="$tools/debs/$codename"
mkdir -p "$debs"
if ! (cd "$debs" && apt-get download -qq "${packages[@]}" >/dev/null 2>&1); then
  apt-get update -qq || fail "apt-get update failed"
  (cd "$debs" && apt-get download -qq "${packages[@]}") || fail "apt-get download ${packages[*]} failed"
fi
rootfs=$(mktemp -d /var/tmp/streamstate-rootfs.XXXXXX)
trap 'umount -l "$rootfs" 2>/dev/null || true; rm -rf "$rootfs"' EXIT
for pkg in "${packages[@]}"; do
  deb=$(ls -t "$debs/${pkg}_"*.deb | head -n1)
  dpkg-deb -x "$deb" "$rootfs"
done
for so in "${!pkg_of[@]}"; do
  [[ -n "$(find "$rootfs" -name "$so" -print -quit)" ]] || fail "package ${pkg_of[$so]} does not ship $so"
done
pass "each listed package ships its soname"
mkdir -p "$rootfs/usr/local/bin" "$rootfs/etc/streamstate/secrets" "$rootfs/var/lib/streamstate" "$rootfs/tmp"
cp "$bin" "$rootfs/usr/local/bin/streamstate"
cp config/streamstate.toml "$rootfs/etc/streamstate/streamstate.toml"
echo "image-check-token" >"$rootfs/etc/streamstate/secrets/admin-token"
chmod 0444 "$rootfs/etc/streamstate/secrets/admin-token"
chown -R 10001:10001 "$rootfs/var/lib/streamstate"
# The image's root filesystem is read-only in Kubernetes; make this one read-only too.
if mount --bind "$rootfs" "$rootfs" 2>/dev/null && mount -o remount,bind,ro "$rootfs" 2>/dev/null; then
  ro="read-only"
else
  ro="writable (this kernel refused a read-only bind mount)"
fi
in_image() { chroot --userspec=10001:10001 "$rootfs" /usr/local/bin/streamstate "$@"; }
version=$(in_image --version) || fail "streamstate --version did not run in the package-only root filesystem"
pass "'$version' runs as uid 10001 in a $ro root filesystem of: ${packages[*]}"
out=$(in_image check-config --config /etc/streamstate/streamstate.toml 2>&1) \
  || fail "check-config of the image's config failed there: $out"
pass "check-config of the image's /etc/streamstate/streamstate.toml there: $out"
