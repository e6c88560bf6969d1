#!/usr/bin/env bash
# Make sure the Redis and PostgreSQL images the tests run are on this machine.
#
# Where Docker can pull the official images (redis:7, postgres:15), the tests
# use those. Where no registry is reachable, local test images are built from
# Debian bookworm's packages with debootstrap and `docker import` instead, and
# the tests prefer them whenever they exist. RATEWARDEN_REDIS_IMAGE and
# RATEWARDEN_POSTGRES_IMAGE name other images and skip both steps.
#
#   ratewarden-test-redis:7       redis-server 7.0 + redis-tools (redis-cli, redis-benchmark)
#                              ENTRYPOINT execs: redis-server --bind 0.0.0.0 --protected-mode no
#                                                --save '' --appendonly no "$@"
#                              ready line (stdout): "Ready to accept connections"
#   ratewarden-test-postgres:15   postgresql-15 (includes pg_stat_statements) + postgresql-client-15
#                              trust auth, user postgres, fsync off, max_connections=200
#                              ready line (stderr): "database system is ready to accept connections"
#
# Extra arguments to `docker run IMAGE ...` that start with '-' are appended to the
# server command line (e.g. `--port 7001 --cluster-enabled yes`, or `-c work_mem=8MB`);
# any other first argument is executed as a command instead (e.g. `redis-cli --version`).
#
# Usage: scripts/build-test-images.sh [--force] [--verify]
#   --force   build the local images even if they exist or the official ones can be pulled
#   --verify  also verify images that are reused (built images are always verified)
# Environment:
#   DEBIAN_MIRROR   Debian mirror (default http://deb.debian.org/debian)
#   DEBIAN_SUITE    Debian suite (default bookworm; the tags assume bookworm)
#   TMPDIR          where the temporary rootfs is created (default /var/tmp)
#   RATEWARDEN_IMAGE_LOCK  the lock file that orders runs on one Docker engine
#                   (default /tmp/ratewarden-test-images.lock)
#
# Two runs on one engine (two checkouts testing at once) take turns: the
# second waits on the lock, then finds the first one's images and reuses them,
# so neither retags or removes an image the other is building or verifying.
set -euo pipefail

REDIS_IMAGE=ratewarden-test-redis:7
POSTGRES_IMAGE=ratewarden-test-postgres:15
REDIS_OFFICIAL=redis:7
POSTGRES_OFFICIAL=postgres:15
PULL_TIMEOUT=${PULL_TIMEOUT:-120}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
SUITE=${DEBIAN_SUITE:-bookworm}
READY_TIMEOUT=60

FORCE=0
VERIFY_REUSED=0
for arg in "$@"; do
    case "$arg" in
        --force) FORCE=1 ;;
        --verify) VERIFY_REUSED=1 ;;
        -h|--help) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
        *) echo "unknown argument: $arg (try --help)" >&2; exit 2 ;;
    esac
done

die() { echo "error: $*" >&2; exit 1; }

SUDO=()
if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || die "must run as root (or have sudo): debootstrap needs root"
    SUDO=(sudo)
fi

command -v docker >/dev/null || die "docker not found"
docker info >/dev/null 2>&1 || die "cannot talk to the docker engine"

# Opened read-only (flock needs no more), so that a lock file another user
# created serves this run too.
LOCK=${RATEWARDEN_IMAGE_LOCK:-/tmp/ratewarden-test-images.lock}
if command -v flock >/dev/null; then
    [ -e "$LOCK" ] || (umask 000 && : >"$LOCK") 2>/dev/null || true
    exec 9<"$LOCK" || die "cannot open the lock file $LOCK (set RATEWARDEN_IMAGE_LOCK)"
    if ! flock -n 9; then
        echo "another run is preparing the test images; waiting for it ($LOCK) ..."
        flock 9
    fi
else
    echo "warning: no flock; a concurrent run on this Docker engine may collide with this one" >&2
fi

ensure_debootstrap() {
    if command -v debootstrap >/dev/null || [ -x /usr/sbin/debootstrap ]; then
        return
    fi
    echo "installing debootstrap ..."
    "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq
    "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap >/dev/null
}

# --- temporary rootfs handling ----------------------------------------------------------

ROOTFS=""
cleanup_rootfs() {
    [ -n "$ROOTFS" ] || return 0
    if [ -d "$ROOTFS" ]; then
        # debootstrap unmounts proc/sys itself, but not if it was interrupted.
        local m
        for m in $(findmnt -rn -o TARGET | grep -F "$ROOTFS/" | sort -r || true); do
            "${SUDO[@]}" umount -l "$m" || true
        done
        "${SUDO[@]}" rm -rf --one-file-system "$ROOTFS"
    fi
    ROOTFS=""
}

VERIFY_CID=""
cleanup_container() {
    if [ -n "$VERIFY_CID" ]; then
        docker rm -f "$VERIFY_CID" >/dev/null 2>&1 || true
        VERIFY_CID=""
    fi
}
trap 'cleanup_container; cleanup_rootfs' EXIT
trap 'exit 130' INT TERM

# make_rootfs PKGS -> sets ROOTFS
make_rootfs() {
    local pkgs=$1 log
    ROOTFS=$(mktemp -d "${TMPDIR:-/var/tmp}/ratewarden-rootfs.XXXXXX")
    log="$ROOTFS.log"
    if ! "${SUDO[@]}" debootstrap --variant=minbase --include="$pkgs" \
            "$SUITE" "$ROOTFS" "$MIRROR" >"$log" 2>&1; then
        tail -n 30 "$log" >&2
        rm -f "$log"
        die "debootstrap failed (packages: $pkgs)"
    fi
    rm -f "$log"
}

slim_rootfs() {
    "${SUDO[@]}" sh -c '
        cd "$1"
        rm -rf var/cache/apt/archives/*.deb var/cache/apt/*.bin var/lib/apt/lists/* \
               usr/share/doc usr/share/man usr/share/locale usr/share/info \
               var/log/*.log var/log/apt/* debootstrap
    ' sh "$ROOTFS"
}

install_file() { # install_file PATH-IN-ROOTFS MODE  (content on stdin)
    "${SUDO[@]}" mkdir -p "$(dirname "$ROOTFS$1")"
    "${SUDO[@]}" tee "$ROOTFS$1" >/dev/null
    "${SUDO[@]}" chmod "$2" "$ROOTFS$1"
}

# import_rootfs IMAGE CHANGE...
import_rootfs() {
    local image=$1; shift
    local changes=() c
    for c in "$@"; do changes+=(-c "$c"); done
    "${SUDO[@]}" tar --numeric-owner -C "$ROOTFS" \
        --exclude='./proc/*' --exclude='./sys/*' --exclude='./dev/*' -c . \
        | docker import "${changes[@]}" - "$image" >/dev/null
}

# --- image definitions ------------------------------------------------------------------

build_redis() {
    make_rootfs redis-server,redis-tools
    install_file /usr/local/bin/docker-entrypoint.sh 0755 <<'EOF'
#!/bin/sh
# Runs redis-server in the foreground (log on stdout) with test defaults; extra
# arguments starting with '-' are appended, so later options override the defaults.
set -e
if [ "$#" -eq 0 ] || [ "${1#-}" != "$1" ]; then
    exec redis-server --bind 0.0.0.0 --protected-mode no --save '' --appendonly no "$@"
fi
exec "$@"
EOF
    slim_rootfs
    import_rootfs "$REDIS_IMAGE" \
        'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        'ENTRYPOINT ["/usr/local/bin/docker-entrypoint.sh"]' \
        'EXPOSE 6379' \
        'WORKDIR /tmp'
}

build_postgres() {
    make_rootfs postgresql-15,postgresql-client-15
    # The package's postinst creates a default cluster; the entrypoint makes its own.
    "${SUDO[@]}" rm -rf "$ROOTFS/var/lib/postgresql/15" "$ROOTFS/etc/postgresql/15"
    [ -e "$ROOTFS/usr/lib/postgresql/15/lib/pg_stat_statements.so" ] \
        || die "pg_stat_statements.so missing from postgresql-15"
    [ -x "$ROOTFS/usr/bin/setpriv" ] || die "setpriv missing from the minbase rootfs"
    install_file /usr/local/bin/pg-init 0755 <<'EOF'
#!/bin/sh
# As root: creates $PGDATA and /var/run/postgresql owned by postgres and, if
# $PGDATA is empty, initialises a trust-auth cluster there (as postgres: initdb
# refuses to run as root). The image ships with $PGDATA already initialised.
set -eu
PGDATA=${PGDATA:-/var/lib/postgresql/data}
mkdir -p "$PGDATA" /var/run/postgresql
chown postgres:postgres "$PGDATA" /var/run/postgresql
chmod 700 "$PGDATA"
chmod 2775 /var/run/postgresql
if [ -z "$(ls -A "$PGDATA")" ]; then
    setpriv --reuid=postgres --regid=postgres --init-groups \
        /usr/lib/postgresql/15/bin/initdb -D "$PGDATA" -U postgres --auth=trust \
        --encoding=UTF8 --no-locale --no-sync >/dev/null
    printf '%s\n' 'host all all 0.0.0.0/0 trust' 'host all all ::/0 trust' >>"$PGDATA/pg_hba.conf"
fi
EOF
    install_file /usr/local/bin/docker-entrypoint.sh 0755 <<'EOF'
#!/bin/sh
# Runs postgres in the foreground as the postgres user (its log goes to stderr);
# extra arguments starting with '-' are appended to the postgres command line
# (e.g. `-c work_mem=8MB`); any other first argument is executed instead.
set -eu
if [ "$#" -eq 0 ] || [ "${1#-}" != "$1" ]; then
    /usr/local/bin/pg-init
    export HOME=/var/lib/postgresql
    exec setpriv --reuid=postgres --regid=postgres --init-groups \
        /usr/lib/postgresql/15/bin/postgres -D "${PGDATA:-/var/lib/postgresql/data}" \
        -c listen_addresses='*' \
        -c fsync=off -c synchronous_commit=off -c full_page_writes=off \
        -c shared_preload_libraries=pg_stat_statements \
        -c max_connections=200 \
        "$@"
fi
exec "$@"
EOF
    slim_rootfs
    local changes=(
        'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/lib/postgresql/15/bin:/usr/sbin:/usr/bin:/sbin:/bin'
        'ENV PGDATA=/var/lib/postgresql/data'
        'ENTRYPOINT ["/usr/local/bin/docker-entrypoint.sh"]'
        'CMD []'
        'EXPOSE 5432'
    )
    # (No STOPSIGNAL: `docker import/commit -c` on engine 20.10 / API 1.41 rejects it, so
    # `docker stop` sends SIGTERM = smart shutdown; tests remove containers with rm -f.)
    # This run's own intermediate tag: an engine shared with a run on another
    # machine (where the lock does not reach) never sees two builds share it.
    local rootfs_image="$POSTGRES_IMAGE-rootfs-$$-$RANDOM"
    import_rootfs "$rootfs_image" "${changes[@]}"
    cleanup_rootfs
    # initdb on the engine's fuse-overlayfs takes ~4 s, so run it once here and commit
    # the result: containers then start in ~1 s (pg-init skips a non-empty $PGDATA; an
    # empty volume/tmpfs mounted on $PGDATA is initialised at start instead).
    VERIFY_CID=$(docker create "$rootfs_image" pg-init)
    docker start -a "$VERIFY_CID" || die "pg-init failed while building $POSTGRES_IMAGE"
    local c commit_changes=()
    for c in "${changes[@]}"; do commit_changes+=(-c "$c"); done
    docker commit "${commit_changes[@]}" "$VERIFY_CID" "$POSTGRES_IMAGE" >/dev/null
    cleanup_container
    docker rmi "$rootfs_image" >/dev/null
}

# --- verification -----------------------------------------------------------------------

# wait_for_log CID STREAM(stdout|stderr) TEXT
wait_for_log() {
    local cid=$1 stream=$2 text=$3 deadline=$((SECONDS + READY_TIMEOUT)) out
    while :; do
        if [ "$stream" = stdout ]; then
            out=$(docker logs "$cid" 2>/dev/null) || true
        else
            out=$(docker logs "$cid" 2>&1 >/dev/null) || true
        fi
        if grep -qF -- "$text" <<<"$out"; then
            return 0
        fi
        if [ "$(docker inspect -f '{{.State.Running}}' "$cid" 2>/dev/null)" != true ]; then
            docker logs "$cid" >&2 || true
            die "container exited before logging '$text' on $stream"
        fi
        if [ "$SECONDS" -ge "$deadline" ]; then
            docker logs "$cid" >&2 || true
            die "no '$text' on $stream within ${READY_TIMEOUT}s"
        fi
        sleep 0.2
    done
}

host_port() { # host_port CID CONTAINER-PORT -> published port on 127.0.0.1
    docker port "$1" "$2/tcp" | sed -n 's/^127\.0\.0\.1:\([0-9]*\)$/\1/p' | head -n1
}

retry() { # retry N CMD... (0.5 s apart)
    local n=$1 i; shift
    for ((i = 1; i <= n; i++)); do
        if "$@"; then return 0; fi
        sleep 0.5
    done
    return 1
}

verify_redis() {
    local port reply
    docker run --rm --entrypoint redis-cli "$REDIS_IMAGE" --version >/dev/null \
        || die "$REDIS_IMAGE: redis-cli --version failed"
    VERIFY_CID=$(docker run -d -p 127.0.0.1::6379 "$REDIS_IMAGE")
    wait_for_log "$VERIFY_CID" stdout "Ready to accept connections"
    port=$(host_port "$VERIFY_CID" 6379)
    [ -n "$port" ] || die "$REDIS_IMAGE: no published port on 127.0.0.1"
    if command -v redis-cli >/dev/null; then
        reply=$(retry 10 redis-cli -h 127.0.0.1 -p "$port" ping) || true
    else
        # No redis-cli on the host: check the published port is open, PING from inside.
        retry 10 bash -c "exec 3<>/dev/tcp/127.0.0.1/$port" \
            || die "$REDIS_IMAGE: port 127.0.0.1:$port not reachable"
        reply=$(docker exec "$VERIFY_CID" redis-cli ping) || true
    fi
    [ "$reply" = PONG ] || die "$REDIS_IMAGE: PING returned '$reply'"
    cleanup_container
    echo "verified $REDIS_IMAGE (PING -> PONG)"
}

verify_postgres() {
    local port reply
    docker run --rm --entrypoint pgbench "$POSTGRES_IMAGE" --version >/dev/null \
        || die "$POSTGRES_IMAGE: pgbench --version failed"
    VERIFY_CID=$(docker run -d -p 127.0.0.1::5432 "$POSTGRES_IMAGE")
    wait_for_log "$VERIFY_CID" stderr "database system is ready to accept connections"
    port=$(host_port "$VERIFY_CID" 5432)
    [ -n "$port" ] || die "$POSTGRES_IMAGE: no published port on 127.0.0.1"
    local sql="create extension if not exists pg_stat_statements; select 1 from pg_stat_statements limit 1; select 1"
    if command -v psql >/dev/null; then
        reply=$(retry 10 env PGCONNECT_TIMEOUT=5 psql -h 127.0.0.1 -p "$port" -U postgres -XAtq -c "$sql") || true
    else
        retry 10 bash -c "exec 3<>/dev/tcp/127.0.0.1/$port" \
            || die "$POSTGRES_IMAGE: port 127.0.0.1:$port not reachable"
        reply=$(docker exec "$VERIFY_CID" psql -h 127.0.0.1 -U postgres -XAtq -c "$sql") || true
    fi
    [ "$(tail -n1 <<<"$reply")" = 1 ] || die "$POSTGRES_IMAGE: 'select 1' returned '$reply'"
    cleanup_container
    echo "verified $POSTGRES_IMAGE (select 1, pg_stat_statements)"
}

# --- main -------------------------------------------------------------------------------

# build_image IMAGE BUILD-FN VERIFY-FN
build_image() {
    local image=$1 build=$2 verify=$3 start size old_id
    old_id=$(docker image inspect -f '{{.Id}}' "$image" 2>/dev/null) || old_id=""
    if [ "$FORCE" -eq 0 ] && [ -n "$old_id" ]; then
        echo "reusing $image"
        if [ "$VERIFY_REUSED" -eq 1 ]; then "$verify"; fi
        return 0
    fi
    ensure_debootstrap
    start=$SECONDS
    "$build"
    cleanup_rootfs
    # --force: drop the image the new build replaced (left untagged), if nothing uses it.
    if [ -n "$old_id" ] && [ "$(docker image inspect -f '{{len .RepoTags}}' "$old_id" 2>/dev/null)" = 0 ]; then
        docker rmi "$old_id" >/dev/null 2>&1 || true
    fi
    size=$(docker image inspect -f '{{.Size}}' "$image")
    echo "built $image in $((SECONDS - start))s ($((size / 1000000)) MB)"
    "$verify"
}

# official_or_build VAR OFFICIAL IMAGE BUILD-FN VERIFY-FN: the image named by
# $VAR, else the local image if built, else the official one if present or
# pullable, else the local one built now.
official_or_build() {
    local var=$1 official=$2 image=$3
    if [ -n "${!var:-}" ]; then
        echo "using $var=${!var}"
        return 0
    fi
    if [ "$FORCE" -eq 0 ] && ! docker image inspect "$image" >/dev/null 2>&1; then
        if docker image inspect "$official" >/dev/null 2>&1; then
            echo "using the official $official"
            return 0
        fi
        if timeout "$PULL_TIMEOUT" docker pull -q "$official" >/dev/null 2>&1; then
            echo "pulled the official $official"
            return 0
        fi
        echo "cannot pull $official; building $image from Debian's packages"
    fi
    build_image "$image" "$4" "$5"
}

official_or_build RATEWARDEN_REDIS_IMAGE "$REDIS_OFFICIAL" "$REDIS_IMAGE" build_redis verify_redis
official_or_build RATEWARDEN_POSTGRES_IMAGE "$POSTGRES_OFFICIAL" "$POSTGRES_IMAGE" build_postgres verify_postgres
