//! What the tests of the metrics endpoint's TLS and basic auth need: certificates made here
//! (a CA, the server's for 127.0.0.1, a client's, and a client of another CA), web config
//! files, and HTTP requests over TLS (rustls, as the server uses) or plain TCP.

use std::fmt::Write as _;
use std::io::Write as _;
use std::net::TcpStream;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use tokio_rustls::rustls;

use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};

/// The basic auth user of the tests, and its password.
pub(crate) const USER: &str = "prometheus";
pub(crate) const PASSWORD: &str = "scrape secret";

/// Certificates and keys in a directory of their own: `ca.crt`, `tls.crt` and `tls.key` (the
/// server's, for 127.0.0.1, signed by the CA), `client.crt` and `client.key` (signed by
/// the CA), `stranger.crt` and `stranger.key` (signed by another CA).
pub(crate) struct Pki {
    pub(crate) dir: tempfile::TempDir,
}

/// A certificate and its key, as PEM.
struct Issued {
    cert: String,
    key: String,
}

/// A CA of the test's: its certificate, and what signs with it.
struct Ca {
    cert: String,
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
}

impl Ca {
    fn new(name: &str) -> Self {
        let mut params = rcgen::CertificateParams::new(Vec::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        params.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::DigitalSignature,
        ];
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap().pem();
        Self {
            cert,
            issuer: rcgen::Issuer::new(params, key),
        }
    }

    /// A certificate for `names` (IP addresses or DNS names) for `usage`.
    fn issue(&self, names: &[&str], usage: rcgen::ExtendedKeyUsagePurpose) -> Issued {
        let mut params =
            rcgen::CertificateParams::new(names.iter().map(|&n| n.to_owned()).collect::<Vec<_>>())
                .unwrap();
        params.extended_key_usages = vec![usage];
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap().pem();
        Issued {
            cert,
            key: key.serialize_pem(),
        }
    }
}

impl Pki {
    pub(crate) fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let pki = Self { dir };
        let ca = Ca::new("tap-probe test CA");
        let stranger_ca = Ca::new("another CA");
        pki.write("ca.crt", &ca.cert);
        pki.write_issued(
            "tls",
            &ca.issue(&["127.0.0.1"], rcgen::ExtendedKeyUsagePurpose::ServerAuth),
        );
        pki.write_issued(
            "client",
            &ca.issue(&["client"], rcgen::ExtendedKeyUsagePurpose::ClientAuth),
        );
        pki.write_issued(
            "stranger",
            &stranger_ca.issue(&["client"], rcgen::ExtendedKeyUsagePurpose::ClientAuth),
        );
        // The CA signs the server's next certificate, for a renewal.
        pki.write_issued(
            "renewed",
            &ca.issue(&["127.0.0.1"], rcgen::ExtendedKeyUsagePurpose::ServerAuth),
        );
        pki.write("password", PASSWORD);
        pki.write("wrong-password", "not the password");
        pki
    }

    fn write_issued(&self, name: &str, issued: &Issued) {
        self.write(&format!("{name}.crt"), &issued.cert);
        self.write(&format!("{name}.key"), &issued.key);
    }

    /// Writes `text` as `name`, as editors and renewers do: elsewhere, then renamed over it.
    pub(crate) fn write(&self, name: &str, text: &str) {
        let new = self.path(&format!("{name}.new"));
        std::fs::write(&new, text).unwrap();
        std::fs::rename(&new, self.path(name)).unwrap();
    }

    pub(crate) fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Writes the web config `name`: TLS with the server's certificate and, with `clients`,
    /// client certificates of the CA required; basic auth for [`USER`] with [`PASSWORD`]
    /// where `auth`.
    pub(crate) fn web_config(&self, name: &str, clients: bool, auth: bool) -> PathBuf {
        let mut text = "tls_server_config:\n  cert_file: tls.crt\n  key_file: tls.key\n".to_owned();
        if clients {
            text.push_str(
                "  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: ca.crt\n",
            );
        }
        if auth {
            text.push_str(&users(PASSWORD));
        }
        self.write(name, &text);
        self.path(name)
    }

    /// A client that trusts the CA, and presents `identity` (`client`, `stranger`) where
    /// given.
    pub(crate) fn client(&self, identity: Option<&str>) -> Arc<rustls::ClientConfig> {
        let mut roots = rustls::RootCertStore::empty();
        for ca in CertificateDer::pem_file_iter(self.path("ca.crt")).unwrap() {
            roots.add(ca.unwrap()).unwrap();
        }
        let builder = rustls::ClientConfig::builder().with_root_certificates(roots);
        Arc::new(match identity {
            None => builder.with_no_client_auth(),
            Some(name) => builder
                .with_client_auth_cert(
                    CertificateDer::pem_file_iter(self.path(&format!("{name}.crt")))
                        .unwrap()
                        .map(Result::unwrap)
                        .collect(),
                    PrivateKeyDer::from_pem_file(self.path(&format!("{name}.key"))).unwrap(),
                )
                .unwrap(),
        })
    }
}

/// `basic_auth_users` with [`USER`] and a bcrypt hash of `password`.
pub(crate) fn users(password: &str) -> String {
    // Cost 10, as the exporter toolkit's documentation makes them: the first check of a
    // password pays for it, the scrapes after it do not.
    format!(
        "basic_auth_users:\n  {USER}: {}\n",
        bcrypt::hash(password, 10).unwrap()
    )
}

/// A response: its status code, its head and its body.
#[derive(Debug)]
pub(crate) struct Response {
    pub(crate) status: u16,
    pub(crate) head: String,
    pub(crate) body: String,
}

/// A `GET` of `path`, with basic auth as `credentials` (user, password) where given; the
/// connection kept open after it unless `close`.
pub(crate) fn get(path: &str, credentials: Option<(&str, &str)>, close: bool) -> String {
    let mut request = format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n");
    if let Some((user, password)) = credentials {
        let encoded =
            base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
        let _ = write!(request, "Authorization: Basic {encoded}\r\n");
    }
    if close {
        request.push_str("Connection: close\r\n");
    }
    request.push_str("\r\n");
    request
}

/// Reads one response (its head, then as many body bytes as its `Content-Length` says).
///
/// # Errors
/// The connection failed or closed before a whole response.
pub(crate) fn read_response(stream: &mut impl std::io::Read) -> std::io::Result<Response> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if stream.read(&mut byte)? == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                format!("closed after {:?}", String::from_utf8_lossy(&head)),
            ));
        }
        head.push(byte[0]);
    }
    let head = String::from_utf8(head).unwrap();
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("a status line: {head}"));
    let length: usize = head
        .lines()
        .find_map(|line| {
            let (name, value) = line.split_once(':')?;
            name.eq_ignore_ascii_case("content-length")
                .then(|| value.trim().parse().unwrap())
        })
        .unwrap_or(0);
    let mut body = vec![0; length];
    stream.read_exact(&mut body)?;
    Ok(Response {
        status,
        head,
        body: String::from_utf8(body).unwrap(),
    })
}

/// A TCP connection to `addr` that gives up reading after 10 s (100 under emulation).
pub(crate) fn connect(addr: &str) -> TcpStream {
    let stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10) * super::slowdown()))
        .unwrap();
    stream
}

/// A TLS connection to `addr` (127.0.0.1) as `client`, its handshake done.
///
/// # Errors
/// The handshake failed.
pub(crate) fn tls(
    addr: &str,
    client: Arc<rustls::ClientConfig>,
) -> std::io::Result<rustls::StreamOwned<rustls::ClientConnection, TcpStream>> {
    let name = ServerName::IpAddress(std::net::Ipv4Addr::LOCALHOST.into());
    let connection = rustls::ClientConnection::new(client, name).unwrap();
    let mut stream = rustls::StreamOwned::new(connection, connect(addr));
    while stream.conn.is_handshaking() {
        stream.conn.complete_io(&mut stream.sock)?;
    }
    Ok(stream)
}

/// One request over TLS, on a connection of its own.
///
/// # Errors
/// The handshake or the exchange failed.
pub(crate) fn https(
    addr: &str,
    client: Arc<rustls::ClientConfig>,
    request: &str,
) -> std::io::Result<Response> {
    let mut stream = tls(addr, client)?;
    stream.write_all(request.as_bytes())?;
    stream.flush()?;
    read_response(&mut stream)
}

/// One request over plain TCP, on a connection of its own.
///
/// # Errors
/// The exchange failed.
pub(crate) fn plain(addr: &str, request: &str) -> std::io::Result<Response> {
    let mut stream = connect(addr);
    stream.write_all(request.as_bytes())?;
    read_response(&mut stream)
}

/// Whether the other end closed `stream` (a read finds its end) rather than keeping it
/// open for another request.
pub(crate) fn closed(stream: &mut impl std::io::Read) -> bool {
    matches!(stream.read(&mut [0u8; 1]), Ok(0) | Err(_))
}

/// The resident memory of process `pid`, in bytes: now (`VmRSS`) and at its peak so far
/// (`VmHWM`).
pub(crate) fn resident(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|line| line.strip_prefix(name))
            .and_then(|kb| kb.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .unwrap_or_else(|| panic!("{name} in /proc/{pid}/status"))
            * 1024
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// The sockets process `pid` holds open.
pub(crate) fn sockets(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |fds| {
        fds.filter_map(Result::ok)
            .filter(|fd| {
                std::fs::read_link(fd.path())
                    .is_ok_and(|target| target.to_string_lossy().starts_with("socket:"))
            })
            .count()
    })
}
