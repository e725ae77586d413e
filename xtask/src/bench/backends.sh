# `cargo xtask bench backends` in the guest (see xtask/src/bench/backends.rs): each run
# prints one `bench: {json}` line; a run that fails sets status=1. Set beforehand:
# record_prefix, load_args, warm_up_load_args and watch_args (shell-quoted words),
# load_ifname, load_timeout, attach_wait and stop_wait (seconds).
bench_dir=/tmp/bench
mkdir -p "$bench_dir"

# Whether process $1 still runs. busybox sh reaps its children whenever it waits for one,
# so one that exited is either gone or a zombie.
running() {
    [ -r "/proc/$1/stat" ] || return 1
    read -r _ _ state _ 2>/dev/null < "/proc/$1/stat" || return 1
    [ "$state" != Z ]
}

# The contents of file $1 as the inside of a JSON string, on one line.
json_text() {
    tr '\n\t' '  ' < "$1" | tr -d '\000-\037' | sed 's/\\/\\\\/g; s/"/\\"/g; s/ *$//' | head -c 400
}

# The last line of file $1 (a JSON report), or null.
last_or_null() {
    if [ -s "$1" ]; then tail -n 1 "$1"; else echo null; fi
}

# Stops process $1 with SIGTERM, kills it if it still runs after $stop_wait seconds, and
# sets stopped_rc to its exit code.
stop() {
    kill -TERM "$1"
    ticks=0
    while running "$1" && [ "$ticks" -lt $((stop_wait * 5)) ]; do
        sleep 0.2
        ticks=$((ticks + 1))
    done
    running "$1" && kill -KILL "$1"
    wait "$1"
    stopped_rc=$?
}

# bench_run ROUND VARIANT BACKEND: one load, with `tap-probe watch --backend BACKEND`
# attached unless BACKEND is empty; ROUND is a number, or warm-up for a shorter run that
# is not measured. A backend whose watch exits before attaching is recorded as unavailable
# once and skipped afterwards.
bench_run() {
    round=$1 variant=$2 backend=$3
    base="$bench_dir/$round-$variant"
    [ -e "$bench_dir/unavailable-$variant" ] && return
    if [ "$round" = warm-up ]; then
        label=warm-up
        record="\"round\":null,\"warm_up\":true,\"variant\":\"$variant\""
        run_load_args=$warm_up_load_args
    else
        label="round $round"
        record="\"round\":$round,\"variant\":\"$variant\""
        run_load_args=$load_args
    fi
    read -r up _ < /proc/uptime
    echo "init: bench $label: $variant (uptime $up s)"
    watch_pid= watch_rc=null watch=null error=
    if [ -n "$backend" ]; then
        eval "set -- $watch_args"
        /bin/tap-probe "$@" --backend "$backend" > "$base.watch" 2> "$base.watch-err" &
        watch_pid=$!
        ticks=0
        # Its first line means the probes are attached; only then may traffic start.
        while [ ! -s "$base.watch" ]; do
            if ! running "$watch_pid"; then
                wait "$watch_pid"
                watch_rc=$?
                echo "init: bench: the $backend watch exited $watch_rc before attaching"
                echo "$record_prefix{$record,\"watch_rc\":$watch_rc,\"unavailable\":\"$(json_text "$base.watch-err")\"}"
                : > "$bench_dir/unavailable-$variant"
                return
            fi
            if [ "$ticks" -ge $((attach_wait * 5)) ]; then
                stop "$watch_pid"
                echo "$record_prefix{$record,\"error\":\"tap-probe watch printed nothing within $attach_wait s\"}"
                status=1
                return
            fi
            sleep 0.2
            ticks=$((ticks + 1))
        done
    fi
    eval "set -- $run_load_args"
    timeout -s KILL "$load_timeout" /bin/tap-probe "$@" > "$base.load" 2> "$base.load-err"
    load_rc=$?
    [ "$load_rc" -eq 0 ] || error="tap-probe load exited $load_rc: $(json_text "$base.load-err")"
    if [ -n "$watch_pid" ]; then
        stop "$watch_pid"
        watch_rc=$stopped_rc
        [ "$watch_rc" -eq 0 ] ||
            error="${error:+$error; }tap-probe watch exited $watch_rc: $(json_text "$base.watch-err")"
        # Its last line that shows the load's tap holds the final counts.
        grep -F "\"$load_ifname\"" "$base.watch" | tail -n 1 > "$base.watch-last"
        watch=$(last_or_null "$base.watch-last")
    fi
    error_json=null
    if [ -n "$error" ]; then
        error_json="\"$error\""
        status=1
    fi
    echo "$record_prefix{$record,\"load_rc\":$load_rc,\"watch_rc\":$watch_rc,\"error\":$error_json,\"load\":$(last_or_null "$base.load"),\"watch\":$watch}"
    read -r up _ < /proc/uptime
    echo "init: bench $label: $variant done: load exited $load_rc, watch $watch_rc (uptime $up s)"
}

