#!/usr/bin/env bash
# Builds the Linux guest the Real hosts scenarios boot (scripts/guest/run.py):
# Debian's kernel (linux-image-amd64, extracted, not installed) and a
# busybox initramfs carrying open-iscsi, multipath-tools, sg3-utils,
# e2fsprogs, xfsprogs, util-linux, fio and nvme-cli from this machine's
# Debian packages (installed when missing), their shared libraries, the
# kernel modules an iSCSI host needs (loaded at boot) and those of an
# NVMe/TCP host and of the kernel's own NVMe/TCP target (loaded by the
# scenarios that use them, with modprobe). Nothing prebuilt is committed:
# everything is made here, from packages, and cached by content.
#
#   scripts/guest/build.sh [CACHE_DIR]    prints the directory with vmlinuz and base.cpio.gz
#
# IRONSAN_GUEST_KERNEL=backports takes the kernel from this release's
# backports suite instead (bookworm-backports: Linux 6.12, which has NVMe
# in-band authentication, DH-HMAC-CHAP, where 6.1 has not), through apt
# lists of its own under the cache: the host's apt configuration is left
# as it is.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cache="${1:-${IRONSAN_GUEST_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ironsan-guest}}"
mkdir -p "$cache"
export DEBIAN_FRONTEND=noninteractive

# Host tools: the programs copied into the guest, qemu to boot it, socat for
# the per-connection port forwards, kmod/cpio to build the image.
pkgs=(qemu-system-x86 busybox-static open-iscsi multipath-tools sg3-utils e2fsprogs
      xfsprogs util-linux fio socat kmod cpio udev dmsetup nvme-cli gawk procps bsdextrautils)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "guest build: installing ${missing[*]}" >&2
  # A package's service must not start on the host (open-iscsi, multipathd).
  policy=/usr/sbin/policy-rc.d
  had_policy=0; [ -e $policy ] && had_policy=1
  [ $had_policy = 1 ] || { printf '#!/bin/sh\nexit 101\n' > $policy; chmod +x $policy; }
  apt-get update -qq >&2 || true
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  [ $had_policy = 1 ] || rm -f $policy
fi

# The kernel: the version linux-image-amd64 points at, downloaded and
# extracted into the cache (never installed on the host).
apt_opts=()
if [ "${IRONSAN_GUEST_KERNEL:-}" = backports ]; then
  suite="$(. /etc/os-release && echo "$VERSION_CODENAME")-backports"
  # The host's Debian mirror (deb822 or one-line sources), else the default.
  mirror=$(grep -hoE '^(URIs:|deb) +https?://[^ ]+' /etc/apt/sources.list.d/*.sources \
             /etc/apt/sources.list 2>/dev/null | grep -v security | awk '{print $2; exit}' || true)
  mirror=${mirror:-http://deb.debian.org/debian}
  alist="$cache/apt-$suite"
  mkdir -p "$alist/lists/partial"
  echo "deb $mirror $suite main" > "$alist/sources.list"
  apt_opts=(-o "Dir::Etc::SourceList=$alist/sources.list" -o "Dir::Etc::SourceParts=/nonexistent"
            -o "Dir::State::Lists=$alist/lists" -o "Dir::Cache=$alist/cache"
            -o "APT::Sandbox::User=root")
  mkdir -p "$alist/cache/archives/partial"
  if [ -z "$(find "$alist/lists" -name '*Packages*' -mmin -1440 2>/dev/null | head -1)" ]; then
    echo "guest build: reading $suite ($mirror)" >&2
    apt-get "${apt_opts[@]}" update -qq >&2
  fi
fi
kpkg=$(apt-cache "${apt_opts[@]}" depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/{print $2; exit}')
[ -n "$kpkg" ] || { echo "guest build: no linux-image-amd64 in the package lists" >&2; exit 1; }
kver=${kpkg#linux-image-}
kdir="$cache/kernel-$kver"
if [ ! -f "$kdir/vmlinuz" ]; then
  echo "guest build: fetching $kpkg" >&2
  rm -rf "$kdir.tmp" && mkdir -p "$kdir.tmp/deb"
  (cd "$kdir.tmp/deb" && apt-get "${apt_opts[@]}" download "$kpkg" >/dev/null 2>&1) || {
    apt-get "${apt_opts[@]}" update -qq >&2
    (cd "$kdir.tmp/deb" && apt-get "${apt_opts[@]}" download "$kpkg" >/dev/null)
  }
  dpkg-deb -x "$kdir.tmp"/deb/*.deb "$kdir.tmp/root"
  depmod -b "$kdir.tmp/root" "$kver"
  cp "$kdir.tmp/root/boot/vmlinuz-$kver" "$kdir.tmp/vmlinuz"
  rm -rf "$kdir.tmp/deb"
  rm -rf "$kdir" && mv "$kdir.tmp" "$kdir"
fi

# The image is rebuilt when this script, the guest's init or the package
# versions change.
stamp=$( { cat "$0" "$here/init"; dpkg-query -W "${pkgs[@]}"; echo "$kver"; } | sha256sum | cut -c1-16)
out="$cache/image-$stamp"
if [ -f "$out/base.cpio.gz" ]; then
  echo "$out"
  exit 0
fi
echo "guest build: making the initramfs ($kver)" >&2
root="$out.tmp/root"
rm -rf "$out.tmp" && mkdir -p "$root"/{bin,sbin,usr/bin,usr/sbin,lib,lib64,etc/iscsi,etc/multipath,etc/nvme,lib/modules,proc,sys,dev,run,tmp,var/lib/iscsi,mnt,root}
ln -s ../run "$root/var/run" 2>/dev/null || true
cp /bin/busybox "$root/bin/busybox"
for app in $("$root/bin/busybox" --list); do
  [ -e "$root/bin/$app" ] || ln -s busybox "$root/bin/$app"
done

# Programs and every shared library they load (the loader included).
progs=(/usr/sbin/iscsiadm /usr/sbin/iscsid /usr/sbin/multipath /usr/sbin/multipathd
       /usr/sbin/dmsetup /usr/sbin/mkfs.ext4 /usr/sbin/mke2fs /usr/sbin/e2fsck /usr/sbin/resize2fs
       /usr/sbin/dumpe2fs /usr/sbin/mkfs.xfs /usr/sbin/xfs_repair /usr/sbin/xfs_io /usr/sbin/xfs_db
       /usr/sbin/fstrim /usr/sbin/blkdiscard /usr/sbin/blockdev /usr/bin/lsblk /usr/bin/fio
       /lib/udev/scsi_id /usr/sbin/nvme /usr/bin/kmod)
for b in sg_inq sg_vpd sg_rtpg sg_stpg sg_reset sg_readcap sg_turs sg_sat_identify sg_logs \
         sg_modes sg_unmap sg_write_same sg_persist sg_luns; do
  progs+=("$(command -v $b)")
done
libs=()
for p in "${progs[@]}" /lib/multipath/*.so; do
  [ -e "$p" ] || { echo "guest build: $p missing" >&2; exit 1; }
  case "$p" in
    /lib/multipath/*) mkdir -p "$root/lib/multipath"; cp -L "$p" "$root/lib/multipath/" ;;
    *) mkdir -p "$root$(dirname "$p")"; cp -L "$p" "$root$p" ;;
  esac
  while read -r lib; do libs+=("$lib"); done < <(ldd "$p" 2>/dev/null | grep -o '/[^ ]*' || true)
done
for l in $(printf '%s\n' "${libs[@]}" | sort -u); do
  mkdir -p "$root$(dirname "$l")"
  cp -L "$l" "$root$l"
done
# busybox's applets must not shadow the real programs' names.
for p in "${progs[@]}"; do rm -f "$root/bin/$(basename "$p")"; done
# xfs_growfs is a script around xfs_io.
cp /usr/sbin/xfs_growfs "$root/usr/sbin/xfs_growfs" 2>/dev/null || true
# kmod's modprobe, where the kernel's request_module looks for it too
# (nvme-fabrics asks for nvme-<transport>, nvmet for its transport).
ln -s ../usr/bin/kmod "$root/sbin/modprobe"
rm -f "$root/bin/modprobe"

# Configuration the programs read.
cp /etc/iscsi/iscsid.conf "$root/etc/iscsi/iscsid.conf"
echo "InitiatorName=iqn.2026-12.io.ironsan:guest" > "$root/etc/iscsi/initiatorname.iscsi"
echo "root:x:0:0:root:/root:/bin/sh" > "$root/etc/passwd"
echo "root:x:0:" > "$root/etc/group"
touch "$root/etc/multipath.conf"
# The NVMe host's identity, fixed like the iSCSI initiator name: nvme-cli
# sends it in every Connect.
hostid=59e591ab-284f-44cc-a31f-9c3cfa81a9c1
echo "nqn.2014-08.org.nvmexpress:uuid:$hostid" > "$root/etc/nvme/hostnqn"
echo "$hostid" > "$root/etc/nvme/hostid"

# `depends MODULE…`: the modules' files and all they depend on, in load order.
depends() {
  for m in "$@"; do
    modprobe -d "$kdir/root" -S "$kver" --show-depends "$m" 2>/dev/null | awk '$1=="insmod"{print $2}'
  done | awk '!seen[$0]++'
}
# `put_ko KO DIR`: the module uncompressed into DIR; prints its file name.
put_ko() {
  name=$(basename "$1")
  case "$1" in
    *.xz) xz -dc "$1" > "$2/${name%.xz}"; name=${name%.xz} ;;
    *.zst) zstd -qdc "$1" > "$2/${name%.zst}"; name=${name%.zst} ;;
    *) cp "$1" "$2/$name" ;;
  esac
  echo "$name"
}
# Kernel modules init loads at boot, in load order (configfs for the NVMe
# target's configuration, mounted by init).
mods=(virtio_net virtio_pci iscsi_tcp sd_mod sg dm_multipath dm_round_robin dm_service_time
      dm_queue_length scsi_dh_alua ext4 xfs crc32c_generic crc32c_intel libcrc32c configfs)
depends "${mods[@]}" | while read -r ko; do
  put_ko "$ko" "$root/lib/modules"
done > "$root/etc/modules.order"
[ -s "$root/etc/modules.order" ] || { echo "guest build: no modules resolved" >&2; exit 1; }
# Modules a scenario loads itself, with modprobe: the NVMe/TCP host
# (nvme-tcp), the kernel's NVMe/TCP target (nvmet-tcp) and RAM disks to back
# its namespaces (null_blk, brd). They keep their place in the usual tree
# under /lib/modules/$kver, indexed by depmod, so that modprobe resolves
# their dependencies and aliases (nvmet-transport-3 …) as on any host.
ondemand=(nvme_tcp nvmet_tcp null_blk brd crc64_rocksoft_generic loop hmac sha256_generic sha512_generic)
mdir="$root/lib/modules/$kver"
mkdir -p "$mdir"
depends "${ondemand[@]}" | while read -r ko; do
  rel=${ko#"$kdir/root/lib/modules/$kver/"}
  mkdir -p "$mdir/$(dirname "$rel")"
  put_ko "$ko" "$mdir/$(dirname "$rel")" >/dev/null
done
[ -f "$mdir/kernel/drivers/nvme/target/nvmet-tcp.ko" ] || {
  echo "guest build: no NVMe/TCP modules resolved" >&2; exit 1; }
cp "$kdir/root/lib/modules/$kver"/modules.{order,builtin*} "$mdir/"
depmod -b "$root" "$kver"

cp "$here/init" "$root/init"
chmod +x "$root/init"
(cd "$root" && find . | cpio -o -H newc --quiet | gzip -1) > "$out.tmp/base.cpio.gz"

# tools.cpio.gz, appended by the scenarios that run a peer's shell test
# suite (blktests): GNU bash, coreutils, diffutils, grep, sed, gawk, gzip,
# findutils, util-linux, procps and getconf in /opt/gnu/bin (busybox's applets stay where the
# other scenarios expect them), the kernel's configuration in /boot, and a
# udevadm that waits instead of asking a udev the guest does not run.
troot="$out.tmp/tools"
mkdir -p "$troot/opt/gnu/bin" "$troot/boot"
tlibs=()
for pkg in bash coreutils diffutils grep sed gawk gzip findutils util-linux mount procps \
           bsdextrautils libc-bin; do
  for f in $(dpkg -L "$pkg" | grep -E '^/(usr/)?s?bin/[^/]+$'); do
    [ -f "$f" ] && [ ! -L "$f" ] || continue
    # Programs, and gzip's shell scripts (zgrep, zcat).
    head -c4 "$f" | grep -q ELF || [ "$pkg" = gzip ] || continue
    cp "$f" "$troot/opt/gnu/bin/"
    # gzip's scripts (zgrep …) under busybox sh would run busybox's gzip
    # applet whatever PATH says: they run under bash.
    if [ "$pkg" = gzip ] && head -c4 "$f" | grep -qv ELF; then
      sed -i '1s|^#!/bin/sh|#!/opt/gnu/bin/bash|' "$troot/opt/gnu/bin/$(basename "$f")"
    fi
    while read -r lib; do tlibs+=("$lib"); done < <(ldd "$f" 2>/dev/null | grep -o '/[^ ]*' || true)
  done
done
ln -sf gawk "$troot/opt/gnu/bin/awk"
# Scripts start with #!/bin/bash.
mkdir -p "$troot/bin"
ln -s /opt/gnu/bin/bash "$troot/bin/bash"
for l in $(printf '%s\n' "${tlibs[@]}" | sort -u); do
  [ -e "$root$l" ] && continue
  mkdir -p "$troot$(dirname "$l")"
  cp -L "$l" "$troot$l"
done
printf '#!/bin/sh\n# No udev in the guest: what a settle waits for is done when it returns.\nsleep 0.2\n' \
  > "$troot/opt/gnu/bin/udevadm"
chmod +x "$troot/opt/gnu/bin/udevadm"
cp "$kdir/root/boot/config-$kver" "$troot/boot/"
(cd "$troot" && find . | cpio -o -H newc --quiet | gzip -1) > "$out.tmp/tools.cpio.gz"
rm -rf "$troot"
cp "$kdir/vmlinuz" "$out.tmp/vmlinuz"
echo "$kver" > "$out.tmp/kernel-version"
rm -rf "$root" "$out" && mv "$out.tmp" "$out"
# Older images of this cache go.
find "$cache" -maxdepth 1 -name 'image-*' ! -name "image-$stamp" -exec rm -rf {} + 2>/dev/null || true
echo "$out"
