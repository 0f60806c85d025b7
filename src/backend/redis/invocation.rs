//! One call of a server-side script, as it goes on the wire: the script (its text and SHA1),
//! its keys (all in one slot: the first routes the call) and its arguments, sent as `EVALSHA`,
//! or as `EVAL` when the server does not know the script yet. Which scripts there are and what
//! their replies say is `scripts.rs`.

use redis::{Cmd, Script, ToRedisArgs};

use super::topology::slot_of;

/// A server-side script: its text and its SHA1 (redis-rs computes it).
pub(super) struct LockScript {
    code: &'static str,
    script: Script,
}

impl LockScript {
    pub(super) fn new(code: &'static str) -> LockScript {
        LockScript {
            code,
            script: Script::new(code),
        }
    }

    pub(super) fn prepare_invoke(&self) -> Invocation<'_> {
        Invocation {
            script: self,
            keys: Vec::new(),
            args: Vec::new(),
        }
    }

    /// An invocation with one key.
    pub(super) fn key<T: ToRedisArgs>(&self, key: T) -> Invocation<'_> {
        let mut invocation = self.prepare_invoke();
        invocation.key(key);
        invocation
    }
}

/// One call of a script: its keys (all in one slot: the first one routes the call) and its
/// arguments.
pub(super) struct Invocation<'a> {
    script: &'a LockScript,
    keys: Vec<Vec<u8>>,
    args: Vec<Vec<u8>>,
}

impl Invocation<'_> {
    pub(super) fn key<T: ToRedisArgs>(&mut self, key: T) -> &mut Self {
        key.write_redis_args(&mut self.keys);
        self
    }

    pub(super) fn arg<T: ToRedisArgs>(&mut self, arg: T) -> &mut Self {
        arg.write_redis_args(&mut self.args);
        self
    }

    /// The cluster slot of the call (of its first key).
    pub(super) fn slot(&self) -> Option<u16> {
        self.keys.first().map(|key| slot_of(key))
    }

    /// `EVALSHA`, the usual call.
    pub(super) fn evalsha(&self) -> Cmd {
        self.command("EVALSHA", self.script.script.get_hash())
    }

    /// `EVAL` with the text, when the server does not know the script (this also loads it).
    pub(super) fn eval(&self) -> Cmd {
        self.command("EVAL", self.script.code)
    }

    fn command(&self, verb: &str, script: &str) -> Cmd {
        let mut command = redis::cmd(verb);
        command
            .arg(script)
            .arg(self.keys.len())
            .arg(&*self.keys)
            .arg(&*self.args);
        command
    }
}
