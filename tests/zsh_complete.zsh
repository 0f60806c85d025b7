# What zsh's completion offers for a command line, one match per line: used by tests/docs.rs.
#
#     zsh -f tests/zsh_complete.zsh COMPLETIONS_DIR 'dlock run --'
#
# An interactive zsh in a pseudo-terminal (zpty) loads the completion functions of
# COMPLETIONS_DIR with compinit, records every match given to compadd, and completes the line
# on a key bound to complete-word. Bounded: at most 500 reads (the caller also sets a timeout).
zmodload zsh/zpty
zpty z zsh -f -i
zpty -w z "PROMPT='%% '; fpath=($1 \$fpath); autoload -U compinit; compinit -u -D"
zpty -w z 'compadd () { builtin compadd -O __hits "$@"; print -l -- "@@hit:"${^__hits[@]}; builtin compadd "$@" }'
zpty -w z 'comp-capture () { zle complete-word; print "@@end""mark"; }; zle -N comp-capture; bindkey "^T" comp-capture'
zpty -n -w z "$2"$'\x14'
integer n=0
out=""
while (( n++ < 500 )) && zpty -r z line; do
  out+="$line"
  [[ $line == *"@@endmark"* ]] && break
done
print -r -- "$out" | tr '\r' '\n' | grep -a '^@@hit:' | sed 's/^@@hit://' | sort -u
zpty -d z
