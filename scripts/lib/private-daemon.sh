# Sourced by the scripts that run a private zygoted on a temporary state directory
# (sdk-test.sh, api-conformance.sh). They set STATE (the temporary directory, holding
# zygoted.log) and DAEMON_PID (empty until the daemon runs), and define die.

# Pids (other than the daemon) whose command line names $STATE: the VMs and
# supervisors this daemon started.
vm_pids() {
    local p
    for p in /proc/[0-9]*; do
        p=${p#/proc/}
        [ "$p" = "$DAEMON_PID" ] && continue
        tr '\0' ' ' 2>/dev/null <"/proc/$p/cmdline" | grep -qF -- "$STATE" && echo "$p"
    done
}

# Waits up to SECS for the daemon started in the background (DAEMON_PID, stdout in
# $STATE/zygoted.out) to announce its address; sets URL and TOKEN. Usage: wait_for_daemon SECS
wait_for_daemon() {
    local secs=$1
    URL=""
    for _ in $(seq $((secs * 10))); do
        URL=$(sed -n 's/^zygoted listening on //p' "$STATE/zygoted.out" 2>/dev/null | head -n1)
        [ -n "$URL" ] && break
        kill -0 "$DAEMON_PID" 2>/dev/null || die "zygoted exited during start-up (log below)"
        sleep 0.1
    done
    [ -n "$URL" ] || die "zygoted did not announce its address within $secs s"
    TOKEN=$(cat "$STATE/daemon/token")
}

# Makes the temporary state directory STATE for NAME's daemon and clears DAEMON_PID, URL
# and TOKEN. Usage: new_private_state NAME
new_private_state() {
    STATE=$(mktemp -d "${TMPDIR:-/tmp}/zygote-$1.XXXXXX")
    DAEMON_PID=""
    URL=""
    TOKEN=""
}

# An EXIT trap for a script whose only clean-up is its daemon: stops it, finishes after
# it, and exits with the script's status (or 1 if anything was left behind).
# Usage: trap 'private_daemon_exit NAME' EXIT
private_daemon_exit() {
    local status=$?
    stop_daemon
    finish_private_daemon "$1" "$status"
    status=$?
    echo "== $1: done (exit $status)"
    exit "$status"
}

# Gives the daemon a cache of its own in $STATE/cache: the user's kernel and built images
# (linked, never written: an image is named by its hash) and a copy of the image index;
# what it pulls, converts and packs goes away with $STATE. Prints the directory, for
# ZYGOTE_CACHE_DIR.
link_user_cache() {
    local user_cache=${ZYGOTE_CACHE_DIR:-${HOME:-/root}/.cache/zygote} cache="$STATE/cache" f
    mkdir -p "$cache/images/index"
    [ -d "$user_cache/kernel" ] && ln -s "$user_cache/kernel" "$cache/kernel"
    for f in "$user_cache"/images/*.ext4 "$user_cache"/images/*.json; do
        [ -e "$f" ] && ln -s "$f" "$cache/images/"
    done
    for f in "$user_cache"/images/index/*; do
        [ -f "$f" ] && cp "$f" "$cache/images/index/"
    done
    echo "$cache"
}

# Stops the daemon (TERM, then KILL after 10 s).
stop_daemon() {
    [ -n "$DAEMON_PID" ] && kill -0 "$DAEMON_PID" 2>/dev/null || return 0
    kill -TERM "$DAEMON_PID" 2>/dev/null
    for _ in $(seq 100); do kill -0 "$DAEMON_PID" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$DAEMON_PID" 2>/dev/null
    wait "$DAEMON_PID" 2>/dev/null
}

# After stop_daemon: kills VM processes left on $STATE (VMs outlive a daemon by design,
# but none may leak), shows the daemon's log if anything failed, removes $STATE.
# Usage: finish_private_daemon NAME STATUS; returns the final status.
finish_private_daemon() {
    local name=$1 status=$2 left
    left=$(vm_pids)
    if [ -n "$left" ]; then
        echo "$name: killing VM processes left on $STATE: $left" >&2
        kill -KILL $left 2>/dev/null
        status=1
    fi
    # Its network namespaces (named zygote-<first 8 hex of sha256(state dir)>-<sandbox>,
    # crates/net) outlive it too; a daemon that deleted its sandboxes
    # leaves none.
    local prefix ns
    if [ -d /run/netns ] && [ -d "$STATE/daemon" ]; then
        prefix="zygote-$(printf %s "$(realpath "$STATE/daemon")" | sha256sum | cut -c1-8)-"
        for ns in /run/netns/"$prefix"*; do
            [ -e "$ns" ] || continue
            echo "$name: removing network namespace ${ns##*/} left by the daemon" >&2
            ip netns del "${ns##*/}" 2>/dev/null
        done
    fi
    if [ "$status" -ne 0 ] && [ -s "$STATE/zygoted.log" ]; then
        echo "--- zygoted log (last 40 lines)" >&2
        tail -n 40 "$STATE/zygoted.log" >&2
    fi
    rm -rf "$STATE"
    return "$status"
}
