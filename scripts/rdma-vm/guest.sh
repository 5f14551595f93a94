#!/usr/bin/env bash
# Runs a host program inside a throwaway QEMU guest that has a Soft-RoCE (rdma_rxe) device and
# hands back its stdout, stderr (both streamed as they come) and exit status. The RDMA tests
# run through it (scripts/rdma-vm.sh, the cargo runner, is built on it); so can anything else
# that needs real verbs:
#
#   scripts/rdma-vm/guest.sh [options] PROGRAM [ARGS...]
#
# PROGRAM (a host file, or a command found in $PATH) is copied into the guest at its host path,
# with the shared libraries ldd lists for it. Options:
#   -e NAME=VALUE  set a variable for PROGRAM (repeatable)
#   -c PATH        copy a host file or directory into the guest at the same absolute path
#   -C DIR         working directory in the guest (default /payload)
#   -t SECONDS     limit for the whole guest run (default 600)
#   -v             print the guest console (kernel messages, the init's log) afterwards
#
# The guest: Debian's own kernel (the version linux-image-amd64 points at, fetched once with
# `apt-get download`; only the modules the guest loads are kept), booted as an uncompressed
# vmlinux through its PVH entry point; an initramfs with static busybox, dash as /bin/sh,
# iproute2, ibverbs-utils and rdma-core's rxe provider (scripts/rdma-vm/init is its /init);
# rxe0 on the dummy interface rxenet0 (10.77.0.1). No NIC is attached: nothing leaves the
# guest. PROGRAM sees RDMA_DEVICE=rxe0 RDMA_NETDEV=rxenet0 RDMA_IPV4=10.77.0.1 and
# RDMA_GID_INDEX (the index of the RoCE v2 IPv4 GID).
#
# First use: the Debian packages it needs on the host (qemu-system-x86 busybox-static cpio kmod
# ibverbs-utils ibverbs-providers iproute2 xz-utils) are installed with apt-get when missing
# and it runs as root (otherwise it names them and exits 125); then the kernel is fetched and
# the base image built into the cache. Later runs only pack PROGRAM and boot.
#
# Environment:
#   RDMA_VM_CACHE   cache directory (default ${XDG_CACHE_HOME:-$HOME/.cache}/vans-rdma-vm)
#   RDMA_VM_MEM     guest MiB (default 1024)           RDMA_VM_CPUS  vCPUs (default 2)
#   RDMA_VM_ACCEL   tcg | kvm | auto (default auto: kvm only with kvm_intel or kvm_amd loaded;
#                   a /dev/kvm backed by anything else, such as kvm_pvm, is slower than TCG)
#   RDMA_VM_PASSENV host variables handed to PROGRAM when set (default: RUST_BACKTRACE
#                   RUST_LOG RUST_TEST_THREADS RUST_TEST_NOCAPTURE RUST_MIN_STACK)
#   RDMA_VM_KERNEL_PKG  Debian kernel package (default: the cached one, else linux-image-amd64's)
#   RDMA_VM_APPEND  extra kernel command line (e.g. loglevel=7, with -v, to watch the boot)
#
# Exit status: PROGRAM's; 125 when the guest reported none (setup failure, crash, time limit).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
self=$here/$(basename "${BASH_SOURCE[0]}")
export PATH=$PATH:/usr/sbin:/sbin   # depmod and modprobe, for a user whose PATH lacks them
cache=${RDMA_VM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/vans-rdma-vm}
passenv=${RDMA_VM_PASSENV:-RUST_BACKTRACE RUST_LOG RUST_TEST_THREADS RUST_TEST_NOCAPTURE RUST_MIN_STACK}
multiarch=/usr/lib/x86_64-linux-gnu
# What the guest loads, dependencies included. rdma_rxe does not pull in ib_uverbs, which is
# what gives userspace /dev/infiniband/uverbs0; crc32_generic is the "crc32" rxe's ICRC asks
# the crypto API for (the guest has no modprobe to load it on demand).
guest_modules=(crc32_generic ib_uverbs rdma_rxe dummy)

log() { echo "rdma-vm: $*" >&2; }
fail() { log "$*"; exit 125; }
usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$self" >&2; exit 125; }

# Temporary paths and the guest's processes, cleaned up however the script ends.
cleanup_paths=() guest_pids=()
# shellcheck disable=SC2317 # run by the EXIT trap
cleanup() {
    [ ${#guest_pids[@]} -eq 0 ] || kill "${guest_pids[@]}" 2>/dev/null || true
    [ ${#cleanup_paths[@]} -eq 0 ] || rm -rf "${cleanup_paths[@]}"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP

# ------------------------------------------------------------------------------ host packages
missing_host_packages() {
    local missing=()
    command -v qemu-system-x86_64 >/dev/null || missing+=(qemu-system-x86)
    # The guest needs busybox linked statically; Debian's `busybox` package is dynamic.
    if [ ! -x /bin/busybox ] || ldd /bin/busybox >/dev/null 2>&1; then missing+=(busybox-static); fi
    command -v cpio >/dev/null || missing+=(cpio)
    { command -v depmod && command -v modprobe; } >/dev/null || missing+=(kmod)
    command -v ibv_devinfo >/dev/null || missing+=(ibverbs-utils)
    compgen -G "$multiarch/libibverbs/librxe-rdmav*.so" >/dev/null || missing+=(ibverbs-providers)
    { command -v ip && command -v rdma; } >/dev/null || missing+=(iproute2)
    command -v xz >/dev/null || missing+=(xz-utils)
    echo "${missing[*]}"
}

ensure_host_packages() {
    local missing
    read -ra missing <<<"$(missing_host_packages)"
    [ ${#missing[@]} -gt 0 ] || return 0
    if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
        fail "the Soft-RoCE guest needs these Debian packages: ${missing[*]}" \
             "(as root: apt-get install --no-install-recommends ${missing[*]}; or run this as root once)"
    fi
    log "installing the Debian packages the Soft-RoCE guest needs, with apt-get: ${missing[*]}"
    local apt_log=$cache/apt.log
    export DEBIAN_FRONTEND=noninteractive
    if ! apt-get install -y -q --no-install-recommends "${missing[@]}" >"$apt_log" 2>&1; then
        log "apt-get install failed; running apt-get update and trying again"
        { apt-get update -q && apt-get install -y -q --no-install-recommends "${missing[@]}"; } \
            >>"$apt_log" 2>&1 || { cat "$apt_log" >&2; fail "apt-get install ${missing[*]} failed"; }
    fi
    local still; still=$(missing_host_packages)
    [ -z "$still" ] || fail "still missing after apt-get install: $still"
}

# ------------------------------------------------------------------------------ guest kernel
kernel_package() {
    if [ -n "${RDMA_VM_KERNEL_PKG:-}" ]; then echo "$RDMA_VM_KERNEL_PKG"; return; fi
    # A kernel already in the cache is used as is (apt-cache takes a second per call).
    local cached
    cached=$(find "$cache" -mindepth 2 -maxdepth 2 -path "$cache/kernel-*/ready" -printf '%h\n' |
             sed 's|.*/kernel-||' | sort -V | tail -n 1)
    if [ -n "$cached" ]; then echo "linux-image-$cached"; return; fi
    # shellcheck disable=SC2016 # an awk program
    local query='$1 == "Depends:" && $2 ~ /^linux-image-[0-9]/ { print $2; exit }' pkg
    pkg=$(apt-cache depends linux-image-amd64 2>/dev/null | awk "$query")
    if [ -z "$pkg" ] && [ "$(id -u)" = 0 ]; then
        log "apt knows no linux-image-amd64; running apt-get update"
        apt-get update -q >/dev/null 2>&1 || true
        pkg=$(apt-cache depends linux-image-amd64 2>/dev/null | awk "$query")
    fi
    [ -n "$pkg" ] || fail "cannot tell which Debian kernel to use; set RDMA_VM_KERNEL_PKG"
    echo "$pkg"
}

unpack_module() {  # unpack_module SRC DST: a module file, decompressed if Debian compressed it
    case $1 in
        *.ko) cp "$1" "$2" ;;
        *.ko.xz) xz -dc "$1" >"$2" ;;
        *.ko.zst) zstd -qdc "$1" >"$2" ;;
        *.ko.gz) gzip -dc "$1" >"$2" ;;
        *) fail "unknown module file $1" ;;
    esac
}

prepare_kernel() {  # sets kver and kdir ($kdir/vmlinux, $kdir/modules/NN-name.ko in load order)
    local pkg
    pkg=$(kernel_package)
    kver=${pkg#linux-image-}
    kdir=$cache/kernel-$kver
    [ -e "$kdir/ready" ] && return 0
    log "first use: fetching Debian's kernel package $pkg (apt-get download) into $cache"
    local tmp; tmp=$(mktemp -d "$cache/kernel-tmp.XXXXXX")
    cleanup_paths+=("$tmp")
    local sandbox=()   # as root, apt downloads as _apt, which cannot write below root's home
    [ "$(id -u)" != 0 ] || sandbox=(-o APT::Sandbox::User=root)
    (cd "$tmp" && apt-get download "${sandbox[@]}" "$pkg") >"$tmp/download.log" 2>&1 ||
        { cat "$tmp/download.log" >&2; fail "apt-get download $pkg failed"; }
    dpkg-deb -x "$tmp/${pkg}_"*.deb "$tmp/deb"
    depmod -b "$tmp/deb" "$kver"

    mkdir -p "$tmp/out/modules"
    local module deps verb file file_name n=0
    local -A taken=()
    for module in "${guest_modules[@]}"; do
        deps=$(modprobe -d "$tmp/deb" -S "$kver" --show-depends "$module") ||
            fail "$pkg has no module $module"
        while read -r verb file _; do
            [ "$verb" = insmod ] || continue   # "builtin NAME": nothing to load
            [ -z "${taken[$file]:-}" ] || continue
            taken[$file]=1
            n=$((n + 1))
            file_name=${file##*/}
            unpack_module "$file" "$tmp/out/modules/$(printf %02d "$n")-${file_name%%.ko*}.ko"
        done <<<"$deps"
    done

    # QEMU boots an ELF vmlinux through its PVH entry point, which skips the bzImage's
    # decompression (seconds under TCG). The bzImage carries vmlinux as one xz stream.
    local vmlinuz=$tmp/deb/boot/vmlinuz-$kver offset
    offset=$(LC_ALL=C grep -obUaP '\xfd7zXZ\x00' "$vmlinuz" | head -n 1 | cut -d: -f1)
    if [ -n "$offset" ]; then
        tail -c +$((offset + 1)) "$vmlinuz" | xz -dc --single-stream >"$tmp/out/vmlinux" 2>/dev/null || true
    fi
    if [ "$(head -c 4 "$tmp/out/vmlinux" 2>/dev/null)" != $'\x7fELF' ]; then
        log "no xz-compressed vmlinux in $vmlinuz; booting the bzImage itself"
        cp "$vmlinuz" "$tmp/out/vmlinux"
    fi

    rm -rf "$cache"/kernel-[0-9]*   # an older kernel, now replaced
    mv "$tmp/out" "$kdir"
    touch "$kdir/ready"
    rm -rf "$tmp"
}

# ------------------------------------------------------------------------------ images
image_path() {  # image_path PATH: where an image keeps PATH
    # The directory is canonicalised (/lib/x86_64-linux-gnu is /usr/lib/x86_64-linux-gnu): an
    # archive entry "lib" would replace the base image's lib -> usr/lib link when the kernel
    # unpacks the payload over it. The name is kept (libibverbs.so.1, not what it links to).
    echo "$(realpath -m "$(dirname "$1")")/$(basename "$1")"
}

put() {  # put ROOT HOSTFILE [GUESTPATH]: copy a file (symlinks followed) into an image tree
    local dest; dest=$1$(image_path "${3:-$2}")
    mkdir -p "$(dirname "$dest")"
    cp -L "$2" "$dest"
}

put_libs() {  # put_libs ROOT FILE: the shared libraries FILE loads (none if it is no ELF)
    local lib
    for lib in $(ldd "$2" 2>/dev/null | grep -o '/[^ ]*' || true); do
        [ -e "$1$(image_path "$lib")" ] || put "$1" "$lib"
    done
}

put_with_libs() {  # put_with_libs ROOT FILE...: files plus the shared libraries they load
    local root=$1 file; shift
    for file in "$@"; do
        put "$root" "$file"
        put_libs "$root" "$file"
    done
}

make_cpio() {  # make_cpio TREE ARCHIVE
    (cd "$1" && find . -mindepth 1 | LC_ALL=C sort | cpio -o -H newc -R 0:0 --quiet) >"$2"
}

prepare_base() {  # sets base: the initramfs every run shares (userland, modules, /init)
    local key
    key=$({ echo "$kver"; cat "$self" "$here/init"; ls "$kdir/modules"
            dpkg-query -W -f '${Package}=${Version}\n' busybox-static dash iproute2 libc6 \
                libibverbs1 ibverbs-providers ibverbs-utils 2>/dev/null; } | sha256sum | cut -c1-16)
    base=$cache/base-$key.cpio
    [ -e "$base" ] && return 0
    log "building the guest's base image (busybox, dash, iproute2, rdma-core's rxe provider, the modules of $kver)"
    local root; root=$(mktemp -d "$cache/base-tmp.XXXXXX")
    cleanup_paths+=("$root")
    mkdir -p "$root"/{usr/bin,usr/sbin,usr/lib,usr/lib64,bbin,dev,proc,sys,run,root,etc,payload,rdma-vm}
    mkdir -m 1777 "$root/tmp"
    local dir
    for dir in bin sbin lib lib64; do ln -s "usr/$dir" "$root/$dir"; done
    cp /bin/busybox "$root/bbin/busybox"
    local applet
    for applet in $(/bin/busybox --list); do
        [ "$applet" = busybox ] || ln -s busybox "$root/bbin/$applet"
    done
    # /bin/sh is dash, and busybox's applets come last in $PATH: Debian's static busybox shell
    # would run its own `ip` applet ahead of iproute2's.
    local tools=() tool
    for tool in dash ip rdma ibv_devices ibv_devinfo; do tools+=("$(command -v "$tool")"); done
    put_with_libs "$root" "${tools[@]}" "$multiarch"/libibverbs/librxe-rdmav*.so
    ln -s dash "$root/usr/bin/sh"
    put "$root" /etc/libibverbs.d/rxe.driver
    printf 'root:x:0:0:root:/root:/bin/sh\n' >"$root/etc/passwd"
    printf 'root:x:0:\n' >"$root/etc/group"
    printf '127.0.0.1 localhost\n::1 localhost\n10.77.0.1 rdma-vm\n' >"$root/etc/hosts"
    cp -r "$kdir/modules" "$root/rdma-vm/modules"
    install -m 755 "$here/init" "$root/init"
    make_cpio "$root" "$base.tmp"
    rm -f "$cache"/base-*.cpio   # images of an older kernel, packages or script
    mv "$base.tmp" "$base"
    rm -rf "$root"
}

shell_quote() { printf "'%s'" "${1//\'/\'\\\'\'}"; }

pack_payload() {  # pack_payload PROGRAM ARGS...: writes $work/initrd (base + the payload)
    local root=$work/payload program
    program=$(realpath "$1"); shift
    mkdir -p "$root/payload"
    {
        echo "export RDMA_VM_CWD=$(shell_quote "$cwd")"
        local name setting
        for name in $passenv; do
            [ -z "${!name+set}" ] || echo "export $name=$(shell_quote "${!name}")"
        done
        for setting in "${envs[@]}"; do
            echo "export ${setting%%=*}=$(shell_quote "${setting#*=}")"
        done
    } >"$root/payload/env.sh"
    { printf 'exec %s' "$(shell_quote "$program")"
      local arg
      for arg in "$@"; do printf ' %s' "$(shell_quote "$arg")"; done
      echo; } >"$root/payload/cmd.sh"
    put_with_libs "$root" "$program"
    chmod +x "$root$program"
    # Copies come with the libraries of the programs among them: a program they start may
    # load one that neither PROGRAM nor the base image does (vans-launch needs libm).
    local copy file
    for copy in "${copies[@]}"; do
        copy=$(realpath "$copy")
        mkdir -p "$root$(dirname "$copy")"
        cp -a "$copy" "$root$copy"
        while IFS= read -r -d '' file; do
            put_libs "$root" "$file"
        done < <(find "$copy" -type f -perm -u+x -print0)
    done
    make_cpio "$root" "$work/payload.cpio"
    cat "$base" "$work/payload.cpio" >"$work/initrd"
    rm -rf "$root" "$work/payload.cpio"
}

# ------------------------------------------------------------------------------ the run
envs=() copies=() cwd=/payload limit=600 verbose=0
while getopts "e:c:C:t:vh" opt; do
    case $opt in
        e) [[ $OPTARG =~ ^[A-Za-z_][A-Za-z0-9_]*= ]] || fail "-e wants NAME=VALUE, got '$OPTARG'"
           envs+=("$OPTARG") ;;
        c) [ -e "$OPTARG" ] || fail "-c $OPTARG: no such file or directory"
           copies+=("$OPTARG") ;;
        C) cwd=$OPTARG ;;
        t) [[ $OPTARG =~ ^[0-9]+$ ]] || fail "-t wants seconds, got '$OPTARG'"
           limit=$OPTARG ;;
        v) verbose=1 ;;
        *) usage ;;
    esac
done
shift $((OPTIND - 1))
[ $# -ge 1 ] || usage
program=$1; shift
if [[ $program != */* ]]; then
    program=$(command -v "$program") || fail "no command $1 in \$PATH"
fi
[ -f "$program" ] || fail "no such file: $program"

started=$EPOCHREALTIME
mkdir -p "$cache"
exec 9>"$cache/lock"   # one preparation at a time; runs themselves are independent
flock 9
ensure_host_packages
prepare_kernel
prepare_base
flock -u 9

work=$(mktemp -d "${TMPDIR:-/tmp}/vans-rdma-vm.XXXXXX")
cleanup_paths+=("$work")
pack_payload "$program" "$@"

accel=${RDMA_VM_ACCEL:-auto}
if [ "$accel" = auto ]; then
    accel=tcg
    if [ -w /dev/kvm ] && { [ -d /sys/module/kvm_intel ] || [ -d /sys/module/kvm_amd ]; }; then accel=kvm; fi
fi
case $accel in
    kvm) accel_args=(-accel kvm -cpu host) ;;
    tcg) accel_args=(-accel tcg -cpu max) ;;
    *) fail "RDMA_VM_ACCEL must be tcg, kvm or auto, not $accel" ;;
esac

# Serial ports: ttyS0 the console, ttyS1 PROGRAM's stdout, ttyS2 its stderr, ttyS3 the status.
for port in console out err status; do : >"$work/$port"; done
booted=$EPOCHREALTIME
timeout -k 5 "$limit" qemu-system-x86_64 "${accel_args[@]}" -machine q35 \
    -smp "${RDMA_VM_CPUS:-2}" -m "${RDMA_VM_MEM:-1024}" \
    -nodefaults -no-user-config -display none -no-reboot \
    -serial "file:$work/console" -serial "file:$work/out" -serial "file:$work/err" \
    -serial "file:$work/status" -kernel "$kdir/vmlinux" -initrd "$work/initrd" \
    -append "console=ttyS0 quiet loglevel=3 panic=-1 rdinit=/init ${RDMA_VM_APPEND:-}" \
    </dev/null >"$work/qemu.log" 2>&1 &
qemu_pid=$!
guest_pids+=("$qemu_pid")
tail -s 0.2 -n +1 -f --pid="$qemu_pid" "$work/out" &
guest_pids+=($!)
tail -s 0.2 -n +1 -f --pid="$qemu_pid" "$work/err" >&2 &
guest_pids+=($!)
qemu_status=0
wait "$qemu_pid" || qemu_status=$?
wait "${guest_pids[@]:1}" || true   # the tails print what is left, then end with qemu
guest_pids=()
ended=$EPOCHREALTIME

status=$(sed -n 's/^RDMA_VM_EXIT=\([0-9][0-9]*\).*/\1/p' "$work/status" | tail -n 1)
if [ "$verbose" = 1 ] || [ -z "$status" ] ||
   grep -qE 'BUG:|WARNING:|Oops|Call Trace|Kernel panic' "$work/console"; then
    { echo "----- guest console ($accel) -----"; tr -d '\r' <"$work/console"; cat "$work/qemu.log"
      echo "-----"; } >&2
fi
times=$(awk -v a="$started" -v b="$booted" -v c="$ended" \
            'BEGIN { printf "prepared in %.1fs, guest ran %.1fs", b - a, c - b }')
if [ -z "$status" ]; then
    [ "$qemu_status" != 124 ] || log "the guest run hit the ${limit}s limit (-t)"
    fail "$(basename "$program"): the guest reported no exit status (qemu exit $qemu_status); $times ($accel)"
fi
log "$(basename "$program") exited $status in the Soft-RoCE guest; $times ($accel)"
exit "$status"
