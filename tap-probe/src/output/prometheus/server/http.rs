//! What the endpoint answers: basic auth first where the web config asks for it (as the
//! exporter toolkit does, for every path), then `GET` or `HEAD` of `/metrics` (the text of
//! the last refresh) and `/healthz` (whether refreshes are happening).

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Full;
use hyper::header::{self, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use tokio::sync::watch;

use super::Served;
use super::auth::{Verdict, Verifier};
use super::live::LiveConfig;

const EXPOSITION: &str = "text/plain; version=0.0.4; charset=utf-8";
const TEXT: &str = "text/plain; charset=utf-8";

/// An answer, before it is an HTTP response.
#[derive(Debug, PartialEq, Eq)]
struct Answer {
    status: StatusCode,
    content_type: &'static str,
    body: Bytes,
}

impl Answer {
    fn text(status: StatusCode, body: impl Into<String>) -> Self {
        Self {
            status,
            content_type: TEXT,
            body: Bytes::from(body.into()),
        }
    }

    fn into_response(self) -> Response<Full<Bytes>> {
        let mut response = Response::new(Full::new(self.body));
        *response.status_mut() = self.status;
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static(self.content_type),
        );
        match self.status {
            StatusCode::METHOD_NOT_ALLOWED => {
                headers.insert(header::ALLOW, HeaderValue::from_static("GET, HEAD"));
            }
            StatusCode::UNAUTHORIZED => {
                headers.insert(
                    header::WWW_AUTHENTICATE,
                    HeaderValue::from_static("Basic realm=\"tap-probe\", charset=\"UTF-8\""),
                );
            }
            _ => {}
        }
        response
    }
}

/// What every connection's requests are answered from.
#[derive(Debug)]
pub(crate) struct Endpoint {
    latest: watch::Receiver<Served>,
    stale_after: Duration,
    /// The web config file, where one was given.
    pub(crate) web: Option<LiveConfig>,
    verifier: Verifier,
}

impl Endpoint {
    #[must_use]
    pub(crate) fn new(
        latest: watch::Receiver<Served>,
        stale_after: Duration,
        web: Option<LiveConfig>,
    ) -> Self {
        Self {
            latest,
            stale_after,
            web,
            verifier: Verifier::new(),
        }
    }

    /// The response to `request`.
    pub(crate) async fn answer<B>(self: Arc<Self>, request: Request<B>) -> Response<Full<Bytes>> {
        if let Some(web) = &self.web {
            let Ok(config) = web.current() else {
                return Answer::text(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "the web config file cannot be used: the server's log says why\n",
                )
                .into_response();
            };
            let authorization = request
                .headers()
                .get(header::AUTHORIZATION)
                .map(HeaderValue::as_bytes);
            if self.verifier.check(&config.users, authorization).await == Verdict::Denied {
                return Answer::text(StatusCode::UNAUTHORIZED, "unauthorized\n").into_response();
            }
        }
        let served = self.latest.borrow().clone();
        route(
            request.method(),
            request.uri().path(),
            &served,
            Instant::now(),
            self.stale_after,
        )
        .into_response()
    }
}

/// The answer to a request for `path` (hyper leaves the body out of the answer to `HEAD`).
fn route(
    method: &Method,
    path: &str,
    served: &Served,
    now: Instant,
    stale_after: Duration,
) -> Answer {
    if method != Method::GET && method != Method::HEAD {
        return Answer::text(
            StatusCode::METHOD_NOT_ALLOWED,
            "tap-probe answers GET and HEAD of /metrics and /healthz only\n",
        );
    }
    match path {
        "/metrics" => Answer {
            status: StatusCode::OK,
            content_type: EXPOSITION,
            body: served.text.text(),
        },
        "/healthz" => health(served, now, stale_after),
        _ => Answer::text(
            StatusCode::NOT_FOUND,
            "tap-probe serves /metrics and /healthz\n",
        ),
    }
}

/// `/healthz`: 200 while refreshes succeed and are recent, 503 before the first one, after
/// a failed one, or when none came for `stale_after` (a refresh loop that hangs).
fn health(served: &Served, now: Instant, stale_after: Duration) -> Answer {
    let unavailable = StatusCode::SERVICE_UNAVAILABLE;
    let Some(refreshed) = served.refreshed else {
        return Answer::text(unavailable, "starting: no refresh yet\n");
    };
    let age = now.saturating_duration_since(refreshed);
    if let Some(failure) = &served.failure {
        return Answer::text(unavailable, format!("the last refresh failed: {failure}\n"));
    }
    if age > stale_after {
        return Answer::text(
            unavailable,
            format!(
                "stale: no refresh for {:.1} s (more than {:.1} s)\n",
                age.as_secs_f64(),
                stale_after.as_secs_f64()
            ),
        );
    }
    Answer::text(
        StatusCode::OK,
        format!("ok: refreshed {:.1} s ago\n", age.as_secs_f64()),
    )
}

#[cfg(test)]
mod tests {
    use super::super::Exposition;
    use super::*;

    const STALE: Duration = Duration::from_secs(10);

    fn served(text: &'static str, refreshed: Option<Instant>) -> Served {
        Served {
            text: Arc::new(Exposition::rendered(Bytes::from_static(text.as_bytes()))),
            refreshed,
            failure: None,
        }
    }

    #[test]
    fn only_get_and_head_of_metrics_and_healthz_are_served() {
        let now = Instant::now();
        let body = served("body", Some(now));
        let route = |method: Method, path: &str| route(&method, path, &body, now, STALE);
        assert_eq!(
            route(Method::GET, "/metrics"),
            Answer {
                status: StatusCode::OK,
                content_type: EXPOSITION,
                body: Bytes::from_static(b"body")
            }
        );
        assert_eq!(route(Method::HEAD, "/metrics").status, StatusCode::OK);
        let healthz = route(Method::GET, "/healthz");
        assert_eq!(
            (healthz.status, healthz.content_type),
            (StatusCode::OK, TEXT)
        );
        assert_eq!(route(Method::GET, "/").status, StatusCode::NOT_FOUND);
        for method in [Method::POST, Method::PUT, Method::DELETE, Method::OPTIONS] {
            let answer = route(method.clone(), "/metrics");
            assert_eq!(answer.status, StatusCode::METHOD_NOT_ALLOWED, "{method}");
            assert_eq!(
                answer.into_response().headers()[header::ALLOW],
                "GET, HEAD",
                "{method}"
            );
        }
    }

    #[test]
    fn health_fails_before_the_first_refresh_after_a_failure_and_when_stale() {
        let start = Instant::now();
        let at = |s: u64| start + Duration::from_secs(s);
        let unavailable = StatusCode::SERVICE_UNAVAILABLE;
        assert_eq!(
            health(&served("", None), start, STALE),
            Answer::text(unavailable, "starting: no refresh yet\n")
        );
        let ok = served("", Some(start));
        assert_eq!(health(&ok, at(10), STALE).status, StatusCode::OK);
        let stale = health(&ok, at(11), STALE);
        assert_eq!(stale.status, unavailable);
        assert!(
            stale.body.starts_with(b"stale: no refresh for 11.0 s"),
            "{:?}",
            stale.body
        );
        let failed = Served {
            failure: Some("cannot list /proc".into()),
            ..ok
        };
        assert_eq!(
            health(&failed, at(1), STALE),
            Answer::text(unavailable, "the last refresh failed: cannot list /proc\n")
        );
    }
}
