# tools/bench-lib.sh — sourced by tools/bench and tools/bench-requests: mounting each
# filesystem on a fresh loop-mounted ext4 (setup_NAME for plain, gocryptfs, securefs, rclone,
# zdcfs, zdcfs-uring; each sets MNT), unmounting it (teardown NAME) and cleaning up at exit.
# The caller sets REPO, WORK (its scratch directory), SIZE_MIB, ZDC_OPTS and URING_PARAM
# first and installs `trap cleanup EXIT`.

declare -A PIDS=()
MOUNTS=()
DISKS=()
cleanup() {
  for m in "${MOUNTS[@]}"; do fusermount3 -u "$m" 2>/dev/null || fusermount3 -uz "$m" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  sleep 0.5
  for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  for d in "${DISKS[@]}"; do umount "$d" 2>/dev/null || umount -l "$d" 2>/dev/null || true; done
  rm -rf "$WORK"
}

wait_mounted() {  # wait_mounted DIR SECONDS
  for _ in $(seq 1 $(( $2 * 10 ))); do
    if grep -q " $1 fuse" /proc/mounts; then return 0; fi
    sleep 0.1
  done
  echo "${0##*/}: $1 did not mount" >&2; return 1
}

# Each filesystem keeps its backing files (ciphertext, cache, state, store) on its own freshly
# made ext4 filesystem (a loop-mounted image), so that none pays for the inode churn an earlier
# one left behind (ext4 inode allocation slows down markedly in block groups full of recently
# deleted inodes). fresh_disk NAME sets DISK.
DISK=""
fresh_disk() {
  local img="$WORK/$1.img"
  truncate -s $(( SIZE_MIB * 3 + 4096 ))M "$img"
  mkfs.ext4 -q -F "$img"
  mkdir -p "$WORK/$1-disk"
  mount -o loop "$img" "$WORK/$1-disk"
  DISKS+=("$WORK/$1-disk"); DISK="$WORK/$1-disk"
}

# Each setup_NAME mounts one filesystem and sets MNT (run in this shell, not a subshell, so
# that MOUNTS and PIDS are recorded for cleanup).
MNT=""
setup_plain() { fresh_disk plain; mkdir -p "$DISK/plain"; MNT="$DISK/plain"; }
setup_gocryptfs() {
  fresh_disk gocryptfs
  mkdir -p "$DISK/gc-back" "$WORK/gc"
  gocryptfs -q -init -extpass "echo benchpass" -scryptn 10 "$DISK/gc-back" >/dev/null
  gocryptfs -q -extpass "echo benchpass" "$DISK/gc-back" "$WORK/gc"
  MOUNTS+=("$WORK/gc"); wait_mounted "$WORK/gc" 10; MNT="$WORK/gc"
}
setup_securefs() {
  fresh_disk securefs
  mkdir -p "$DISK/sf-back" "$WORK/sf"
  securefs create --pass benchpass "$DISK/sf-back" >/dev/null
  securefs mount --pass benchpass "$DISK/sf-back" "$WORK/sf" >"$WORK/sf.log" 2>&1 &
  PIDS[sf]=$!; MOUNTS+=("$WORK/sf"); wait_mounted "$WORK/sf" 10; MNT="$WORK/sf"
}
setup_rclone() {
  fresh_disk rclone
  mkdir -p "$DISK/rc-back" "$WORK/rc" "$DISK/rc-cache"
  export RCLONE_CONFIG_ZBENCH_TYPE=crypt
  export RCLONE_CONFIG_ZBENCH_REMOTE="$DISK/rc-back"
  RCLONE_CONFIG_ZBENCH_PASSWORD=$(rclone obscure benchpass); export RCLONE_CONFIG_ZBENCH_PASSWORD
  rclone mount zbench: "$WORK/rc" --vfs-cache-mode writes --cache-dir "$DISK/rc-cache" \
    >"$WORK/rc.log" 2>&1 &
  PIDS[rc]=$!; MOUNTS+=("$WORK/rc"); wait_mounted "$WORK/rc" 20; MNT="$WORK/rc"
}
setup_zdcfs() {  # setup_zdcfs [Y|N]: the fuse module's enable_uring during the mount
  (cd "$REPO" && swift build -c release --product zdc -q >&2)
  local zdc="$REPO/.build/release/zdc" old=""
  fresh_disk zdcfs
  mkdir -p "$WORK/zd"
  ZDC_PASSPHRASE=benchpass "$zdc" init --state-dir "$DISK/zd-state" --store "$DISK/zd-store" \
    --kdf minimum >/dev/null
  if [ -n "${1:-}" ]; then old=$(cat "$URING_PARAM"); echo "$1" > "$URING_PARAM"; fi
  # shellcheck disable=SC2086 # ZDC_OPTS is a list of options
  ZDC_PASSPHRASE=benchpass "$zdc" mount --state-dir "$DISK/zd-state" $ZDC_OPTS "$WORK/zd" >&2
  MOUNTS+=("$WORK/zd"); wait_mounted "$WORK/zd" 20; MNT="$WORK/zd"
  # (The kernel reads the parameter again when the server answers INIT: a first request
  # answered means INIT was.)
  stat "$MNT" >/dev/null
  if [ -n "$old" ]; then echo "$old" > "$URING_PARAM"; fi
  if [ -n "${1:-}" ]; then
    ZDC_PASSPHRASE=benchpass "$zdc" status --state-dir "$DISK/zd-state" --json | python3 -c \
      "import json, sys; sys.exit(0 if json.load(sys.stdin)['kernel'].get('ioUring') else 1)" \
      || echo "${0##*/}: $2 does not use FUSE over io_uring" >&2
  fi
}
setup_zdcfs-uring() { setup_zdcfs Y zdcfs-uring; }

# Unmounts what setup_NAME mounted and stops its process, so that nothing it still does in
# the background (uploads) runs during the next filesystem's workloads.
teardown() {  # teardown NAME
  case "$1" in
    plain) ;;
    zdcfs | zdcfs-uring)
      ZDC_PASSPHRASE=benchpass "$REPO/.build/release/zdc" unmount --no-wait \
        --state-dir "$DISK/zd-state" "$MNT" >/dev/null 2>&1 || fusermount3 -uz "$MNT" ;;
    *)
      fusermount3 -u "$MNT" 2>/dev/null || fusermount3 -uz "$MNT" 2>/dev/null || true
      for p in "${PIDS[@]}"; do
        for _ in $(seq 1 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
        kill -9 "$p" 2>/dev/null || true
      done
      PIDS=() ;;
  esac
  sleep 1
  umount "$DISK" 2>/dev/null || umount -l "$DISK" 2>/dev/null || true
}
