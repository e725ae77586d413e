//! The HTTP side of `watch --prometheus` and `serve`: `/metrics` (the text of the last
//! refresh) and `/healthz` (whether refreshes are happening), over HTTP/1.1 (hyper) with
//! keep-alive, and with TLS (rustls) and basic auth where a web config file asks for them
//! (`web_config`, read again when it changes: `live`; `auth`). What the endpoint answers is
//! in `http`; the limits on connections and time that keep a scrape answered whatever other
//! clients do are in `connections`.

mod auth;
mod connections;
mod http;
mod live;
pub(crate) mod web_config;

use std::cell::RefCell;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use bytes::Bytes;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use super::About;
use super::departed::Departed;
use connections::{Conn, Table, Watched};
use http::Endpoint;
pub(crate) use live::LiveConfig;
use tap_probe_observer::host::report::Report;

/// How the endpoint serves.
#[derive(Debug)]
pub(crate) struct Settings {
    /// `/healthz` fails once the last good refresh is older than this.
    pub(crate) stale_after: Duration,
    /// How long the series of a device that went away are still served (zero: dropped at
    /// once).
    pub(crate) departed_grace: Duration,
    /// Facts served as info families; `None`: none.
    pub(crate) about: Option<About>,
    /// TLS and basic auth (`--web.config.file`); `None`: plain HTTP, open to all.
    pub(crate) web: Option<LiveConfig>,
    /// Which series are served.
    pub(crate) series: super::Series,
}

impl Settings {
    /// `/healthz` is stale after three missed refreshes, and never sooner than 10 s: a
    /// refresh scans every process and namespace, which takes a while on a busy host.
    #[must_use]
    pub(crate) fn stale_after(interval: Duration) -> Duration {
        (interval * 3).max(Duration::from_secs(10))
    }
}

/// What the endpoint serves: the last exposition, and the refreshes' health.
#[derive(Clone, Debug, Default)]
struct Served {
    /// Shared by every response that sends it, not copied.
    text: Arc<Exposition>,
    /// When the last refresh published.
    refreshed: Option<Instant>,
    /// Why the last refresh failed, when it did (the text is then the one before).
    failure: Option<Arc<str>>,
}

/// The exposition of one refresh, rendered by the first scrape that asks for it and then
/// kept: a host refreshed more often than it is scraped (Prometheus' 15 s or more against
/// a few seconds) renders only what is scraped, and its refreshes cost the reads alone.
#[derive(Default)]
struct Exposition {
    render: std::sync::Mutex<Option<Render>>,
    text: std::sync::OnceLock<Bytes>,
}

/// What renders an exposition: the refresh's report and rows, moved in.
type Render = Box<dyn FnOnce() -> String + Send>;

impl Exposition {
    fn new(render: Render) -> Self {
        Self {
            render: std::sync::Mutex::new(Some(render)),
            text: std::sync::OnceLock::new(),
        }
    }

    /// An exposition already rendered.
    #[cfg(test)]
    fn rendered(text: Bytes) -> Self {
        Self {
            render: std::sync::Mutex::new(None),
            text: std::sync::OnceLock::from(text),
        }
    }

    /// The text, rendered now if no scrape asked for it yet.
    fn text(&self) -> Bytes {
        self.text
            .get_or_init(|| {
                let render = self
                    .render
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .take();
                render.map_or_else(Bytes::new, |render| render().into())
            })
            .clone()
    }
}

impl std::fmt::Debug for Exposition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Exposition")
            .field("rendered", &self.text.get().map(Bytes::len))
            .finish_non_exhaustive()
    }
}

/// The scrape endpoint: serves what was given to [`Exporter::publish`] last, from a thread
/// of its own, so scrapes never wait for a refresh and a refresh never waits for a scrape.
/// Dropping it stops the server.
pub(crate) struct Exporter {
    served: watch::Sender<Served>,
    departed: RefCell<Departed>,
    about: Option<About>,
    series: super::Series,
    addr: SocketAddr,
    tls: bool,
    /// What the web config asks for, for the log; empty without one.
    web: String,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Exporter {
    /// Listens on `addr` and starts serving.
    ///
    /// # Errors
    /// When the address cannot be bound (in use, not local, a privileged port), or the
    /// server's thread cannot start.
    pub(crate) fn start(addr: SocketAddr, settings: Settings) -> anyhow::Result<Self> {
        let runtime = runtime()?;
        let listener = runtime.block_on(TcpListener::bind(addr)).with_context(|| {
            format!("cannot listen on {addr} for Prometheus: choose another address or port")
        })?;
        let addr = listener.local_addr()?;
        let (served, latest) = watch::channel(Served::default());
        let (shutdown, stopped) = tokio::sync::oneshot::channel();
        let tls = settings.web.as_ref().is_some_and(LiveConfig::tls);
        let web = settings
            .web
            .as_ref()
            .map(|web| format!(", with {}", web.describe()))
            .unwrap_or_default();
        let endpoint = Arc::new(Endpoint::new(latest, settings.stale_after, settings.web));
        let table = Arc::new(Table::new(connections::limit()));
        let thread = std::thread::Builder::new()
            .name("prometheus".to_owned())
            .spawn(move || {
                runtime.block_on(async {
                    tokio::select! {
                        () = serve(listener, endpoint, table) => {}
                        _ = stopped => {}
                    }
                });
            })
            .context("starting the metrics server's thread")?;
        Ok(Self {
            served,
            departed: RefCell::new(Departed::new(settings.departed_grace)),
            about: settings.about,
            series: settings.series,
            addr,
            tls,
            web,
            shutdown: Some(shutdown),
            thread: Some(thread),
        })
    }

    /// The URL of `path` here: `https` where the port speaks TLS, the address actually
    /// bound (port 0 picks a free one).
    #[must_use]
    pub(crate) fn url(&self, path: &str) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        format!("{scheme}://{}{path}", self.addr)
    }

    /// `, with TLS, basic auth for 1 user (--web.config.file PATH)`, or nothing without a
    /// web config: what the log line that gives the URL adds.
    #[must_use]
    pub(crate) fn web_description(&self) -> &str {
        &self.web
    }

    /// Serves `report` from now on, with the devices that went away within the grace.
    pub(crate) fn publish(&self, report: Report) {
        let now = Instant::now();
        let departed = self.departed.borrow_mut().update(&report, now);
        let (about, series) = (self.about.clone(), self.series);
        let render = move || super::exposition_with(&report, &departed, about.as_ref(), series);
        self.served.send_replace(Served {
            text: Arc::new(Exposition::new(Box::new(render))),
            refreshed: Some(now),
            failure: None,
        });
    }

    /// A refresh failed: `/metrics` keeps the last good text, `/healthz` says why.
    pub(crate) fn failed(&self, err: &anyhow::Error) {
        self.served.send_modify(|served| {
            served.failure = Some(format!("{err:#}").into());
        });
    }
}

impl Drop for Exporter {
    fn drop(&mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        if let Some(thread) = self.thread.take()
            && thread.join().is_err()
        {
            log::warn!("the metrics server's thread panicked");
        }
    }
}

/// The one tokio runtime tap-probe builds: a single thread for the scrape endpoint, whose
/// work is small and mostly waiting; a blocking thread beside it for bcrypt.
fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .max_blocking_threads(1)
        .build()
        .context("starting the runtime of the metrics server")
}

/// Accepts connections until the runtime stops, each served on a task of its own.
async fn serve(listener: TcpListener, endpoint: Arc<Endpoint>, table: Arc<Table>) {
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                let conn = table.admit();
                let (endpoint, table) = (Arc::clone(&endpoint), Arc::clone(&table));
                tokio::spawn(async move {
                    connection(stream, &conn, endpoint).await;
                    table.leave(&conn);
                });
            }
            // Out of descriptors and the like: log it, and keep serving.
            Err(err) => {
                log::warn!("prometheus: accept failed: {err}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// One connection, from its accept to its close: closed at its deadline (see
/// [`connections`]) or when the table needs its room.
async fn connection(stream: TcpStream, conn: &Arc<Conn>, endpoint: Arc<Endpoint>) {
    // A response goes out whole at once; Nagle would hold its last segment for an ACK.
    let _ = stream.set_nodelay(true);
    let exchange = exchange(
        Watched::new(stream, Arc::clone(conn)),
        Arc::clone(conn),
        endpoint,
    );
    tokio::pin!(exchange);
    loop {
        let deadline = conn.deadline();
        tokio::select! {
            ended = &mut exchange => {
                if let Err(err) = ended {
                    log::debug!("prometheus client: {err:#}");
                }
                return;
            }
            () = conn.evicted() => {
                log::debug!("prometheus client: closed to make room for a new connection");
                return;
            }
            () = tokio::time::sleep_until(deadline.into()) => {
                // Activity may have moved the deadline on meanwhile.
                if conn.deadline() <= Instant::now() {
                    log::debug!("prometheus client: timed out");
                    return;
                }
            }
        }
    }
}

/// The TLS handshake where the port speaks TLS, then HTTP.
async fn exchange(
    io: Watched<TcpStream>,
    conn: Arc<Conn>,
    endpoint: Arc<Endpoint>,
) -> anyhow::Result<()> {
    // The handshake's first record is a handshake record (RFC 8446, 5.1).
    const HANDSHAKE: u8 = 22;
    let Some(web) = endpoint.web.as_ref().filter(|web| web.tls()) else {
        return http(io, conn, endpoint).await;
    };
    // A plain HTTP request to a TLS port (a scrape with `scheme: http`) is told so, as Go's
    // servers do, rather than left to a failed handshake.
    let mut first = [0u8; 1];
    if io.get_ref().peek(&mut first).await? == 0 {
        return Ok(());
    }
    if first[0] != HANDSHAKE {
        return not_tls(io).await;
    }
    // The config as it is now: a new certificate, CA or TLS setting applies from the next
    // handshake on.
    let tls = web
        .current()?
        .tls
        .clone()
        .context("the web config has no tls_server_config")?;
    let stream = tokio_rustls::TlsAcceptor::from(tls)
        .accept(io)
        .await
        .context("TLS handshake")?;
    http(stream, conn, endpoint).await
}

/// HTTP/1.1 on `io` until the client closes, a request fails or the connection's deadline.
async fn http<S>(io: S, conn: Arc<Conn>, endpoint: Arc<Endpoint>) -> anyhow::Result<()>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let service = hyper::service::service_fn(move |request| {
        conn.request();
        let endpoint = Arc::clone(&endpoint);
        async move { Ok::<_, Infallible>(endpoint.answer(request).await) }
    });
    hyper::server::conn::http1::Builder::new()
        .max_buf_size(connections::MAX_HEAD)
        // The connection's deadlines ([`connections`]) time heads and idle keep-alive.
        .header_read_timeout(None)
        .serve_connection(TokioIo::new(io), service)
        .await
        .context("HTTP")
}

/// The answer on a TLS port to a client that speaks plain HTTP: 400, and the connection
/// closed.
async fn not_tls(io: Watched<TcpStream>) -> anyhow::Result<()> {
    let service = hyper::service::service_fn(|_request| async {
        let mut response = hyper::Response::new(http_body_util::Full::new(Bytes::from_static(
            b"this port speaks TLS: scrape it with scheme https\n",
        )));
        *response.status_mut() = hyper::StatusCode::BAD_REQUEST;
        Ok::<_, Infallible>(response)
    });
    hyper::server::conn::http1::Builder::new()
        .max_buf_size(connections::MAX_HEAD)
        .keep_alive(false)
        .header_read_timeout(None)
        .serve_connection(TokioIo::new(io), service)
        .await
        .context("HTTP to a TLS port")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn staleness_allows_three_refreshes_and_at_least_ten_seconds() {
        assert_eq!(
            Settings::stale_after(Duration::from_secs(1)),
            Duration::from_secs(10)
        );
        assert_eq!(
            Settings::stale_after(Duration::from_secs(5)),
            Duration::from_secs(15)
        );
    }

    /// A refresh's exposition is rendered by the first scrape, once, and not at all when no
    /// scrape asks for it.
    #[test]
    fn an_exposition_is_rendered_once_when_first_scraped() {
        use std::sync::atomic::{AtomicU32, Ordering};
        let renders = Arc::new(AtomicU32::new(0));
        let counted = Arc::clone(&renders);
        let exposition = Exposition::new(Box::new(move || {
            counted.fetch_add(1, Ordering::Relaxed);
            "tap_probe_elapsed_seconds 1\n".to_owned()
        }));
        assert_eq!(renders.load(Ordering::Relaxed), 0, "not before a scrape");
        assert_eq!(exposition.text(), "tap_probe_elapsed_seconds 1\n");
        assert_eq!(exposition.text(), "tap_probe_elapsed_seconds 1\n");
        assert_eq!(renders.load(Ordering::Relaxed), 1);
    }
}
