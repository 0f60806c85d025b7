//! The backend and lease traits behind a pointer: every [`Backend`] is a [`DynBackend`] and
//! every [`Lease`] a [`DynLease`], and `Box<dyn DynBackend>` is a `Backend` again, with a
//! [`BoxedLease`]. One `dyn` call per operation (and one allocation per future) against a
//! process start of about 2 ms, instead of every subcommand compiled once per backend.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use crate::error::Error;
use crate::lock::{
    AcquireRequest, Backend, Cancel, CheckReport, Holder, Lease, LockName, LockStatus, Lost,
};

/// A boxed future, as the `dyn` seam returns them.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + 'a>>;

/// [`Backend`] behind a pointer. Every `Backend` is one; `Box<dyn DynBackend>` is a
/// `Backend` again, with a boxed [`Lease`].
pub trait DynBackend {
    fn acquire<'a>(
        &'a self,
        request: &'a AcquireRequest,
        cancel: Cancel,
    ) -> BoxFuture<'a, Result<BoxedLease, Error>>;
    fn status<'a>(&'a self, name: &'a LockName) -> BoxFuture<'a, Result<LockStatus, Error>>;
    fn list(&self) -> BoxFuture<'_, Result<Vec<LockStatus>, Error>>;
    fn force_release<'a>(&'a self, name: &'a LockName)
        -> BoxFuture<'a, Result<Vec<Holder>, Error>>;
    fn check(&self) -> BoxFuture<'_, Result<CheckReport, Error>>;
    fn finish_after_answer(&self, request: &AcquireRequest) -> Duration;
}

impl<B> DynBackend for B
where
    B: Backend,
    B::Lease: 'static,
{
    fn acquire<'a>(
        &'a self,
        request: &'a AcquireRequest,
        cancel: Cancel,
    ) -> BoxFuture<'a, Result<BoxedLease, Error>> {
        Box::pin(async move {
            let lease = Backend::acquire(self, request, cancel).await?;
            Ok(Box::new(lease) as BoxedLease)
        })
    }

    fn status<'a>(&'a self, name: &'a LockName) -> BoxFuture<'a, Result<LockStatus, Error>> {
        Box::pin(Backend::status(self, name))
    }

    fn list(&self) -> BoxFuture<'_, Result<Vec<LockStatus>, Error>> {
        Box::pin(Backend::list(self))
    }

    fn force_release<'a>(
        &'a self,
        name: &'a LockName,
    ) -> BoxFuture<'a, Result<Vec<Holder>, Error>> {
        Box::pin(Backend::force_release(self, name))
    }

    fn check(&self) -> BoxFuture<'_, Result<CheckReport, Error>> {
        Box::pin(Backend::check(self))
    }

    fn finish_after_answer(&self, request: &AcquireRequest) -> Duration {
        Backend::finish_after_answer(self, request)
    }
}

impl Backend for Box<dyn DynBackend> {
    type Lease = BoxedLease;

    async fn acquire(&self, request: &AcquireRequest, cancel: Cancel) -> Result<BoxedLease, Error> {
        DynBackend::acquire(&**self, request, cancel).await
    }

    async fn status(&self, name: &LockName) -> Result<LockStatus, Error> {
        DynBackend::status(&**self, name).await
    }

    async fn list(&self) -> Result<Vec<LockStatus>, Error> {
        DynBackend::list(&**self).await
    }

    async fn force_release(&self, name: &LockName) -> Result<Vec<Holder>, Error> {
        DynBackend::force_release(&**self, name).await
    }

    async fn check(&self) -> Result<CheckReport, Error> {
        DynBackend::check(&**self).await
    }

    fn finish_after_answer(&self, request: &AcquireRequest) -> Duration {
        DynBackend::finish_after_answer(&**self, request)
    }
}

/// [`Lease`] behind a pointer.
pub trait DynLease {
    fn token(&self) -> u64;
    fn lost(&mut self) -> BoxFuture<'_, Lost>;
    fn release(self: Box<Self>) -> BoxFuture<'static, Result<(), Error>>;
    fn finished<'a>(&'a mut self, holder: &'a Holder) -> BoxFuture<'a, Result<bool, Error>>;
    fn proven_until(&self) -> Option<crate::clock::BootInstant>;
    fn also_held(&self) -> Vec<(LockName, u64)>;
}

/// The lease of a [`DynBackend`].
pub type BoxedLease = Box<dyn DynLease>;

impl<L: Lease + 'static> DynLease for L {
    fn token(&self) -> u64 {
        Lease::token(self)
    }

    fn lost(&mut self) -> BoxFuture<'_, Lost> {
        Box::pin(Lease::lost(self))
    }

    fn release(self: Box<Self>) -> BoxFuture<'static, Result<(), Error>> {
        Box::pin(Lease::release(*self))
    }

    fn finished<'a>(&'a mut self, holder: &'a Holder) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(Lease::finished(self, holder))
    }

    fn proven_until(&self) -> Option<crate::clock::BootInstant> {
        Lease::proven_until(self)
    }

    fn also_held(&self) -> Vec<(LockName, u64)> {
        Lease::also_held(self)
    }
}

impl Lease for BoxedLease {
    fn token(&self) -> u64 {
        DynLease::token(&**self)
    }

    async fn lost(&mut self) -> Lost {
        DynLease::lost(&mut **self).await
    }

    async fn release(self) -> Result<(), Error> {
        <dyn DynLease>::release(self).await
    }

    async fn finished(&mut self, holder: &Holder) -> Result<bool, Error> {
        DynLease::finished(&mut **self, holder).await
    }

    fn proven_until(&self) -> Option<crate::clock::BootInstant> {
        DynLease::proven_until(&**self)
    }

    fn also_held(&self) -> Vec<(LockName, u64)> {
        DynLease::also_held(&**self)
    }
}
