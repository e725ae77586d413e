//! The HTTP side of `watch --prometheus` and `serve`: one `GET` per connection, answered
//! with the text of the last refresh (`/metrics`) or whether refreshes are happening
//! (`/healthz`).

use std::cell::RefCell;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use super::About;
use super::departed::Departed;
use tap_probe_observer::host::report::Report;

/// A request head larger than this is refused: a scrape sends a few hundred bytes.
const MAX_REQUEST: usize = 8 * 1024;
/// A client that has not sent its request head by then is dropped.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

const EXPOSITION: &str = "text/plain; version=0.0.4; charset=utf-8";
const TEXT: &str = "text/plain; charset=utf-8";
const UNAVAILABLE: &str = "503 Service Unavailable";

/// An HTTP response.
#[derive(Debug, PartialEq, Eq)]
struct Answer<'a> {
    status: &'static str,
    content_type: &'static str,
    body: std::borrow::Cow<'a, str>,
}

impl<'a> Answer<'a> {
    fn text(status: &'static str, body: impl Into<std::borrow::Cow<'a, str>>) -> Self {
        Self {
            status,
            content_type: TEXT,
            body: body.into(),
        }
    }
}

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
    text: Arc<str>,
    /// When the last refresh published.
    refreshed: Option<Instant>,
    /// Why the last refresh failed, when it did (the text is then the one before).
    failure: Option<Arc<str>>,
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
        let stale_after = settings.stale_after;
        let thread = std::thread::Builder::new()
            .name("prometheus".to_owned())
            .spawn(move || {
                runtime.block_on(async {
                    tokio::select! {
                        () = serve(listener, latest, stale_after) => {}
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
            shutdown: Some(shutdown),
            thread: Some(thread),
        })
    }

    /// The address actually bound (port 0 picks a free one).
    #[must_use]
    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Serves `report` from now on, with the devices that went away within the grace.
    pub(crate) fn publish(&self, report: &Report) {
        let now = Instant::now();
        let departed = self.departed.borrow_mut().update(report, now);
        let text = super::exposition_with(report, &departed, self.about.as_ref(), self.series);
        self.served.send_replace(Served {
            text: text.into(),
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
/// connections are few and short.
fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the runtime of the metrics server")
}

async fn serve(listener: TcpListener, latest: watch::Receiver<Served>, stale_after: Duration) {
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                let served = latest.borrow().clone();
                tokio::spawn(async move {
                    if let Err(err) = answer(stream, &served, stale_after).await {
                        log::debug!("prometheus client: {err:#}");
                    }
                });
            }
            // Out of descriptors and the like: log it, and keep the watch going.
            Err(err) => {
                log::warn!("prometheus: accept failed: {err}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// Reads one request head and answers it, then closes the connection.
async fn answer(
    mut stream: TcpStream,
    served: &Served,
    stale_after: Duration,
) -> anyhow::Result<()> {
    let mut head = Vec::with_capacity(512);
    let mut buf = [0u8; 1024];
    let read_head = async {
        while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < MAX_REQUEST {
            let n = stream.read(&mut buf).await?;
            if n == 0 {
                break;
            }
            head.extend_from_slice(&buf[..n]);
        }
        anyhow::Ok(())
    };
    tokio::time::timeout(REQUEST_TIMEOUT, read_head)
        .await
        .context("request head timed out")??;
    let Answer {
        status,
        content_type,
        body,
    } = route(&head, served, Instant::now(), stale_after);
    let response = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(response.as_bytes()).await?;
    stream.write_all(body.as_bytes()).await?;
    stream.shutdown().await?;
    Ok(())
}

/// The answer to a request head.
fn route<'a>(head: &[u8], served: &'a Served, now: Instant, stale_after: Duration) -> Answer<'a> {
    let line = head.split(|&b| b == b'\r').next().unwrap_or_default();
    let line = String::from_utf8_lossy(line);
    let mut parts = line.split_whitespace();
    let (method, target) = (parts.next(), parts.next());
    let path = target.map(|t| t.split('?').next().unwrap_or(t));
    match (method, path) {
        (Some("GET"), Some("/metrics")) => Answer {
            status: "200 OK",
            content_type: EXPOSITION,
            body: (&*served.text).into(),
        },
        (Some("GET"), Some("/healthz")) => health(served, now, stale_after),
        (Some("GET"), Some(_)) => {
            Answer::text("404 Not Found", "tap-probe serves /metrics and /healthz\n")
        }
        (Some(_), Some(_)) => Answer::text(
            "405 Method Not Allowed",
            "tap-probe answers GET /metrics and GET /healthz only\n",
        ),
        _ => Answer::text("400 Bad Request", "not an HTTP request\n"),
    }
}

/// `/healthz`: 200 while refreshes succeed and are recent, 503 before the first one, after
/// a failed one, or when none came for `stale_after` (a refresh loop that hangs).
fn health(served: &Served, now: Instant, stale_after: Duration) -> Answer<'static> {
    let Some(refreshed) = served.refreshed else {
        return Answer::text(UNAVAILABLE, "starting: no refresh yet\n");
    };
    let age = now.saturating_duration_since(refreshed);
    if let Some(failure) = &served.failure {
        return Answer::text(UNAVAILABLE, format!("the last refresh failed: {failure}\n"));
    }
    if age > stale_after {
        return Answer::text(
            UNAVAILABLE,
            format!(
                "stale: no refresh for {:.1} s (more than {:.1} s)\n",
                age.as_secs_f64(),
                stale_after.as_secs_f64()
            ),
        );
    }
    Answer::text(
        "200 OK",
        format!("ok: refreshed {:.1} s ago\n", age.as_secs_f64()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const STALE: Duration = Duration::from_secs(10);

    fn served(text: &str, refreshed: Option<Instant>) -> Served {
        Served {
            text: text.into(),
            refreshed,
            failure: None,
        }
    }

    #[test]
    fn only_get_metrics_and_healthz_are_served() {
        let now = Instant::now();
        let body = served("body", Some(now));
        let route = |head: &[u8]| route(head, &body, now, STALE);
        assert_eq!(
            route(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"),
            Answer {
                status: "200 OK",
                content_type: EXPOSITION,
                body: "body".into()
            }
        );
        assert_eq!(route(b"GET /metrics?x=1 HTTP/1.1\r\n\r\n").status, "200 OK");
        let healthz = route(b"GET /healthz HTTP/1.1\r\n\r\n");
        assert_eq!((healthz.status, healthz.content_type), ("200 OK", TEXT));
        assert_eq!(route(b"GET / HTTP/1.1\r\n\r\n").status, "404 Not Found");
        assert_eq!(
            route(b"POST /metrics HTTP/1.1\r\n\r\n").status,
            "405 Method Not Allowed"
        );
        assert_eq!(route(b"\r\n\r\n").status, "400 Bad Request");
    }

    #[test]
    fn health_fails_before_the_first_refresh_after_a_failure_and_when_stale() {
        let start = Instant::now();
        let at = |s: u64| start + Duration::from_secs(s);
        assert_eq!(
            health(&served("", None), start, STALE),
            Answer::text(UNAVAILABLE, "starting: no refresh yet\n")
        );
        let ok = served("", Some(start));
        assert_eq!(health(&ok, at(10), STALE).status, "200 OK");
        let stale = health(&ok, at(11), STALE);
        assert_eq!(stale.status, UNAVAILABLE);
        assert!(
            stale.body.starts_with("stale: no refresh for 11.0 s"),
            "{}",
            stale.body
        );
        let failed = Served {
            failure: Some("cannot list /proc".into()),
            ..ok
        };
        assert_eq!(
            health(&failed, at(1), STALE),
            Answer::text(UNAVAILABLE, "the last refresh failed: cannot list /proc\n")
        );
    }

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
}
