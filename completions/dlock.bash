_dlock() {
    local i cur prev opts cmd
    COMPREPLY=()
    if [[ "${BASH_VERSINFO[0]}" -ge 4 ]]; then
        cur="$2"
    else
        cur="${COMP_WORDS[COMP_CWORD]}"
    fi
    prev="$3"
    cmd=""
    opts=""

    for i in "${COMP_WORDS[@]:0:COMP_CWORD}"
    do
        case "${cmd},${i}" in
            ",$1")
                cmd="dlock"
                ;;
            dlock,check)
                cmd="dlock__subcmd__check"
                ;;
            dlock,hold)
                cmd="dlock__subcmd__hold"
                ;;
            dlock,list)
                cmd="dlock__subcmd__list"
                ;;
            dlock,release)
                cmd="dlock__subcmd__release"
                ;;
            dlock,run)
                cmd="dlock__subcmd__run"
                ;;
            dlock,status)
                cmd="dlock__subcmd__status"
                ;;
            *)
                ;;
        esac
    done

    case "${cmd}" in
        dlock)
            opts="-v -q -h -V --verbose --quiet --config --help --version run status list release check hold"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 1 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                --config)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        dlock__subcmd__check)
            opts="-u -t -v -q -h -V --url --prefix --ttl --json --verbose --quiet --config --help --version"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 2 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                --url)
                    COMPREPLY=($(compgen -W "file:// redis:// rediss:// redis+unix:// redis-sentinel:// rediss-sentinel:// etcd:// etcds:// zk:// postgres:// postgresql:// mysql:// mariadb:// memcached:// memcached+unix:// az:// s3:// nats:// tls:// nats+tls://" -- "${cur}"))
                    return 0
                    ;;
                -u)
                    COMPREPLY=($(compgen -W "file:// redis:// rediss:// redis+unix:// redis-sentinel:// rediss-sentinel:// etcd:// etcds:// zk:// postgres:// postgresql:// mysql:// mariadb:// memcached:// memcached+unix:// az:// s3:// nats:// tls:// nats+tls://" -- "${cur}"))
                    return 0
                    ;;
                --prefix)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --ttl)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                -t)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --config)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        dlock__subcmd__hold)
            opts="-u -w -n -s -x -E -t -l -c -v -q -h -V --url --prefix --wait --no-wait --shared --exclusive --conflict-exit-code --ttl --limit --on-lost --kill-after --local-queue --record-command --min-hold --report --also --until-released --max-hold --command --verbose --quiet --config --help --version"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 2 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                --url)
                    COMPREPLY=($(compgen -W "file:// redis:// rediss:// redis+unix:// redis-sentinel:// rediss-sentinel:// etcd:// etcds:// zk:// postgres:// postgresql:// mysql:// mariadb:// memcached:// memcached+unix:// az:// s3:// nats:// tls:// nats+tls://" -- "${cur}"))
                    return 0
                    ;;
                -u)
                    COMPREPLY=($(compgen -W "file:// redis:// rediss:// redis+unix:// redis-sentinel:// rediss-sentinel:// etcd:// etcds:// zk:// postgres:// postgresql:// mysql:// mariadb:// memcached:// memcached+unix:// az:// s3:// nats:// tls:// nats+tls://" -- "${cur}"))
                    return 0
                    ;;
                --prefix)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --wait)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                -w)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --conflict-exit-code)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                -E)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --ttl)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                -t)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --limit)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                -l)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --on-lost)
                    COMPREPLY=($(compgen -W "term kill ignore" -- "${cur}"))
                    return 0
                    ;;
                --kill-after)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --local-queue)
                    COMPREPLY=($(compgen -W "on off" -- "${cur}"))
                    return 0
                    ;;
                --record-command)
                    COMPREPLY=($(compgen -W "on off" -- "${cur}"))
                    return 0
                    ;;
                --min-hold)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --report)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --also)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --max-hold)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --command)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                -c)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --config)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        dlock__subcmd__list)
            opts="-u -v -q -h -V --url --prefix --json --verbose --quiet --config --help --version"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 2 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                --url)
                    COMPREPLY=($(compgen -W "file:// redis:// rediss:// redis+unix:// redis-sentinel:// rediss-sentinel:// etcd:// etcds:// zk:// postgres:// postgresql:// mysql:// mariadb:// memcached:// memcached+unix:// az:// s3:// nats:// tls:// nats+tls://" -- "${cur}"))
                    return 0
                    ;;
                -u)
                    COMPREPLY=($(compgen -W "file:// redis:// rediss:// redis+unix:// redis-sentinel:// rediss-sentinel:// etcd:// etcds:// zk:// postgres:// postgresql:// mysql:// mariadb:// memcached:// memcached+unix:// az:// s3:// nats:// tls:// nats+tls://" -- "${cur}"))
                    return 0
                    ;;
                --prefix)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --config)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        dlock__subcmd__release)
            opts="-u -v -q -h -V --url --prefix --force --handle --verbose --quiet --config --help --version"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 2 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                --url)
                    COMPREPLY=($(compgen -W "file:// redis:// rediss:// redis+unix:// redis-sentinel:// rediss-sentinel:// etcd:// etcds:// zk:// postgres:// postgresql:// mysql:// mariadb:// memcached:// memcached+unix:// az:// s3:// nats:// tls:// nats+tls://" -- "${cur}"))
                    return 0
                    ;;
                -u)
                    COMPREPLY=($(compgen -W "file:// redis:// rediss:// redis+unix:// redis-sentinel:// rediss-sentinel:// etcd:// etcds:// zk:// postgres:// postgresql:// mysql:// mariadb:// memcached:// memcached+unix:// az:// s3:// nats:// tls:// nats+tls://" -- "${cur}"))
                    return 0
                    ;;
                --prefix)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --handle)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --config)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        dlock__subcmd__run)
            __dlock_run_after_name && return 0
            opts="-u -w -n -s -x -E -t -l -c -v -q -h -V --url --prefix --wait --no-wait --shared --exclusive --conflict-exit-code --ttl --limit --on-lost --kill-after --local-queue --record-command --min-hold --report --also --command --verbose --quiet --config --help --version"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 2 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                --url)
                    COMPREPLY=($(compgen -W "file:// redis:// rediss:// redis+unix:// redis-sentinel:// rediss-sentinel:// etcd:// etcds:// zk:// postgres:// postgresql:// mysql:// mariadb:// memcached:// memcached+unix:// az:// s3:// nats:// tls:// nats+tls://" -- "${cur}"))
                    return 0
                    ;;
                -u)
                    COMPREPLY=($(compgen -W "file:// redis:// rediss:// redis+unix:// redis-sentinel:// rediss-sentinel:// etcd:// etcds:// zk:// postgres:// postgresql:// mysql:// mariadb:// memcached:// memcached+unix:// az:// s3:// nats:// tls:// nats+tls://" -- "${cur}"))
                    return 0
                    ;;
                --prefix)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --wait)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                -w)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --conflict-exit-code)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                -E)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --ttl)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                -t)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --limit)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                -l)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --on-lost)
                    COMPREPLY=($(compgen -W "term kill ignore" -- "${cur}"))
                    return 0
                    ;;
                --kill-after)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --local-queue)
                    COMPREPLY=($(compgen -W "on off" -- "${cur}"))
                    return 0
                    ;;
                --record-command)
                    COMPREPLY=($(compgen -W "on off" -- "${cur}"))
                    return 0
                    ;;
                --min-hold)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --report)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --also)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --command)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                -c)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --config)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        dlock__subcmd__status)
            opts="-u -v -q -h -V --url --prefix --json --verbose --quiet --config --help --version"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 2 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                --url)
                    COMPREPLY=($(compgen -W "file:// redis:// rediss:// redis+unix:// redis-sentinel:// rediss-sentinel:// etcd:// etcds:// zk:// postgres:// postgresql:// mysql:// mariadb:// memcached:// memcached+unix:// az:// s3:// nats:// tls:// nats+tls://" -- "${cur}"))
                    return 0
                    ;;
                -u)
                    COMPREPLY=($(compgen -W "file:// redis:// rediss:// redis+unix:// redis-sentinel:// rediss-sentinel:// etcd:// etcds:// zk:// postgres:// postgresql:// mysql:// mariadb:// memcached:// memcached+unix:// az:// s3:// nats:// tls:// nats+tls://" -- "${cur}"))
                    return 0
                    ;;
                --prefix)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --config)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
    esac
}

# dlock run: dlock's options stop at NAME; then a command, then its arguments.
__dlock_run_after_name() {
    local i=1 first
    while [[ $i -lt $COMP_CWORD && "${COMP_WORDS[i]}" != run ]]; do
        i=$((i + 1))
    done
    i=$((i + 1))
    while [[ $i -lt $COMP_CWORD ]]; do
        case "${COMP_WORDS[i]}" in
            --) i=$((i + 1)); break ;;
            -u|--url|--prefix|-w|--wait|-E|--conflict-exit-code|-t|--ttl|-l|--limit|--on-lost|--kill-after|--local-queue|--record-command|--min-hold|--report|--also|-c|--command|--config) i=$((i + 2)) ;;
            -*) i=$((i + 1)) ;;
            *) break ;;
        esac
    done
    [[ $i -lt $COMP_CWORD ]] || return 1
    first=$((i + 1))
    case "${COMP_WORDS[first]}" in
        --) [[ $first -lt $COMP_CWORD ]] && first=$((first + 1)) ;;
        -c|--command|-c*|--command=*) COMPREPLY=(); return 0 ;;
    esac
    if [[ $COMP_CWORD -eq $first ]]; then
        COMPREPLY=( $(compgen -c -- "${COMP_WORDS[COMP_CWORD]}") )
    else
        COMPREPLY=( $(compgen -f -- "${COMP_WORDS[COMP_CWORD]}") )
    fi
    return 0
}

if [[ "${BASH_VERSINFO[0]}" -eq 4 && "${BASH_VERSINFO[1]}" -ge 4 || "${BASH_VERSINFO[0]}" -gt 4 ]]; then
    complete -F _dlock -o nosort -o bashdefault -o default dlock
else
    complete -F _dlock -o bashdefault -o default dlock
fi
