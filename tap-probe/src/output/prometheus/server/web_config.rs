//! `--web.config.file`: TLS and basic auth in the web configuration format of the Prometheus
//! exporter toolkit, the file `node_exporter` and the other exporters built on it take:
//!
//! ```yaml
//! tls_server_config:
//!   cert_file: tls.crt            # relative paths are read from the file's directory
//!   key_file: tls.key
//!   client_auth_type: RequireAndVerifyClientCert   # or NoClientCert (default),
//!   client_ca_file: clients-ca.crt                 #   VerifyClientCertIfGiven
//!   min_version: TLS12            # TLS12 (default) or TLS13; max_version likewise
//! basic_auth_users:
//!   prometheus: $2y$10$...        # bcrypt: htpasswd -nBC 10 "" | tr -d ':\n'
//! ```
//!
//! Everything a file says is checked when it is read, certificates and keys included: a
//! key the file does not know, a key that does not match its certificate, a hash that is
//! not bcrypt are refused, each in one line that names the key. The toolkit's keys that
//! tap-probe does not take (inline PEM, cipher suites, curves, allowed SANs, HTTP headers,
//! rate limits) are refused by name too, rather than ignored: a file written for another
//! exporter then never means less here than it says.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Deserialize;
use tokio_rustls::rustls;

use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{InconsistentKeys, RootCertStore, ServerConfig};

/// A web config file that cannot be used, said in one line: the file, the key, what is
/// wrong and, where it helps, what to do. `serve` and `watch` exit 2 on one at start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct BadWebConfig(pub(crate) String);

impl std::fmt::Display for BadWebConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for BadWebConfig {}

/// What the endpoint does, as a web config file says.
#[derive(Debug)]
pub(crate) struct WebConfig {
    /// TLS, with client certificates or without; `None`: plain HTTP.
    pub(crate) tls: Option<Arc<ServerConfig>>,
    /// The users basic auth lets in, each with a bcrypt hash of the password; none: no
    /// basic auth.
    pub(crate) users: BTreeMap<String, String>,
}

/// Keys of the exporter toolkit's format that tap-probe does not take, and why.
const NOT_TAKEN: &[(&str, &str)] = &[
    (
        "tls_server_config.cert",
        "name the certificate's PEM file in cert_file",
    ),
    (
        "tls_server_config.key",
        "name the key's PEM file in key_file",
    ),
    (
        "tls_server_config.client_ca",
        "name the CA's PEM file in client_ca_file",
    ),
    (
        "tls_server_config.client_allowed_sans",
        "every client certificate the CA in client_ca_file signed is let in",
    ),
    (
        "tls_server_config.cipher_suites",
        "rustls offers its own safe suites",
    ),
    (
        "tls_server_config.prefer_server_cipher_suites",
        "rustls offers its own safe suites",
    ),
    (
        "tls_server_config.curve_preferences",
        "rustls offers its own safe key exchanges",
    ),
    (
        "http_server_config",
        "tap-probe serves HTTP/1.1 and sets no extra headers",
    ),
    ("rate_limit", "tap-probe limits connections itself"),
];

/// The file as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Raw {
    #[serde(default)]
    tls_server_config: Option<RawTls>,
    #[serde(default)]
    basic_auth_users: Option<BTreeMap<String, String>>,
}

#[derive(Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTls {
    cert_file: Option<PathBuf>,
    key_file: Option<PathBuf>,
    client_auth_type: Option<ClientAuth>,
    client_ca_file: Option<PathBuf>,
    min_version: Option<TlsVersion>,
    max_version: Option<TlsVersion>,
}

/// `client_auth_type`, named as Go's `crypto/tls` names its policies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
enum ClientAuth {
    NoClientCert,
    RequestClientCert,
    RequireAnyClientCert,
    /// The toolkit's old name for `RequireAnyClientCert`.
    RequireClientCert,
    VerifyClientCertIfGiven,
    RequireAndVerifyClientCert,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Deserialize)]
enum TlsVersion {
    TLS10,
    TLS11,
    TLS12,
    TLS13,
}

/// Reads the web config at `path`: what it says, or why it cannot be used. With it, the
/// files it was read from, the config first, then those it names as far as it got: a
/// change to any of them is what [`super::live`] looks for.
pub(crate) fn read(path: &Path) -> (Vec<PathBuf>, Result<WebConfig, BadWebConfig>) {
    let mut files = vec![path.to_owned()];
    let result = parse(path, &mut files).map_err(|problem| {
        BadWebConfig(format!("--web.config.file {}: {problem}", path.display()))
    });
    (files, result)
}

fn parse(path: &Path, files: &mut Vec<PathBuf>) -> Result<WebConfig, String> {
    let text = std::fs::read_to_string(path).map_err(|err| format!("cannot read it: {err}"))?;
    // First as plain YAML: its syntax, duplicate keys, and the toolkit's keys not taken
    // here; then as the format, whose errors name the key and its line.
    let value: serde_yaml_ng::Value = serde_yaml_ng::from_str(&text).map_err(one_line)?;
    not_taken(&value)?;
    let raw: Raw = if value.is_null() {
        // Empty, or only comments: nothing asked for, as the toolkit reads it.
        Raw::default()
    } else {
        serde_yaml_ng::from_str(&text).map_err(one_line)?
    };
    let users = raw.basic_auth_users.unwrap_or_default();
    for (user, hash) in &users {
        bcrypt_hash(hash).map_err(|why| {
            format!(
                "basic_auth_users.{user}: not a bcrypt hash ({why}); make one with \
                 `htpasswd -nBC 10 \"\" | tr -d ':\\n'`"
            )
        })?;
    }
    let dir = path.parent().unwrap_or(Path::new("."));
    let tls = match raw.tls_server_config {
        // The toolkit serves plain HTTP when the section sets nothing.
        Some(tls) if tls != RawTls::default() => Some(Arc::new(server_config(tls, dir, files)?)),
        _ => None,
    };
    Ok(WebConfig { tls, users })
}

/// A YAML error on one line (libyaml's can hold a newline).
#[expect(
    clippy::needless_pass_by_value,
    reason = "taken by value, as map_err hands it over"
)]
fn one_line(err: serde_yaml_ng::Error) -> String {
    err.to_string().replace('\n', " ")
}

/// Refuses the toolkit's keys that tap-probe does not take, naming the first.
fn not_taken(value: &serde_yaml_ng::Value) -> Result<(), String> {
    for (key, why) in NOT_TAKEN {
        let found = match key.split_once('.') {
            Some((section, inner)) => value.get(section).and_then(|s| s.get(inner)),
            None => value.get(key),
        };
        if found.is_some() {
            return Err(format!(
                "{key} is a key of the exporter toolkit's web config that tap-probe does not \
                 take ({why}): remove it"
            ));
        }
    }
    Ok(())
}

/// Whether `hash` is a bcrypt hash whose cost bcrypt allows (4 to 31); why not.
fn bcrypt_hash(hash: &str) -> Result<(), String> {
    let parts: bcrypt::HashParts = hash.parse().map_err(|err| format!("{err}"))?;
    let cost = parts.get_cost();
    if (4..=31).contains(&cost) {
        Ok(())
    } else {
        Err(format!("cost {cost}, where bcrypt takes 4 to 31"))
    }
}

/// The TLS side: the certificate and its key, which versions, which clients.
fn server_config(
    raw: RawTls,
    dir: &Path,
    files: &mut Vec<PathBuf>,
) -> Result<ServerConfig, String> {
    let cert_file = dir.join(raw.cert_file.ok_or(
        "tls_server_config.cert_file is missing: the server's certificate (PEM), whose key \
         is in key_file",
    )?);
    let key_file = dir.join(raw.key_file.ok_or(
        "tls_server_config.key_file is missing: the private key (PEM) of the certificate in \
         cert_file",
    )?);
    files.extend([cert_file.clone(), key_file.clone()]);
    let chain = certificates("cert_file", &cert_file)?;
    let key = PrivateKeyDer::from_pem_file(&key_file).map_err(|err| {
        format!(
            "tls_server_config.key_file {}: no private key in it: {err}",
            key_file.display()
        )
    })?;
    let provider = Arc::new(provider());
    let builder = ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_protocol_versions(&versions(raw.min_version, raw.max_version)?)
        .map_err(|err| format!("tls_server_config: {err}"))?;
    let auth = raw.client_auth_type.unwrap_or(ClientAuth::NoClientCert);
    let builder = match (auth, raw.client_ca_file) {
        (ClientAuth::NoClientCert, None) => builder.with_no_client_auth(),
        (ClientAuth::NoClientCert, Some(_)) => {
            return Err(
                "tls_server_config.client_ca_file is set, but client_auth_type is \
                        NoClientCert, which asks for no client certificate: set \
                        client_auth_type to RequireAndVerifyClientCert"
                    .to_owned(),
            );
        }
        (
            ClientAuth::RequestClientCert
            | ClientAuth::RequireAnyClientCert
            | ClientAuth::RequireClientCert,
            _,
        ) => {
            return Err(format!(
                "tls_server_config.client_auth_type {auth:?} lets in certificates nobody \
                 verified, which prove nothing: use RequireAndVerifyClientCert (or \
                 VerifyClientCertIfGiven) with client_ca_file"
            ));
        }
        (_, None) => {
            return Err(format!(
                "tls_server_config.client_auth_type {auth:?} needs client_ca_file: the CA \
                 (PEM) that signs the clients' certificates"
            ));
        }
        (_, Some(ca_file)) => {
            let ca_file = dir.join(ca_file);
            files.push(ca_file.clone());
            let mut roots = RootCertStore::empty();
            for ca in certificates("client_ca_file", &ca_file)? {
                roots.add(ca).map_err(|err| {
                    format!(
                        "tls_server_config.client_ca_file {}: {err}",
                        ca_file.display()
                    )
                })?;
            }
            let verifier =
                WebPkiClientVerifier::builder_with_provider(Arc::new(roots), Arc::clone(&provider));
            let verifier = if auth == ClientAuth::VerifyClientCertIfGiven {
                verifier.allow_unauthenticated()
            } else {
                verifier
            };
            builder.with_client_cert_verifier(verifier.build().map_err(|err| {
                format!(
                    "tls_server_config.client_ca_file {}: {err}",
                    ca_file.display()
                )
            })?)
        }
    };
    let mut config = builder
        .with_single_cert(chain, key)
        .map_err(|err| match err {
            rustls::Error::InconsistentKeys(InconsistentKeys::KeyMismatch) => format!(
                "tls_server_config.key_file {} is not the key of the certificate in cert_file {}",
                key_file.display(),
                cert_file.display()
            ),
            err => format!("tls_server_config.key_file {}: {err}", key_file.display()),
        })?;
    // HTTP/1.1 only: a scrape is one small request at a time.
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

/// The certificates of a PEM file, at least one.
fn certificates(key: &str, file: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let problem = |why: String| format!("tls_server_config.{key} {}: {why}", file.display());
    let chain = CertificateDer::pem_file_iter(file)
        .and_then(Iterator::collect::<Result<Vec<_>, _>>)
        .map_err(|err| problem(err.to_string()))?;
    if chain.is_empty() {
        return Err(problem(
            "no certificate in it (PEM, -----BEGIN CERTIFICATE-----)".to_owned(),
        ));
    }
    Ok(chain)
}

/// The TLS versions from `min` to `max` (default TLS 1.2 to 1.3, as the toolkit's).
fn versions(
    min: Option<TlsVersion>,
    max: Option<TlsVersion>,
) -> Result<Vec<&'static rustls::SupportedProtocolVersion>, String> {
    let (min, max) = (
        min.unwrap_or(TlsVersion::TLS12),
        max.unwrap_or(TlsVersion::TLS13),
    );
    for (key, version) in [("min_version", min), ("max_version", max)] {
        if version < TlsVersion::TLS12 {
            return Err(format!(
                "tls_server_config.{key} {version:?}: tap-probe speaks TLS 1.2 and 1.3 only \
                 (TLS12, TLS13)"
            ));
        }
    }
    if min > max {
        return Err(format!(
            "tls_server_config.min_version {min:?} is above max_version {max:?}"
        ));
    }
    Ok([
        (TlsVersion::TLS12, &rustls::version::TLS12),
        (TlsVersion::TLS13, &rustls::version::TLS13),
    ]
    .into_iter()
    .filter(|(v, _)| (min..=max).contains(v))
    .map(|(_, version)| version)
    .collect())
}

/// The cryptography under TLS: aws-lc-rs, with its post-quantum key exchange first.
fn provider() -> rustls::crypto::CryptoProvider {
    rustls::crypto::aws_lc_rs::default_provider()
}

#[cfg(test)]
mod tests;
