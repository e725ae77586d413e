//! The endpoint's connections: how many it keeps, how long a client may take over a request,
//! and which connection goes when a new one needs room. The aim: a scrape is answered
//! within its timeout whatever other clients of the port do, in bounded memory.
//!
//! - At most [`MAX_CONNECTIONS`] at once (fewer where the process may not open that many
//!   files). A connection beyond it is still accepted, and the least recently active one
//!   is closed to make room: the one whose last request head (or, before any, whose
//!   accept) is oldest. A scraper's connection has just sent one, so clients that connect
//!   and send nothing, or send slowly, go first, and a new scraper always gets in, where
//!   refusing newcomers would leave it waiting behind them.
//! - A request head must be complete within [`HEAD_TIMEOUT`]: from the accept for the first
//!   (a TLS handshake included), from its first byte for those after. A client sending a
//!   byte a second is cut off after ten, while a scraper sends its head at once.
//! - Between requests a connection stays open for [`IDLE_TIMEOUT`], longer than the usual
//!   scrape intervals (15 s to 1 min), so Prometheus keeps reusing it.
//! - A request head larger than [`MAX_HEAD`] gets 431 and the connection is closed (hyper
//!   answers it); a scrape's is a few hundred bytes.
//!
//! Memory per connection is then bounded by its buffers (the head's 8 KiB at most, TLS
//! records while they are read), whatever the clients send: a thousand idle connections
//! cost `serve` some 6 MB.

use std::collections::HashMap;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::Notify;

/// Connections kept at once.
pub(crate) const MAX_CONNECTIONS: usize = 1024;
/// How long a client may take to send a request head.
pub(crate) const HEAD_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a connection stays open between requests.
pub(crate) const IDLE_TIMEOUT: Duration = Duration::from_mins(2);
/// The largest request head taken (hyper's smallest read buffer).
pub(crate) const MAX_HEAD: usize = 8 * 1024;
/// File descriptors left for everything else the process opens (its programs, maps and
/// links, namespaces, `/proc`).
const SPARE_FILES: u64 = 256;
/// Fewest connections kept where the process may open few files.
const MIN_CONNECTIONS: usize = 16;

/// How many connections to keep: [`MAX_CONNECTIONS`], fewer where the process may not open
/// that many files. The soft limit on open files is raised as far as that needs, within
/// the hard limit: service managers start services at 1024 for `select(2)`'s sake, which
/// tap-probe does not use.
#[must_use]
pub(crate) fn limit() -> usize {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let wanted = MAX_CONNECTIONS as u64 + SPARE_FILES;
    let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else {
        return MIN_CONNECTIONS;
    };
    let files =
        if soft < wanted && setrlimit(Resource::RLIMIT_NOFILE, wanted.min(hard), hard).is_ok() {
            wanted.min(hard)
        } else {
            soft
        };
    let limit = usize::try_from(files.saturating_sub(SPARE_FILES)).unwrap_or(MAX_CONNECTIONS);
    if limit < MAX_CONNECTIONS {
        log::warn!(
            "the metrics endpoint keeps at most {} connections: this process may open {files} \
             files (raise LimitNOFILE to {wanted} for {MAX_CONNECTIONS})",
            limit.max(MIN_CONNECTIONS)
        );
    }
    limit.clamp(MIN_CONNECTIONS, MAX_CONNECTIONS)
}

/// The open connections.
#[derive(Debug)]
pub(crate) struct Table {
    epoch: Instant,
    limit: usize,
    next: AtomicU64,
    conns: Mutex<HashMap<u64, Arc<Conn>>>,
}

impl Table {
    #[must_use]
    pub(crate) fn new(limit: usize) -> Self {
        Self {
            epoch: Instant::now(),
            limit,
            next: AtomicU64::new(0),
            conns: Mutex::default(),
        }
    }

    /// The entry of a connection just accepted. At the limit, the least recently active
    /// connection is told to close first, and leaves the table at once.
    pub(crate) fn admit(&self) -> Arc<Conn> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let conn = Arc::new(Conn::new(id, self.epoch));
        let mut conns = self.conns.lock().unwrap_or_else(PoisonError::into_inner);
        if conns.len() >= self.limit
            && let Some(victim) =
                least_recently_active(conns.values().map(|c| (c.id, c.activity())))
            && let Some(victim) = conns.remove(&victim)
        {
            log::debug!(
                "prometheus: {} connections open, closing the least recently active",
                self.limit
            );
            victim.evicted.notify_one();
        }
        conns.insert(id, Arc::clone(&conn));
        conn
    }

    /// A connection closed.
    pub(crate) fn leave(&self, conn: &Conn) {
        self.conns
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&conn.id);
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.conns.lock().unwrap().len()
    }
}

/// The connection to close for a new one: the least recently active (`id`, activity).
fn least_recently_active(conns: impl Iterator<Item = (u64, u64)>) -> Option<u64> {
    conns
        .min_by_key(|&(id, activity)| (activity, id))
        .map(|(id, _)| id)
}

/// One connection's timeline, in nanoseconds since the table's epoch plus one, 0 for never:
/// written by its I/O ([`Watched`]) and by the server as requests come.
#[derive(Debug)]
pub(crate) struct Conn {
    id: u64,
    epoch: Instant,
    accepted: u64,
    /// When the last request head was complete.
    request: AtomicU64,
    /// When the first byte after that came.
    head: AtomicU64,
    /// When something was last written to it.
    written: AtomicU64,
    evicted: Notify,
}

impl Conn {
    fn new(id: u64, epoch: Instant) -> Self {
        let mut conn = Self {
            id,
            epoch,
            accepted: 0,
            request: AtomicU64::new(0),
            head: AtomicU64::new(0),
            written: AtomicU64::new(0),
            evicted: Notify::new(),
        };
        conn.accepted = conn.now();
        conn
    }

    fn now(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX - 1) + 1
    }

    /// A request head is complete (hyper hands it to the service).
    pub(crate) fn request(&self) {
        self.request.store(self.now(), Ordering::Relaxed);
        self.head.store(0, Ordering::Relaxed);
    }

    /// Bytes came: the first since the last request head begins the next.
    fn read(&self) {
        let _ = self
            .head
            .compare_exchange(0, self.now(), Ordering::Relaxed, Ordering::Relaxed);
    }

    fn wrote(&self) {
        self.written.store(self.now(), Ordering::Relaxed);
    }

    /// When it was last active: its last request head, or its accept.
    fn activity(&self) -> u64 {
        self.request.load(Ordering::Relaxed).max(self.accepted)
    }

    /// When it is to be closed, as things stand.
    #[must_use]
    pub(crate) fn deadline(&self) -> Instant {
        let at = deadline(
            self.accepted,
            self.request.load(Ordering::Relaxed),
            self.head.load(Ordering::Relaxed),
            self.written.load(Ordering::Relaxed),
        );
        self.epoch + Duration::from_nanos(at)
    }

    /// Resolves once the table closed it to make room for a new one.
    pub(crate) async fn evicted(&self) {
        self.evicted.notified().await;
    }
}

/// When a connection is closed, from its timeline (as [`Conn`] keeps it): its first request
/// head is due [`HEAD_TIMEOUT`] after the accept, a further one as long after its first
/// byte; between requests it is kept for [`IDLE_TIMEOUT`] after the last request or write.
fn deadline(accepted: u64, request: u64, head: u64, written: u64) -> u64 {
    let nanos = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
    if request == 0 {
        accepted.saturating_add(nanos(HEAD_TIMEOUT))
    } else if head != 0 {
        head.saturating_add(nanos(HEAD_TIMEOUT))
    } else {
        request.max(written).saturating_add(nanos(IDLE_TIMEOUT))
    }
}

/// A connection's byte stream, telling its [`Conn`] when bytes come and go.
#[derive(Debug)]
pub(crate) struct Watched<S> {
    inner: S,
    conn: Arc<Conn>,
}

impl<S> Watched<S> {
    pub(crate) fn new(inner: S, conn: Arc<Conn>) -> Self {
        Self { inner, conn }
    }

    pub(crate) fn get_ref(&self) -> &S {
        &self.inner
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Watched<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.conn.read();
        }
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Watched<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.conn.wrote();
        }
        polled
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.conn.wrote();
        }
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    #[test]
    fn a_head_is_due_soon_and_an_idle_connection_kept_long() {
        let (head, idle) = (HEAD_TIMEOUT.as_secs(), IDLE_TIMEOUT.as_secs());
        // Nothing sent yet (a TLS handshake included): the first head is due.
        assert_eq!(deadline(5 * S, 0, 0, 0), (5 + head) * S);
        // A byte or two of it do not move that.
        assert_eq!(deadline(5 * S, 0, 6 * S, 0), (5 + head) * S);
        // Answered and quiet: kept alive from the request or the answer's last write.
        assert_eq!(deadline(5 * S, 7 * S, 0, 8 * S), (8 + idle) * S);
        // The next head began: due from its first byte, however recent the last request.
        assert_eq!(deadline(5 * S, 7 * S, 30 * S, 8 * S), (30 + head) * S);
    }

    #[test]
    fn the_least_recently_active_connection_makes_room() {
        assert_eq!(
            least_recently_active([(1, 50), (2, 10), (3, 30)].into_iter()),
            Some(2)
        );
        // The oldest of equals first.
        assert_eq!(
            least_recently_active([(4, 10), (2, 10)].into_iter()),
            Some(2)
        );
        assert_eq!(least_recently_active(std::iter::empty()), None);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_full_table_closes_the_connection_idle_longest() {
        let table = Table::new(2);
        let quiet = table.admit();
        let scraper = table.admit();
        std::thread::sleep(Duration::from_millis(2));
        scraper.request();
        // A third evicts the one that never sent a request, not the scraper.
        let third = table.admit();
        assert_eq!(table.len(), 2);
        tokio::time::timeout(Duration::from_secs(1), quiet.evicted())
            .await
            .expect("the quiet one is told to close");
        // The scraper, oldest by its accept, scrapes again: the most recent by its request.
        std::thread::sleep(Duration::from_millis(2));
        scraper.request();
        let fourth = table.admit();
        assert!(
            tokio::time::timeout(Duration::from_millis(50), scraper.evicted())
                .await
                .is_err(),
            "the scraper stays"
        );
        tokio::time::timeout(Duration::from_secs(1), third.evicted())
            .await
            .expect("the third goes before the scraper");
        table.leave(&fourth);
        table.leave(&scraper);
        assert_eq!(table.len(), 0);
    }
}
