#!/usr/bin/env bash
# Builds cotald's container image from a release binary and starts it, on a machine with no
# Docker daemon, no registry for base images and no container runtime:
#   1. the base image (debian:<release>-slim, the release read from the Dockerfile) is made
#      with debootstrap from the Debian mirror in the machine's apt sources, and cached;
#   2. the Dockerfile's `release` target is built with buildah (its one RUN with buildah's
#      chroot isolation) from a release tarball of packaging/release.sh;
#   3. the image is started the way a container runtime would: its root file system mounted
#      read-only with a fresh volume for each VOLUME (initialised from the image, as Docker
#      does for a named volume), new mount, PID, IPC and network namespaces (loopback only),
#      /proc, /sys (read-only) and a minimal /dev, its Entrypoint and Cmd run as its User with
#      its Env and WorkingDir, all read from the image's config. Its HEALTHCHECK command is
#      run inside (as `docker exec` would) until it passes; an agent credential is minted
#      inside, a message goes from one agent to another through the listener (the image's own
#      binary as the client, in the container's network namespace); its STOPSIGNAL must stop
#      it with exit 0; a second start on the same volume must take the same credentials and CA.
#   4. prints the image's size, the time to ready, the round trips and the stops.
#
# Usage: packaging/docker/verify.sh [dist/cotald-<version>-<target>.tar.gz | path/to/cotald]
#   Without an argument it runs packaging/release.sh (cargo rebuilds only what changed).
#   Needs Linux, root, buildah, debootstrap, util-linux (unshare, nsenter) and iproute2
#   (ip); prints "verify.sh: skipped: <why>" and exits 0 when the machine lacks them.
#   COTALD_IMAGE_CACHE (default ~/.cache/cotald-image) keeps the base's tarball between runs;
#   delete it to make the base again. The image is left tagged localhost/cotald:verify.
set -euo pipefail

say() { printf 'verify.sh: %s\n' "$*"; }
skip() { say "skipped: $*"; exit 0; }
die() { printf 'verify.sh: FAILED: %s\n' "$*" >&2; exit 1; }

# The container's first process, run by `unshare` inside the new namespaces (as root, before
# the switch to the image's root file system and user).
#   --init ROOT WORKDIR UID GID ENVFILE VOLFILE -- ENTRYPOINT/CMD...
if [ "${1:-}" = --init ]; then
    root=$2 wd=$3 uid=$4 gid=$5 envfile=$6 volfile=$7
    shift 8
    ip link set lo up
    # Everything the image holds is read-only: the volumes are the only place it can write.
    mount --bind "$root" "$root"
    mount -o remount,bind,ro,nosuid,nodev "$root"
    while read -r host_dir path; do
        mount --bind "$host_dir" "$root$path"
        mount -o remount,bind,nosuid,nodev "$root$path"
    done < "$volfile"
    mount -t proc -o nosuid,nodev,noexec proc "$root/proc"
    mount -t sysfs -o ro,nosuid,nodev,noexec sysfs "$root/sys"
    mount -t tmpfs -o nosuid,noexec,mode=0755,size=64k tmpfs "$root/dev"
    for node in null zero full random urandom tty; do
        touch "$root/dev/$node"
        mount --bind "/dev/$node" "$root/dev/$node"
    done
    ln -s /proc/self/fd "$root/dev/fd"
    ln -s /proc/self/fd/0 "$root/dev/stdin"
    ln -s /proc/self/fd/1 "$root/dev/stdout"
    ln -s /proc/self/fd/2 "$root/dev/stderr"
    mount -o remount,ro,nosuid,noexec "$root/dev"
    mapfile -d '' -t image_env < "$envfile"
    # unshare switches the root, the directory and the user (dropping the supplementary groups,
    # and every capability as it leaves uid 0), then finds the entrypoint in the image's PATH.
    exec env -i "${image_env[@]}" "$(command -v unshare)" --root="$root" --wd="$wd" \
        --setgid "$gid" --setuid "$uid" -- "$@"
fi

arg=${1:-}
case $arg in '' | /*) ;; *) arg="$PWD/$arg" ;; esac
cd "$(dirname "$0")/../.."
repo=$(pwd)
self="$repo/packaging/docker/verify.sh"
dockerfile="$repo/packaging/docker/Dockerfile"
image=localhost/cotald:verify

# What the machine must allow.
[ "$(uname -s)" = Linux ] || skip "not Linux (the image is started with Linux namespaces)"
[ "$(id -u)" = 0 ] || skip "not root (buildah's storage, debootstrap, mounts and namespaces need root)"
missing=
for tool in buildah debootstrap unshare nsenter ip pgrep tar; do
    command -v "$tool" > /dev/null 2>&1 || missing="$missing $tool"
done
[ -z "$missing" ] || skip "missing:$missing (Debian: apt-get install buildah debootstrap util-linux iproute2 procps)"
unshare --mount --net --pid --ipc --fork true 2> /dev/null \
    || skip "this machine does not allow new mount/PID/IPC/network namespaces"

release=$(sed -n 's/^ARG DEBIAN_RELEASE=//p' "$dockerfile")
[ -n "$release" ] || die "no ARG DEBIAN_RELEASE=... in $dockerfile"
base_image="debian:$release-slim"

# The first http(s) mirror that apt uses for "$release" itself (one-line and deb822 sources).
debian_mirror() {
    local f
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
        [ -r "$f" ] || continue
        awk -v suite="$release" '
            $1 == "deb" {
                i = 2
                if ($2 ~ /^\[/) { while (i <= NF && $i !~ /\]$/) i++; i++ }
                if ($(i + 1) == suite && $i ~ /^https?:\/\//) print $i
            }' "$f"
    done
    for f in /etc/apt/sources.list.d/*.sources; do
        [ -r "$f" ] || continue
        awk -v suite="$release" '
            BEGIN { RS = ""; FS = "\n" }
            {
                types = uris = suites = ""; enabled = "yes"
                for (i = 1; i <= NF; i++) {
                    if ($i ~ /^#/ || !match($i, /^[A-Za-z-]+:/)) continue
                    key = tolower(substr($i, 1, RLENGTH - 1)); value = substr($i, RLENGTH + 1)
                    if (key == "types") types = value
                    else if (key == "uris") uris = value
                    else if (key == "suites") suites = value
                    else if (key == "enabled") enabled = value
                }
                if (enabled ~ /no/ || (" " types " ") !~ / deb / || (" " suites " ") !~ (" " suite " ")) next
                n = split(uris, u, " ")
                for (j = 1; j <= n; j++) if (u[j] ~ /^https?:\/\//) print u[j]
            }' "$f"
    done
}

work=$(mktemp -d "${TMPDIR:-/tmp}/cotald-verify.XXXXXX")
ctr=
outer=
pid=
tail_pid=
cleanup() {
    # The container's namespaces (and every mount in them) end with their processes.
    if [ -n "$outer" ] && kill -0 "$outer" 2> /dev/null; then
        [ -z "$pid" ] || kill -KILL "$pid" 2> /dev/null || true
        kill -KILL "$outer" 2> /dev/null || true
        wait "$outer" 2> /dev/null || true
    fi
    if [ -n "$tail_pid" ] && kill -0 "$tail_pid" 2> /dev/null; then
        kill -KILL "$tail_pid" 2> /dev/null || true
        wait "$tail_pid" 2> /dev/null || true
    fi
    if [ -n "$ctr" ]; then
        buildah umount "$ctr" > /dev/null 2>&1 || true
        buildah rm "$ctr" > /dev/null 2>&1 || true
    fi
    rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

now() { echo "$EPOCHREALTIME"; }
since() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.2f", b - a }'; }

# 1. The base image.
cache=${COTALD_IMAGE_CACHE:-$HOME/.cache/cotald-image}
arch=$(dpkg --print-architecture 2> /dev/null || uname -m)
base_tar="$cache/debian-$release-slim-$arch.tar"
if buildah inspect --type image "$base_image" > /dev/null 2>&1; then
    say "base image $base_image: in local storage"
else
    if [ ! -s "$base_tar" ]; then
        mirror=$(debian_mirror | head -n 1)
        [ -n "$mirror" ] || skip "no http(s) Debian mirror for $release in /etc/apt/sources.list{,.d}"
        say "making $base_image: debootstrap --variant=minbase $release from $mirror"
        mkdir -p "$cache"
        rootfs="$work/rootfs"
        started=$(now)
        if ! timeout 1800 debootstrap --variant=minbase "$release" "$rootfs" "$mirror" \
            > "$work/debootstrap.log" 2>&1; then
            tail -n 20 "$work/debootstrap.log" >&2
            die "debootstrap failed"
        fi
        # Slim as Debian's -slim images are: no package lists or caches, no documentation but
        # the copyright files, no manuals or translations; and nothing of this machine (its
        # hostname, resolver, device nodes), which a container runtime provides.
        rm -rf "${rootfs:?}"/var/lib/apt/lists/* "${rootfs:?}"/var/cache/apt/* \
            "${rootfs:?}"/var/cache/debconf/*-old "${rootfs:?}"/var/log/* \
            "${rootfs:?}"/usr/share/man/* "${rootfs:?}"/usr/share/info/* \
            "${rootfs:?}"/usr/share/groff/* "${rootfs:?}"/usr/share/lintian/* \
            "${rootfs:?}"/dev/* "${rootfs:?}"/etc/hostname
        find "$rootfs/usr/share/doc" -mindepth 1 ! -type d ! -name copyright -delete
        find "$rootfs/usr/share/doc" -mindepth 1 -type d -empty -delete
        find "$rootfs/usr/share/locale" -mindepth 1 -maxdepth 1 ! -name locale.alias -exec rm -rf {} +
        : > "$rootfs/etc/resolv.conf"
        tar --numeric-owner --xattrs -C "$rootfs" -cf "$base_tar.new" .
        mv "$base_tar.new" "$base_tar"
        rm -rf "$rootfs"
        say "base tarball $base_tar made in $(since "$started") s"
    fi
    base_ctr=$(buildah from --quiet scratch)
    buildah add --quiet "$base_ctr" "$base_tar" / > /dev/null
    buildah config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
        --cmd bash "$base_ctr"
    buildah commit --quiet --rm "$base_ctr" "$base_image" > /dev/null
    say "base image $base_image: imported from $base_tar"
fi

# 2. The runtime image, from a release tarball.
if [ -z "$arg" ]; then
    command -v cargo > /dev/null 2>&1 \
        || skip "no cargo to build the release binary (pass a release tarball or a binary)"
    say "building the release tarball: packaging/release.sh (CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-target})"
    started=$(now)
    arg=$(packaging/release.sh | tail -n 1)
    say "release tarball $arg in $(since "$started") s"
fi
case $arg in
    *.tar.gz)
        [ -f "$arg" ] || die "no such tarball: $arg"
        context=$(cd "$(dirname "$arg")" && pwd)
        name=$(basename "$arg" .tar.gz)
        ;;
    *)
        [ -x "$arg" ] || die "not a release tarball or an executable: $arg"
        # A binary alone: packed the way release.sh packs it.
        context="$work/context"
        name=cotald-given
        mkdir -p "$context/$name"
        cp "$arg" "$context/$name/cotald"
        tar -C "$context" -czf "$context/$name.tar.gz" "$name"
        ;;
esac
if buildah inspect --type image "$image" > /dev/null 2>&1; then
    buildah rmi "$image" > /dev/null
fi
say "building $image: buildah bud --target release (COTALD_RELEASE=$name)"
started=$(now)
if ! timeout 900 buildah bud --quiet --pull=never --isolation chroot --format docker \
    --target release --build-arg "COTALD_RELEASE=$name" -f "$dockerfile" -t "$image" \
    "$context" > "$work/build.log" 2>&1; then
    cat "$work/build.log" >&2
    die "buildah bud failed"
fi
built_in=$(since "$started")

# 3. The image's config: nothing below is assumed about the image but what it says.
config() { buildah inspect --type image --format "$1" "$image"; }
mapfile -t entrypoint < <(config '{{range .OCIv1.Config.Entrypoint}}{{println .}}{{end}}')
mapfile -t cmd < <(config '{{range .OCIv1.Config.Cmd}}{{println .}}{{end}}')
mapfile -t image_env < <(config '{{range .OCIv1.Config.Env}}{{println .}}{{end}}')
# shellcheck disable=SC2016 # a Go template's variables
mapfile -t volumes < <(config '{{range $path, $_ := .OCIv1.Config.Volumes}}{{println $path}}{{end}}')
mapfile -t health < <(config '{{with .Docker.Config.Healthcheck}}{{range .Test}}{{println .}}{{end}}{{end}}')
health_timeout=$(config '{{with .Docker.Config.Healthcheck}}{{.Timeout.Seconds}}{{end}}')
user=$(config '{{.OCIv1.Config.User}}')
wd=$(config '{{.OCIv1.Config.WorkingDir}}')
stop_signal=$(config '{{.OCIv1.Config.StopSignal}}')
wd=${wd:-/}
stop_signal=${stop_signal:-SIGTERM}
health_timeout=${health_timeout%.*}
[ "${health_timeout:-0}" -gt 0 ] 2> /dev/null || health_timeout=30
argv=("${entrypoint[@]}" "${cmd[@]}")
[ "${#argv[@]}" -gt 0 ] || die "the image has neither Entrypoint nor Cmd"
case ${health[0]:-} in
    CMD) health=("${health[@]:1}") ;;
    CMD-SHELL) health=(/bin/sh -c "${health[1]}") ;;
    *) die "the image has no HEALTHCHECK command" ;;
esac
[ "${#volumes[@]}" -gt 0 ] || die "the image declares no VOLUME"

ctr=$(buildah from --quiet --pull=never "$image")
root=$(buildah mount "$ctr")

# The user as Docker resolves it: a name or a number, the group from /etc/passwd unless given.
user=${user:-0}
user_name=${user%%:*}
group_name=
[ "$user" = "${user#*:}" ] || group_name=${user#*:}
passwd_line=$(awk -F: -v u="$user_name" '$1 == u || $3 == u { print; exit }' "$root/etc/passwd")
case $user_name in
    *[!0-9]*) uid=$(printf '%s\n' "$passwd_line" | cut -d: -f3) ;;
    *) uid=$user_name ;;
esac
[ -n "$uid" ] || die "user $user_name is not in the image's /etc/passwd"
case $group_name in
    '') gid=$(printf '%s\n' "$passwd_line" | cut -d: -f4); gid=${gid:-0} ;;
    *[!0-9]*) gid=$(awk -F: -v g="$group_name" '$1 == g { print $3; exit }' "$root/etc/group") ;;
    *) gid=$group_name ;;
esac
[ -n "$gid" ] || die "group $group_name is not in the image's /etc/group"
[ "$uid" != 0 ] || die "the image runs as root (User '$user')"
home=$(printf '%s\n' "$passwd_line" | cut -d: -f6)
# Docker adds HOME (from /etc/passwd, else /) when the image's Env has none.
printf '%s\n' "${image_env[@]}" | grep -q '^HOME=' || image_env+=("HOME=${home:-/}")
printf '%s\0' "${image_env[@]}" > "$work/env"

# A volume per VOLUME, initialised from the image's content there (owner, mode, files).
: > "$work/volumes"
for path in "${volumes[@]}"; do
    host_dir="$work/volume${path//\//_}"
    [ -d "$root$path" ] || die "no $path in the image"
    cp -a "$root$path" "$host_dir"
    printf '%s %s\n' "$host_dir" "$path" >> "$work/volumes"
done
data_volume=$(awk '$2 == "/data" { print $1 }' "$work/volumes")
[ -n "$data_volume" ] || die "the image has no /data volume"

# The client: the image's own binary, run here with a home of its own.
path_of_image=$(printf '%s\n' "${image_env[@]}" | sed -n 's/^PATH=//p')
program=${entrypoint[0]:-cotald}
client=
case $program in
    /*) [ ! -x "$root$program" ] || client="$root$program" ;;
    *)
        IFS=: read -r -a path_dirs <<< "${path_of_image:-/usr/bin:/bin}"
        for dir in "${path_dirs[@]}"; do
            if [ -x "$root$dir/$program" ]; then
                client="$root$dir/$program"
                break
            fi
        done
        ;;
esac
[ -n "$client" ] || die "$program is not in the image's PATH"
mkdir -p "$work/client/home"
cp "$client" "$work/client/cotald"
client="$work/client/cotald"

# Starts the container; sets $outer (the unshare on this side) and $pid (its first process).
start() {
    outer=''
    pid=
    unshare --mount --net --pid --ipc --fork -- \
        bash "$self" --init "$root" "$wd" "$uid" "$gid" "$work/env" "$work/volumes" -- "${argv[@]}" \
        > "$work/log.$1" 2>&1 &
    outer=$!
    for _ in $(seq 100); do
        pid=$(pgrep -P "$outer" || true)
        # Started once it runs in the image's root (until then it is the setup, as root).
        if [ -n "$pid" ] && [ "$(readlink "/proc/$pid/root" 2> /dev/null)" = "$root" ]; then
            return 0
        fi
        kill -0 "$outer" 2> /dev/null || break
        sleep 0.1
    done
    cat "$work/log.$1" >&2
    die "the container did not start"
}
# Runs a command in the running container, as `docker exec` does: its namespaces, root,
# working directory, user and Env. The first argument bounds it in seconds.
in_container() {
    local seconds=$1
    shift
    timeout "$seconds" env -i "${image_env[@]}" nsenter --target "$pid" --mount --net --pid \
        --ipc --root --wd --setgid "$gid" --setuid "$uid" -- "$@"
}
# Runs the client on this machine, in the container's network namespace only. The first
# argument bounds it in seconds.
agent() {
    local seconds=$1
    shift
    timeout "$seconds" nsenter --target "$pid" --net -- env -i HOME="$work/client/home" \
        NO_COLOR=1 PATH=/usr/sbin:/usr/bin:/sbin:/bin "$client" "$@"
}
# Polls the image's health check until it passes (60 s at most).
wait_ready() {
    local started=$1
    for _ in $(seq 300); do
        if in_container "$health_timeout" "${health[@]}" > "$work/health" 2>&1; then
            ready_in=$(since "$started")
            return 0
        fi
        kill -0 "$outer" 2> /dev/null || break
        sleep 0.2
    done
    cat "$work/health" "$work/log.$2" >&2
    die "the health check (${health[*]}) did not pass within 60 s"
}
# alice sends, bob (tailing since before) receives: the same message, from alice. bob's tail
# runs until that message is printed: what it prints first may be earlier messages (the
# durable copy of a message it already received live is delivered again at the next join).
round_trip() {
    local creds="$work/client" link text sent id started line
    link=$(cat "$creds/link")
    rm -f "$work/tail.out" "$work/tail.err"
    timeout 60 nsenter --target "$pid" --net -- env -i HOME="$work/client/home" NO_COLOR=1 \
        PATH=/usr/sbin:/usr/bin:/sbin:/bin "$client" tail --link "$link" \
        --creds "$creds/bob.creds" --ca "$creds/ca.pem" --no-history --json \
        > "$work/tail.out" 2> "$work/tail.err" &
    tail_pid=$!
    for _ in $(seq 150); do
        grep -q '^joined' "$work/tail.err" && break
        kill -0 "$tail_pid" 2> /dev/null || break
        sleep 0.2
    done
    if ! grep -q '^joined' "$work/tail.err"; then
        cat "$work/tail.err" "$work/tail.out" >&2
        die "bob's tail did not join"
    fi
    text="round trip $1 $(date +%s%N)"
    started=$(now)
    sent=$(agent 30 send --link "$link" --creds "$creds/alice.creds" --ca "$creds/ca.pem" "$text") \
        || die "alice's send failed: $sent"
    id=$(printf '%s\n' "$sent" | sed -n 's/^sent \([^ ]*\).*/\1/p')
    [ -n "$id" ] || die "alice's send printed no id: $sent"
    line=
    for _ in $(seq 3000); do
        line=$(grep -F "\"id\":\"$id\"" "$work/tail.out" || true)
        [ -z "$line" ] || break
        kill -0 "$tail_pid" 2> /dev/null || break
        sleep 0.01
    done
    trip_in=$(since "$started")
    kill -TERM "$tail_pid" 2> /dev/null || true
    wait "$tail_pid" 2> /dev/null || true
    tail_pid=
    if [ -z "$line" ] || [[ $line != *'"name":"alice"'* ]] || [[ $line != *"\"text\":\"$text\""* ]]; then
        cat "$work/tail.err" "$work/tail.out" >&2
        die "bob did not receive alice's message within 30 s ($sent)"
    fi
    others=$(grep -cvF "\"id\":\"$id\"" "$work/tail.out" || true)
    trip="alice sent $id, bob received it (from alice, the same text) in $trip_in s"
    [ "$others" = 0 ] || trip="$trip (and $others earlier message(s) first)"
}
# Sends the image's STOPSIGNAL to its first process; it must exit 0 within 30 s.
stop() {
    local started status=0
    started=$(now)
    kill -s "${stop_signal#SIG}" "$pid"
    for _ in $(seq 300); do
        kill -0 "$outer" 2> /dev/null || break
        sleep 0.1
    done
    kill -0 "$outer" 2> /dev/null && { cat "$work/log.$1" >&2; die "still running 30 s after $stop_signal"; }
    wait "$outer" || status=$?
    outer=
    [ "$status" = 0 ] || { cat "$work/log.$1" >&2; die "exit $status after $stop_signal"; }
    stopped_in=$(since "$started")
}

say "image $image built in $built_in s; User $user, Entrypoint+Cmd: ${argv[*]}, WorkingDir $wd, Volumes: ${volumes[*]}"

# First start: a fresh volume.
started=$(now)
start 1
wait_ready "$started" 1
first_ready=$ready_in
status_line=$(in_container "$health_timeout" "${health[@]}" | head -n 1)
id_line=$(in_container 10 id 2> /dev/null || echo "no id(1) in the image")
proc_ids=$(awk '/^(Uid|Gid|Groups):/ { $1 = $1; printf "%s%s", sep, $0; sep = "; " }' "/proc/$pid/status")
[ "$(awk '/^Uid:/ { print $2 }' "/proc/$pid/status")" = "$uid" ] || die "the entrypoint does not run as uid $uid"
version=$(in_container 10 "$program" --version | head -n 1)
# Where it can write: the read-write mounts are the volumes, /proc and the device nodes; the
# user can create a file in /data and nowhere else (not even in /tmp).
rw_mounts=$(awk '{ split($6, o, ","); if (o[1] == "rw") print $5 }' "/proc/$pid/mountinfo" \
    | sort | tr '\n' ' ')
in_container 10 touch /data/.verify-probe || die "the user cannot write in /data"
in_container 10 rm /data/.verify-probe
probed="/ /tmp /var/tmp /run /etc /usr/local/bin /dev"
for dir in $probed; do
    if in_container 10 touch "$dir/.verify-probe" 2>> "$work/probe"; then
        die "the user can write in $dir"
    fi
done
refusals=$(sed -n "s/.*': //p" "$work/probe" | sort -u | paste -s -d ',')
in_container 30 "$program" mint alice --allow-publish general --json > "$work/alice.json"
in_container 30 "$program" mint bob --json > "$work/bob.json"
# The credentials and the CA leave the container (as `docker cp` would).
json_field() { sed -n "s/.*\"$2\":\"\\([^\"]*\\)\".*/\\1/p" "$1"; }
for who in alice bob; do
    creds=$(json_field "$work/$who.json" creds)
    case $creds in /data/*) ;; *) die "$who's creds are not in /data: $creds" ;; esac
    cp "$data_volume${creds#/data}" "$work/client/$who.creds"
done
ca=$(json_field "$work/alice.json" ca)
cp "$data_volume${ca#/data}" "$work/client/ca.pem"
json_field "$work/alice.json" link > "$work/client/link"
round_trip 1
first_trip=$trip
stop 1
first_stop=$stopped_in
written=$(find "$data_volume" -mindepth 1 -maxdepth 1 -printf '%f\n' | sort | tr '\n' ' ')
data_mode=$(stat -c '%u:%g %a' "$data_volume")

# Second start: the same volume, the same credentials and CA.
started=$(now)
start 2
wait_ready "$started" 2
second_ready=$ready_in
cmp -s "$work/client/ca.pem" "$data_volume${ca#/data}" || die "the CA changed across restarts"
round_trip 2
second_trip=$trip
stop 2
second_stop=$stopped_in

# 4. Figures.
size=$(buildah images --format '{{.Size}}' "$image" | head -n 1)
base_size=$(buildah images --format '{{.Size}}' "$base_image" | head -n 1)
buildah push --quiet "$image" "oci-archive:$work/image.tar" > /dev/null
compressed=$(du -h "$work/image.tar" | cut -f 1)
say "image $image: $size ($compressed as a gzip-compressed OCI archive; base $base_image $base_size)"
say "$version; user: $id_line (the entrypoint's $proc_ids)"
say "read-write mounts: $rw_mounts(the root file system, /dev and /sys read-only); creating a file in $probed: $refusals"
say "/data (owner:group $data_mode) after start 1 holds: $written"
say "start 1 (new volume): ready in $first_ready s ($status_line)"
say "start 1: round trip through the listener: $first_trip"
say "start 1: $stop_signal -> exit 0 in $first_stop s"
say "start 2 (same volume): ready in $second_ready s; the same creds and CA: $second_trip"
say "start 2: $stop_signal -> exit 0 in $second_stop s"
say "passed"
