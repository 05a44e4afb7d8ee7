# Shared by the benchmarks that run in the namespace lab (bench/cooperative/run.sh,
# bench/cyclone/fig9.sh): sourced after `top` (the repository) is set.
#
#   lab_tools            install wrk, curl and jq if missing; raise the descriptor limit
#   lab_binary           set `bin` to SWITCHYARD_BIN, or build the release binary (unless
#                        SKIP_BUILD) and use it
#   lab_workdir NAME     make `work` (/tmp/sy-NAME-XXXXXX), the labs' state directory
#                        (SWITCHYARD_LAB_DIR); every prefix added to `labs` is taken down on
#                        exit, with the tail of its logs when the script failed

lab_tools() {
    local missing=() cmd
    for cmd in wrk curl jq; do command -v "$cmd" >/dev/null || missing+=("$cmd"); done
    if [ ${#missing[@]} -gt 0 ]; then
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk curl jq
    fi
    ulimit -n "$(ulimit -Hn)"
}

lab_binary() {
    if [ -n "${SWITCHYARD_BIN:-}" ]; then
        bin=$SWITCHYARD_BIN
    else
        local target=${CARGO_TARGET_DIR:-$top/target}
        [ -n "${SKIP_BUILD:-}" ] || (cd "$top" && cargo build --release -q -p switchyard --bin switchyard)
        bin="$target/release/switchyard"
    fi
    [ -x "$bin" ] || { echo "no switchyard binary at $bin" >&2; exit 1; }
    bin=$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin")
}

lab_cleanup() {
    local rc=$? p f
    trap - EXIT INT TERM
    for p in "${labs[@]}"; do
        if [ "$rc" -ne 0 ]; then
            for f in "$work/$p"/*.log; do [ -f "$f" ] && { echo "--- $f" >&2; tail -n 15 "$f" >&2; }; done
        fi
        SWITCHYARD_LAB_DIR=$work timeout 120 "$bin" lab down --prefix "$p" >/dev/null 2>&1 || echo "warning: lab down --prefix $p failed" >&2
    done
    rm -rf "$work"
    exit "$rc"
}

lab_workdir() {
    work=$(mktemp -d "/tmp/sy-$1-XXXXXX")
    chmod 755 "$work"
    labs=()
    trap lab_cleanup EXIT
    trap 'exit 130' INT TERM
    export SWITCHYARD_LAB_DIR=$work
}
