# Print an optspec for argparse to handle cmd's options that are independent of any subcommand.
function __fish_dlock_global_optspecs
    string join \n v/verbose q/quiet config= h/help V/version
end

function __fish_dlock_needs_command
    # Figure out if the current invocation already has a command.
    set -l cmd (commandline -opc)
    set -e cmd[1]
    argparse -s (__fish_dlock_global_optspecs) -- $cmd 2>/dev/null
    or return
    if set -q argv[1]
        # Also print the command, so this can be used to figure out what it is.
        echo $argv[1]
        return 1
    end
    return 0
end

function __fish_dlock_using_subcommand
    set -l cmd (__fish_dlock_needs_command)
    test -z "$cmd"
    and return 1
    contains -- $cmd[1] $argv
end

complete -c dlock -n "__fish_dlock_needs_command" -l config -d 'Config file (TOML; see man dlock.toml)' -r -F
complete -c dlock -n "__fish_dlock_needs_command" -s v -l verbose -d 'More messages on stderr (repeat for more)'
complete -c dlock -n "__fish_dlock_needs_command" -s q -l quiet -d 'Fewer messages on stderr (repeat for none)'
complete -c dlock -n "__fish_dlock_needs_command" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c dlock -n "__fish_dlock_needs_command" -s V -l version -d 'Print version'
complete -c dlock -n "__fish_dlock_needs_command" -f -a "run" -d 'Acquire NAME, run COMMAND with the lock held, release, exit with its status'
complete -c dlock -n "__fish_dlock_needs_command" -f -a "status" -d 'Show who holds NAME and who waits for it (exit 0 when held, 1 when free)'
complete -c dlock -n "__fish_dlock_needs_command" -f -a "list" -d 'List held locks under the namespace'
complete -c dlock -n "__fish_dlock_needs_command" -f -a "release" -d 'End your hold of NAME (`dlock hold`); with --force, break anyone\'s (admin)'
complete -c dlock -n "__fish_dlock_needs_command" -f -a "check" -d 'Check that the backend can be reached and used: latency, version, permissions'
complete -c dlock -n "__fish_dlock_needs_command" -f -a "hold" -d 'Take NAME for the calling shell: print variables for `eval`, keep the lock in the background until that shell ends or `dlock release NAME`'
complete -c dlock -n "__fish_dlock_using_subcommand run; and __fish_dlock_run_options" -s u -l url -d 'Backend URL, e.g. redis://host or etcd://host:2379 (every form: --help) [default: a lock file on this host]' -r -f -a "file://\t''
redis://\t''
rediss://\t''
redis+unix://\t''
redis-sentinel://\t''
rediss-sentinel://\t''
etcd://\t''
etcds://\t''
zk://\t''
postgres://\t''
postgresql://\t''
mysql://\t''
mariadb://\t''
memcached://\t''
memcached+unix://\t''
az://\t''
s3://\t''
nats://\t''
tls://\t''
nats+tls://\t''"
complete -c dlock -n "__fish_dlock_using_subcommand run; and __fish_dlock_run_options" -l prefix -d 'Namespace for keys and paths [default: dlock]' -r
complete -c dlock -n "__fish_dlock_using_subcommand run; and __fish_dlock_run_options" -s w -l wait -d 'Give up after waiting this long (500ms, 30s, 5m; a bare number is seconds)' -r
complete -c dlock -n "__fish_dlock_using_subcommand run; and __fish_dlock_run_options" -s E -l conflict-exit-code -d 'Exit status when the lock was not acquired [default: 75]' -r
complete -c dlock -n "__fish_dlock_using_subcommand run; and __fish_dlock_run_options" -s t -l ttl -d 'Lease length [default: 15s]' -r
complete -c dlock -n "__fish_dlock_using_subcommand run; and __fish_dlock_run_options" -s l -l limit -d 'Semaphore: up to N holders at once [default: 1]' -r
complete -c dlock -n "__fish_dlock_using_subcommand run; and __fish_dlock_run_options" -l on-lost -d 'What to do when the lock is lost while the command runs [default: term]' -r -f -a "term\t'SIGTERM the command\'s process group, SIGKILL after --kill-after'
kill\t'SIGKILL the command\'s process group at once'
ignore\t'Let the command run on without the lock (a warning is printed)'"
complete -c dlock -n "__fish_dlock_using_subcommand run; and __fish_dlock_run_options" -l kill-after -d 'Grace between SIGTERM and SIGKILL, on lock loss and after a forwarded signal [default: 10s]' -r
complete -c dlock -n "__fish_dlock_using_subcommand run; and __fish_dlock_run_options" -l local-queue -d 'Wait in a queue on this host first, so that only the head of the queue holds a server connection (remote backends, when waiting) [default: on]' -r -f -a "on\t''
off\t''"
complete -c dlock -n "__fish_dlock_using_subcommand run; and __fish_dlock_run_options" -l record-command -d 'Record the command line in the lock\'s metadata, where `status` and `list` show it (secret-looking values masked); off records none [default: on]' -r -f -a "on\t''
off\t''"
complete -c dlock -n "__fish_dlock_using_subcommand run; and __fish_dlock_run_options" -l min-hold -d 'Keep the lock at least this long' -r
complete -c dlock -n "__fish_dlock_using_subcommand run; and __fish_dlock_run_options" -l report -d 'Append one JSON line per run to PATH' -r -F
complete -c dlock -n "__fish_dlock_using_subcommand run; and __fish_dlock_run_options" -l also -d 'Hold NAME as well (repeatable): all the names or none' -r
complete -c dlock -n "__fish_dlock_using_subcommand run; and __fish_dlock_run_options" -s c -l command -d 'Run SHELL-COMMAND with "$SHELL -c" (or /bin/sh -c) instead of COMMAND' -r
complete -c dlock -n "__fish_dlock_using_subcommand run; and __fish_dlock_run_options" -l config -d 'Config file (TOML; see man dlock.toml)' -r -F
complete -c dlock -n "__fish_dlock_using_subcommand run; and __fish_dlock_run_options" -s n -l no-wait -d 'Give up at once if the lock is held'
complete -c dlock -n "__fish_dlock_using_subcommand run; and __fish_dlock_run_options" -s s -l shared -d 'Hold the lock shared: any number of shared holders at once, or one exclusive holder (a run without --shared)'
complete -c dlock -n "__fish_dlock_using_subcommand run; and __fish_dlock_run_options" -s x -l exclusive -d 'Hold the lock exclusively (the default), whatever DLOCK_SHARED or the config file say'
complete -c dlock -n "__fish_dlock_using_subcommand run; and __fish_dlock_run_options" -s v -l verbose -d 'More messages on stderr (repeat for more)'
complete -c dlock -n "__fish_dlock_using_subcommand run; and __fish_dlock_run_options" -s q -l quiet -d 'Fewer messages on stderr (repeat for none)'
complete -c dlock -n "__fish_dlock_using_subcommand run; and __fish_dlock_run_options" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c dlock -n "__fish_dlock_using_subcommand run; and __fish_dlock_run_options" -s V -l version -d 'Print version'
complete -c dlock -n "__fish_dlock_using_subcommand status" -s u -l url -d 'Backend URL, e.g. redis://host or etcd://host:2379 (every form: --help) [default: a lock file on this host]' -r -f -a "file://\t''
redis://\t''
rediss://\t''
redis+unix://\t''
redis-sentinel://\t''
rediss-sentinel://\t''
etcd://\t''
etcds://\t''
zk://\t''
postgres://\t''
postgresql://\t''
mysql://\t''
mariadb://\t''
memcached://\t''
memcached+unix://\t''
az://\t''
s3://\t''
nats://\t''
tls://\t''
nats+tls://\t''"
complete -c dlock -n "__fish_dlock_using_subcommand status" -l prefix -d 'Namespace for keys and paths [default: dlock]' -r
complete -c dlock -n "__fish_dlock_using_subcommand status" -l config -d 'Config file (TOML; see man dlock.toml)' -r -F
complete -c dlock -n "__fish_dlock_using_subcommand status" -l json -d 'Print JSON instead of text'
complete -c dlock -n "__fish_dlock_using_subcommand status" -s v -l verbose -d 'More messages on stderr (repeat for more)'
complete -c dlock -n "__fish_dlock_using_subcommand status" -s q -l quiet -d 'Fewer messages on stderr (repeat for none)'
complete -c dlock -n "__fish_dlock_using_subcommand status" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c dlock -n "__fish_dlock_using_subcommand status" -s V -l version -d 'Print version'
complete -c dlock -n "__fish_dlock_using_subcommand list" -s u -l url -d 'Backend URL, e.g. redis://host or etcd://host:2379 (every form: --help) [default: a lock file on this host]' -r -f -a "file://\t''
redis://\t''
rediss://\t''
redis+unix://\t''
redis-sentinel://\t''
rediss-sentinel://\t''
etcd://\t''
etcds://\t''
zk://\t''
postgres://\t''
postgresql://\t''
mysql://\t''
mariadb://\t''
memcached://\t''
memcached+unix://\t''
az://\t''
s3://\t''
nats://\t''
tls://\t''
nats+tls://\t''"
complete -c dlock -n "__fish_dlock_using_subcommand list" -l prefix -d 'Namespace for keys and paths [default: dlock]' -r
complete -c dlock -n "__fish_dlock_using_subcommand list" -l config -d 'Config file (TOML; see man dlock.toml)' -r -F
complete -c dlock -n "__fish_dlock_using_subcommand list" -l json -d 'Print JSON instead of text'
complete -c dlock -n "__fish_dlock_using_subcommand list" -s v -l verbose -d 'More messages on stderr (repeat for more)'
complete -c dlock -n "__fish_dlock_using_subcommand list" -s q -l quiet -d 'Fewer messages on stderr (repeat for none)'
complete -c dlock -n "__fish_dlock_using_subcommand list" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c dlock -n "__fish_dlock_using_subcommand list" -s V -l version -d 'Print version'
complete -c dlock -n "__fish_dlock_using_subcommand release" -s u -l url -d 'Backend URL, e.g. redis://host or etcd://host:2379 (every form: --help) [default: a lock file on this host]' -r -f -a "file://\t''
redis://\t''
rediss://\t''
redis+unix://\t''
redis-sentinel://\t''
rediss-sentinel://\t''
etcd://\t''
etcds://\t''
zk://\t''
postgres://\t''
postgresql://\t''
mysql://\t''
mariadb://\t''
memcached://\t''
memcached+unix://\t''
az://\t''
s3://\t''
nats://\t''
tls://\t''
nats+tls://\t''"
complete -c dlock -n "__fish_dlock_using_subcommand release" -l prefix -d 'Namespace for keys and paths [default: dlock]' -r
complete -c dlock -n "__fish_dlock_using_subcommand release" -l handle -d 'The hold to end: the value of DLOCK_HOLD that `dlock hold` printed [default: the hold of NAME named in DLOCK_HELD]' -r
complete -c dlock -n "__fish_dlock_using_subcommand release" -l config -d 'Config file (TOML; see man dlock.toml)' -r -F
complete -c dlock -n "__fish_dlock_using_subcommand release" -l force -d 'Break the lock whoever holds it (admin): the holder then detects the loss and stops its command. The file backend refuses and names the holder\'s pid. Without it, release ends only your own hold (dlock hold)'
complete -c dlock -n "__fish_dlock_using_subcommand release" -s v -l verbose -d 'More messages on stderr (repeat for more)'
complete -c dlock -n "__fish_dlock_using_subcommand release" -s q -l quiet -d 'Fewer messages on stderr (repeat for none)'
complete -c dlock -n "__fish_dlock_using_subcommand release" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c dlock -n "__fish_dlock_using_subcommand release" -s V -l version -d 'Print version'
complete -c dlock -n "__fish_dlock_using_subcommand check" -s u -l url -d 'Backend URL, e.g. redis://host or etcd://host:2379 (every form: --help) [default: a lock file on this host]' -r -f -a "file://\t''
redis://\t''
rediss://\t''
redis+unix://\t''
redis-sentinel://\t''
rediss-sentinel://\t''
etcd://\t''
etcds://\t''
zk://\t''
postgres://\t''
postgresql://\t''
mysql://\t''
mariadb://\t''
memcached://\t''
memcached+unix://\t''
az://\t''
s3://\t''
nats://\t''
tls://\t''
nats+tls://\t''"
complete -c dlock -n "__fish_dlock_using_subcommand check" -l prefix -d 'Namespace for keys and paths [default: dlock]' -r
complete -c dlock -n "__fish_dlock_using_subcommand check" -s t -l ttl -d 'Lease length to check against the backend\'s bounds [default: 15s]' -r
complete -c dlock -n "__fish_dlock_using_subcommand check" -l config -d 'Config file (TOML; see man dlock.toml)' -r -F
complete -c dlock -n "__fish_dlock_using_subcommand check" -l json -d 'Print JSON instead of text'
complete -c dlock -n "__fish_dlock_using_subcommand check" -s v -l verbose -d 'More messages on stderr (repeat for more)'
complete -c dlock -n "__fish_dlock_using_subcommand check" -s q -l quiet -d 'Fewer messages on stderr (repeat for none)'
complete -c dlock -n "__fish_dlock_using_subcommand check" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c dlock -n "__fish_dlock_using_subcommand check" -s V -l version -d 'Print version'
complete -c dlock -n "__fish_dlock_using_subcommand hold" -s u -l url -d 'Backend URL, e.g. redis://host or etcd://host:2379 (every form: --help) [default: a lock file on this host]' -r -f -a "file://\t''
redis://\t''
rediss://\t''
redis+unix://\t''
redis-sentinel://\t''
rediss-sentinel://\t''
etcd://\t''
etcds://\t''
zk://\t''
postgres://\t''
postgresql://\t''
mysql://\t''
mariadb://\t''
memcached://\t''
memcached+unix://\t''
az://\t''
s3://\t''
nats://\t''
tls://\t''
nats+tls://\t''"
complete -c dlock -n "__fish_dlock_using_subcommand hold" -l prefix -d 'Namespace for keys and paths [default: dlock]' -r
complete -c dlock -n "__fish_dlock_using_subcommand hold" -s w -l wait -d 'Give up after waiting this long (500ms, 30s, 5m; a bare number is seconds)' -r
complete -c dlock -n "__fish_dlock_using_subcommand hold" -s E -l conflict-exit-code -d 'Exit status when the lock was not acquired [default: 75]' -r
complete -c dlock -n "__fish_dlock_using_subcommand hold" -s t -l ttl -d 'Lease length [default: 15s]' -r
complete -c dlock -n "__fish_dlock_using_subcommand hold" -s l -l limit -d 'Semaphore: up to N holders at once [default: 1]' -r
complete -c dlock -n "__fish_dlock_using_subcommand hold" -l on-lost -d 'What to do when the lock is lost while the command runs [default: term]' -r -f -a "term\t'SIGTERM the command\'s process group, SIGKILL after --kill-after'
kill\t'SIGKILL the command\'s process group at once'
ignore\t'Let the command run on without the lock (a warning is printed)'"
complete -c dlock -n "__fish_dlock_using_subcommand hold" -l kill-after -d 'Grace between SIGTERM and SIGKILL, on lock loss and after a forwarded signal [default: 10s]' -r
complete -c dlock -n "__fish_dlock_using_subcommand hold" -l local-queue -d 'Wait in a queue on this host first, so that only the head of the queue holds a server connection (remote backends, when waiting) [default: on]' -r -f -a "on\t''
off\t''"
complete -c dlock -n "__fish_dlock_using_subcommand hold" -l record-command -d 'Record the command line in the lock\'s metadata, where `status` and `list` show it (secret-looking values masked); off records none [default: on]' -r -f -a "on\t''
off\t''"
complete -c dlock -n "__fish_dlock_using_subcommand hold" -l min-hold -d 'Keep the lock at least this long' -r
complete -c dlock -n "__fish_dlock_using_subcommand hold" -l report -d 'Append one JSON line per run to PATH' -r -F
complete -c dlock -n "__fish_dlock_using_subcommand hold" -l also -d 'Hold NAME as well (repeatable): all the names or none' -r
complete -c dlock -n "__fish_dlock_using_subcommand hold" -l max-hold -d 'Give the lock back this long after taking it, whatever else happens [default: none; required with --until-released]' -r
complete -c dlock -n "__fish_dlock_using_subcommand hold" -s c -l command -d 'Run SHELL-COMMAND with "$SHELL -c" (or /bin/sh -c) instead of COMMAND' -r
complete -c dlock -n "__fish_dlock_using_subcommand hold" -l config -d 'Config file (TOML; see man dlock.toml)' -r -F
complete -c dlock -n "__fish_dlock_using_subcommand hold" -s n -l no-wait -d 'Give up at once if the lock is held'
complete -c dlock -n "__fish_dlock_using_subcommand hold" -s s -l shared -d 'Hold the lock shared: any number of shared holders at once, or one exclusive holder (a run without --shared)'
complete -c dlock -n "__fish_dlock_using_subcommand hold" -s x -l exclusive -d 'Hold the lock exclusively (the default), whatever DLOCK_SHARED or the config file say'
complete -c dlock -n "__fish_dlock_using_subcommand hold" -l until-released -d 'Keep the lock after the calling shell ends, until `dlock release` or --max-hold (CI steps in separate shells, systemd\'s ExecStartPre/ExecStopPost)'
complete -c dlock -n "__fish_dlock_using_subcommand hold" -s v -l verbose -d 'More messages on stderr (repeat for more)'
complete -c dlock -n "__fish_dlock_using_subcommand hold" -s q -l quiet -d 'Fewer messages on stderr (repeat for none)'
complete -c dlock -n "__fish_dlock_using_subcommand hold" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c dlock -n "__fish_dlock_using_subcommand hold" -s V -l version -d 'Print version'

# dlock run: dlock's options stop at NAME (the first word that is not an option).
function __fish_dlock_run_options
    set -l seen_run 0
    set -l skip 0
    for word in (commandline -opc)[2..-1]
        if test $seen_run = 0
            test "$word" = run; and set seen_run 1
            continue
        end
        if test $skip = 1
            set skip 0
            continue
        end
        switch $word
            case --
                return 1
            case -u --url --prefix -w --wait -E --conflict-exit-code -t --ttl -l --limit --on-lost --kill-after --local-queue --record-command --min-hold --report --also -c --command --config
                set skip 1
            case '-*'
            case '*'
                return 1
        end
    end
    return 0
end
