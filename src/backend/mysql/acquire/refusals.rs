//! Why an acquisition ends without the lock, and what the user is told: a lock that stayed
//! held (who holds it), a grant that is not ours to keep (a read-only server, a proxy that
//! multiplexes sessions, holders with another `--limit`, no token), and a lock statement the
//! server refused (a missing privilege names the statement an administrator must run; a
//! missing `dlock_locks` is created on first use).

use super::{give_back, Report};
use crate::backend::mysql::conn::{cell, Failure, Session};
use crate::backend::mysql::sql::CREATE_TABLE;
use crate::backend::mysql::{MysqlBackend, CANCEL_TIMEOUT};
use crate::error::Error;
use crate::kit::timeouts::OP_TIMEOUT;
use crate::lock::{limit_mismatch, AcquireRequest};

impl MysqlBackend {
    /// The lock stayed held: who holds it, as far as we can tell, in the words every backend
    /// uses ([`crate::wording`]).
    pub(super) async fn busy(&self, session: &mut Session, request: &AcquireRequest) -> Error {
        let state = match self.status_on(session, &request.name).await {
            Ok(status) if status.held => {
                // Our own session may be in the queue; it is not ahead of us.
                let me = std::process::id();
                let ahead = status.queue.iter().filter(|w| w.holder.pid != me).count();
                let holders: Vec<_> = status.holders.into_iter().map(|h| h.holder).collect();
                crate::wording::busy_state(&holders, ahead)
            }
            _ => "is held".into(),
        };
        crate::wording::not_acquired(&request.name, &state, request.budget.wait())
    }

    /// A granted lock is ours only on a writable server, on our own session (a proxy that
    /// multiplexes sessions answers with another connection id), with the holders agreeing
    /// on `--limit`; otherwise it is given back.
    pub(super) async fn check_grant(
        &self,
        session: &mut Session,
        request: &AcquireRequest,
        report: &Report,
    ) -> Result<u64, Error> {
        let refusal = if report.read_only {
            Some(Error::Config(format!(
                "{} is read-only (@@read_only = 1: a replica, or a server in read-only mode); locks must be taken on the primary",
                self.display
            )))
        } else if report.connection_id != session.id {
            Some(Error::Config(format!(
                "the server session behind {} is not the connection dlock opened (CONNECTION_ID() {} ≠ {}): a proxy that multiplexes sessions (ProxySQL?) is in between; connect to the server directly",
                self.display, report.connection_id, session.id
            )))
        } else if let Some(theirs) = report.other_after {
            Some(limit_mismatch(&request.name, theirs))
        } else if report.token == 0 {
            Some(Error::Internal(
                "the lock was granted but no fencing token was written".into(),
            ))
        } else {
            None
        };
        match refusal {
            Some(e) => {
                give_back(session).await;
                Err(e)
            }
            None => Ok(report.token),
        }
    }

    /// Create `dlock_locks` (first use); a role that may not is told what to run. Clients
    /// starting together all try, and InnoDB may pick one as a deadlock victim: it tries
    /// again (a few times).
    pub(super) async fn create_table(&self, session: &mut Session) -> Result<(), Error> {
        let mut tries = 0;
        loop {
            tries += 1;
            match session.rows(CREATE_TABLE, OP_TIMEOUT).await {
                Ok(_) => return Ok(()),
                Err(f) if transient(&f) && tries < 5 => {
                    tracing::debug!("retrying CREATE TABLE: {}", f.describe());
                }
                Err(f) => return Err(self.refused(session, f).await),
            }
        }
    }

    /// A lock statement failed: a privilege error says which statement an administrator
    /// must run; anything else is classified. What the statement took is given back.
    pub(in crate::backend::mysql) async fn refused(
        &self,
        session: &mut Session,
        f: Failure,
    ) -> Error {
        let code = f.server_code();
        if !matches!(f, Failure::Timeout(_)) {
            give_back(session).await;
        }
        if matches!(code, Some(1142 | 1044 | 1143)) {
            let user = self.current_user(session).await;
            let db = self.target.database.as_deref().unwrap_or("DATABASE");
            return Error::Permission(format!(
                "{}: {}; dlock needs its table in database {db}: as an administrator run `{}` in {db}, then `GRANT SELECT, INSERT, UPDATE ON `{db}`.dlock_locks TO {user}` (README: MySQL and MariaDB)",
                self.display,
                f.describe(),
                CREATE_TABLE
            ));
        }
        f.into_error(&self.display)
    }

    /// `'user'@'host'` as the server knows us, for a GRANT statement.
    pub(super) async fn current_user(&self, session: &mut Session) -> String {
        let rows = session
            .rows(
                "SELECT CONCAT('''', SUBSTRING_INDEX(CURRENT_USER(), '@', 1), '''@''', SUBSTRING_INDEX(CURRENT_USER(), '@', -1), '''')",
                CANCEL_TIMEOUT,
            )
            .await;
        rows.ok()
            .and_then(|rows| rows.first().and_then(|r| cell::<String>(r, 0)))
            .unwrap_or_else(|| format!("'{}'@'%'", self.target.user()))
    }
}
/// A deadlock (1213) or lock wait timeout (1205): InnoDB or the metadata lock subsystem
/// rolled the statement back, and trying again is the documented answer.
pub(super) fn transient(f: &Failure) -> bool {
    matches!(f.server_code(), Some(1213 | 1205))
}
