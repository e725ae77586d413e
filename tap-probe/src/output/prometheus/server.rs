//! The HTTP side of `watch --prometheus`: one `GET /metrics` per connection, answered
//! with the text of the last refresh.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use super::exposition;
use crate::host::report::Report;

/// A request head larger than this is refused: a scrape sends a few hundred bytes.
const MAX_REQUEST: usize = 8 * 1024;
/// A client that has not sent its request head by then is dropped.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The scrape endpoint: serves the text given to [`Exporter::publish`] last, from a thread
/// of its own, so scrapes never wait for a refresh and a refresh never waits for a scrape.
/// Dropping it stops the server.
pub(crate) struct Exporter {
    text: watch::Sender<Arc<str>>,
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
    pub(crate) fn start(addr: SocketAddr) -> anyhow::Result<Self> {
        let runtime = runtime()?;
        let listener = runtime.block_on(TcpListener::bind(addr)).with_context(|| {
            format!("cannot listen on {addr} for --prometheus: choose another address or port")
        })?;
        let addr = listener.local_addr()?;
        let (text, latest) = watch::channel(Arc::<str>::from(""));
        let (shutdown, stopped) = tokio::sync::oneshot::channel();
        let thread = std::thread::Builder::new()
            .name("prometheus".to_owned())
            .spawn(move || {
                runtime.block_on(async {
                    tokio::select! {
                        () = serve(listener, latest) => {}
                        _ = stopped => {}
                    }
                });
            })
            .context("starting the metrics server's thread")?;
        Ok(Self {
            text,
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

    pub(crate) fn publish(&self, report: &Report) {
        self.text.send_replace(exposition(report).into());
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

async fn serve(listener: TcpListener, latest: watch::Receiver<Arc<str>>) {
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                let text = latest.borrow().clone();
                tokio::spawn(async move {
                    if let Err(err) = answer(stream, &text).await {
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
async fn answer(mut stream: TcpStream, text: &str) -> anyhow::Result<()> {
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
    let (status, body) = route(&head, text);
    let response = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        if status.starts_with("200") {
            CONTENT_TYPE
        } else {
            "text/plain; charset=utf-8"
        },
        body.len()
    );
    stream.write_all(response.as_bytes()).await?;
    stream.write_all(body.as_bytes()).await?;
    stream.shutdown().await?;
    Ok(())
}

/// The status line and body for a request head.
fn route<'a>(head: &[u8], text: &'a str) -> (&'static str, std::borrow::Cow<'a, str>) {
    let line = head.split(|&b| b == b'\r').next().unwrap_or_default();
    let line = String::from_utf8_lossy(line);
    let mut parts = line.split_whitespace();
    let (method, target) = (parts.next(), parts.next());
    let path = target.map(|t| t.split('?').next().unwrap_or(t));
    match (method, path) {
        (Some("GET"), Some("/metrics")) => ("200 OK", text.into()),
        (Some("GET"), Some(_)) => ("404 Not Found", "tap-probe serves /metrics only\n".into()),
        (Some(_), Some(_)) => (
            "405 Method Not Allowed",
            "tap-probe answers GET /metrics only\n".into(),
        ),
        _ => ("400 Bad Request", "not an HTTP request\n".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_get_metrics_is_served() {
        let ok = route(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n", "body");
        assert_eq!(ok, ("200 OK", "body".into()));
        assert_eq!(
            route(b"GET /metrics?x=1 HTTP/1.1\r\n\r\n", "body").0,
            "200 OK"
        );
        assert_eq!(route(b"GET / HTTP/1.1\r\n\r\n", "body").0, "404 Not Found");
        assert_eq!(
            route(b"POST /metrics HTTP/1.1\r\n\r\n", "body").0,
            "405 Method Not Allowed"
        );
        assert_eq!(route(b"\r\n\r\n", "body").0, "400 Bad Request");
    }
}
